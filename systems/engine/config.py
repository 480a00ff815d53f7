"""From a composed Hydra config (conf/) to the engine's typed config, resolved once.

``resolve_engine_config`` is the one place where ``auto`` and derived defaults become values: the
device, the compute dtype, the KV backend's options (B = 0 means 2k, the tail length, the
resolver implementation) and the speculative decoder's (calibrated acceptance, DSpark's
confidence). The engine, the census, the capacity accounting and the SGLang adapter all read its
result. Defaults live in the dataclasses; the YAML files list the same values so that every knob
is visible (a test keeps the two equal). Typed
dataclasses are the schema: an unknown or ill-typed field fails here at start-up with a
ValueError naming it and the allowed ones, before any memory is allocated.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pickle
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from systems.engine.engine import EngineConfig
from systems.kv.base import KVConfig, KVOptions
from systems.kv.registry import check_value_types, options_from
from systems.models.config import ModelConfig
from systems.spec.config import SpeculationConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
log = logging.getLogger("dhs.config")

# EngineConfig fields that come from elsewhere than the ``engine:`` section
_NOT_ENGINE_KEYS = {"model", "kv", "device", "seed", "speculation", "profile", "profile_dir"}


def resolve_device(device: str, check: bool = True) -> str:
    """``auto`` -> cuda where a GPU is present, else cpu; ``cpu``, ``cuda`` and ``cuda:N`` as
    given, after checking that this machine has them (a clear error before anything is built).
    ``check=False`` only names the device: a run id or plan composed on a machine without the
    GPU the run will use."""
    import torch

    device = str(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device == "cuda" or device.startswith("cuda:"):
        if not check:
            return device
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device}: this machine has no CUDA GPU (this config needs one; "
                "device=auto or device=cpu runs on the CPU, with a CPU-sized model such as "
                "model=tiny)"
            )
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ValueError(
                f"device={device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return device
    raise ValueError(f"device={device!r}: expected auto, cpu, cuda or cuda:N")


@dataclasses.dataclass(frozen=True)
class HardwareNumbers:
    """The types of ``hardware``'s numbers (conf/hardware/*.yaml), for their check."""

    kv_pool_gib: float = 0.0
    host_pool_gib: float = 0.0
    max_running_requests: int = 0
    num_gpus: int = 0


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _typed(cls, data: dict[str, Any], where: str, exclude: set[str] = frozenset()):
    names = {f.name for f in dataclasses.fields(cls)} - set(exclude)
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(names)}")
    check_value_types(cls, data, where)
    return cls(**data)


def model_config_from(cfg: DictConfig | dict, device: str) -> ModelConfig:
    data = dict(_plain(cfg))
    if "hot_cache_rows" in data:
        raise ValueError(
            "model.hot_cache_rows: B is a KV-policy knob now; set system.kv.hot_cache_rows instead"
        )
    if data.get("dtype", "auto") == "auto":
        data["dtype"] = "bfloat16" if device.startswith("cuda") else "float32"
    return _typed(ModelConfig, data, "model")


def speculation_from(node: Any, model: ModelConfig) -> SpeculationConfig | None:
    data = _plain(node)
    if not data:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"system.speculation: must be a mapping or null, got {data!r}")
    if "drafter" not in data:
        # a speculative system's YAML names its drafter; keys added to a system without
        # speculation (+system.speculation.block_size=4 on hisparse) would otherwise turn it on
        # with the default drafter, under the non-speculative system's name
        raise ValueError(
            f"system.speculation: {sorted(data)} set without a drafter: this system has no "
            "speculation (choose a speculative one, e.g. system=adaptive_dhisparse or "
            "resident_dflash2, or name system.speculation.drafter)"
        )
    return _typed(SpeculationConfig, data, "system.speculation").resolved(model.max_context_len)


def kv_options_from(
    system: Any, model: ModelConfig, device: str, max_queries_per_step: int = 1
) -> KVOptions:
    """The backend's resolved options from ``system`` (``kv_backend`` and ``kv``)."""
    return options_from(str(system["kv_backend"]), _plain(system.get("kv"))).resolved(
        model, device, max_queries_per_step
    )


def resolve_engine_config(cfg: DictConfig, check_device: bool = True) -> EngineConfig:
    """``check_device=False``: the engine runs elsewhere (an SGLang deployment the harness
    drives), so this machine need not have its device."""
    device = resolve_device(cfg.get("device", "auto"), check=check_device)
    model = model_config_from(cfg.model, device)
    system = cfg.system
    spec = speculation_from(system.get("speculation"), model)
    q_max = spec.k_max if spec else 1
    hw = cfg.hardware
    check_value_types(HardwareNumbers, dict(_plain(hw)), "hardware")
    kv = KVConfig(
        backend=str(system.kv_backend),
        kv_pool_gib=float(hw.kv_pool_gib),
        max_running_requests=int(hw.max_running_requests),
        max_queries_per_step=q_max,
        options=kv_options_from(system, model, device, q_max),
    )
    if hw.get("host_pool_gib") is not None:
        kv.host_pool_gib = float(hw.host_pool_gib)
    if "workload" in cfg:
        max_total = int(cfg.workload.input_len) + int(cfg.workload.output_len)
        if max_total > model.max_context_len:
            raise ValueError(
                f"workload.input_len + workload.output_len = {max_total} exceeds "
                f"model.max_context_len = {model.max_context_len}"
            )
    engine = dict(_plain(cfg.get("engine")) or {})
    ecfg = _typed(EngineConfig, engine, "engine", exclude=_NOT_ENGINE_KEYS)
    if ecfg.cuda_graph_warmup and ecfg.cuda_graph_warmup_lens is None and "workload" in cfg:
        # a step's max_len runs from the first decode position to the last verified one: a
        # round in flight (overlap scheduling) puts a request up to a block past its host
        # length, and its pass reaches a block further
        first = int(cfg.workload.input_len) + 1
        last = first + int(cfg.workload.output_len) + 2 * q_max
        ecfg = dataclasses.replace(ecfg, cuda_graph_warmup_lens=(first, last))
    ecfg = dataclasses.replace(
        ecfg,
        model=model,
        kv=kv,
        device=device,
        seed=int(cfg.get("seed", 0)),
        speculation=spec,
        profile=_profile(cfg),
        profile_dir=cfg.get("profile_dir"),
    )
    log.info(
        "resolved config: device=%s model=%s backend=%s kv=%s speculation=%s",
        device,
        model.name,
        kv.backend,
        kv.options,
        spec,
    )
    return ecfg


def _profile(cfg: DictConfig) -> dict | None:
    prof = cfg.get("profile")
    if prof is None or prof.get("name", "none") == "none":
        return None
    return OmegaConf.to_container(prof, resolve=True)


# compose() results, pickled (~10 KB each), by (override list, conf/ fingerprint): a reproduce
# plan, a smoke run or a test session composes the same override lists over and over (~50 ms
# each: Hydra re-reads and re-merges every YAML file); a hit costs an unpickling (~2 ms)
_COMPOSED: dict[tuple, bytes] = {}
_COMPOSED_MAX = 1024


def _conf_fingerprint() -> tuple:
    """Every file under conf/ with its size and mtime: an edited, added or removed YAML file
    composes afresh."""
    out = []
    stack = [str(CONF_DIR)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=True):
                    stack.append(e.path)
                else:
                    st = e.stat()
                    out.append((e.path, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def compose(overrides: list[str] | None = None) -> DictConfig:
    """The Hydra config of conf/config.yaml with ``overrides``: a fresh copy on every call (the
    caller may change it), composed once per override list while conf/ stays as it is."""
    overrides = list(overrides or [])
    key = (tuple(overrides), _conf_fingerprint())
    blob = _COMPOSED.get(key)
    if blob is None:
        cfg = _compose(overrides)
        if len(_COMPOSED) >= _COMPOSED_MAX:
            _COMPOSED.pop(next(iter(_COMPOSED)))
        _COMPOSED[key] = pickle.dumps(cfg)
        return cfg
    return pickle.loads(blob)


def _compose(overrides: list[str]) -> DictConfig:
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hcompose(config_name="config", overrides=overrides)


# Config groups whose keys are checked against every option of the group (conf/<group>/*.yaml):
# ``system.kv`` and ``system.speculation`` have typed checks of their own (options_from,
# SpeculationConfig), ``model`` its geometry check, ``engine`` EngineConfig's fields.
CHECKED_GROUPS = ("system", "hardware", "server", "logger", "profile")


# Keys a group's options leave out but the code reads where given (``+group.key=...``).
OPTIONAL_GROUP_KEYS = {
    "profile": {"switch_interval_ms"},  # profile=host: the GIL switch interval while sampling
}


def _group_keys(group: str) -> set[str]:
    """The top-level keys any option of a config group has, and its optional ones: read once
    while conf/ stays as it is (a plan checks every run's config, ~20 ms of YAML a check)."""
    return _group_keys_of(group, _conf_fingerprint())


@functools.lru_cache(maxsize=32)
def _group_keys_of(group: str, fingerprint: tuple) -> frozenset[str]:
    keys: set[str] = set(OPTIONAL_GROUP_KEYS.get(group, ()))
    for f in sorted((CONF_DIR / group).glob("*.yaml")):
        keys |= set(OmegaConf.load(f)) - {"defaults"}
    return frozenset(keys)


def check_known_keys(
    cfg: DictConfig, extra_top: set[str] = frozenset(), extra_workload: set[str] = frozenset()
) -> None:
    """Unknown keys are errors, not silently ignored settings: a ``+key=...`` Hydra accepted at
    the top level, under ``workload`` or in one of CHECKED_GROUPS that no default config has
    (``extra_*``: keys the caller reads besides)."""
    for group in CHECKED_GROUPS:
        known = _group_keys(group)
        unknown = sorted(set(cfg.get(group) or {}) - known)
        if unknown:
            raise ValueError(
                f"unknown {group} key(s) {unknown}; known (conf/{group}/*.yaml): {sorted(known)}"
            )
    base = compose([])
    unknown = sorted(k for k in cfg if k not in base and k not in extra_top)
    if unknown:
        raise ValueError(
            f"unknown config key(s) {unknown}; known top-level keys: "
            f"{sorted(set(base) | set(extra_top))}"
        )
    unknown = sorted(set(cfg.get("workload") or {}) - set(base.workload) - set(extra_workload))
    if unknown:
        raise ValueError(
            f"unknown workload key(s) {unknown}; known: "
            f"{sorted(set(base.workload) | set(extra_workload))}"
        )


def compose_engine_config(
    overrides: list[str] | None = None, config_path: str | None = None
) -> EngineConfig:
    cfg = OmegaConf.load(config_path) if config_path else compose(overrides)
    if config_path and overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return resolve_engine_config(cfg)
