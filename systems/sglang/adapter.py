"""Our Hydra configs (system / model / hardware / server.sglang) -> SGLang server arguments.

Written against sglang 0.5.23 and sglang-router 0.3.2; tests/sglang/test_server_args.py parses
every list built here with SGLang's own parser (``prepare_server_args``, the function
``sglang.launch_server`` calls) and the router's (``parse_router_args``). Nothing here imports
sglang: the adapter runs in the main environment, the servers in their own.

What maps where::

    ours                               SGLang
    system resident                    a plain server: full KV history in GPU pages
    system hisparse                    --enable-hisparse --disable-radix-cache
                                       --hisparse-config {"top_k", "device_buffer_size",
                                                          "host_to_device_ratio"}
      model.index_topk (k)             top_k
      system.kv.hot_cache_rows (B)     device_buffer_size
      hardware.host_pool_gib /
        hardware.kv_pool_gib           host_to_device_ratio (floored, >= 1)
    speculation.drafter dflash2        --speculative-algorithm DFLASH (DFlash2 checkpoints load
                                       through it) --speculative-dflash-block-size K
    speculation.drafter dspark         --speculative-algorithm DSPARK
                                       --speculative-dspark-block-size K-1 (verify window K)
    model.kv_format fp8 / bf16         --kv-cache-dtype fp8_e4m3 / bfloat16
    hardware.max_running_requests      --max-running-requests
    server.sglang.pd.enabled           a prefill server, a decode server (HiSparse and the
                                       drafter go there) and sglang_router --pd-disaggregation

No SGLang equivalent (``UnsupportedOnSGLang``, a ValueError, raised before anything starts):
every ``adaptive_*`` KV backend (adaptive_hisparse, adaptive_dhisparse, ..._dspark): SGLang's
HiSparse keeps a fixed B-row device buffer at every load; residency that follows load
(sec. 3.1-3.2) and verification over the hierarchy (sec. 3.3-3.4) exist only in the bundled
engine. Speculation over HiSparse is passed through to SGLang's own minimal integration
(linear drafts), which is not the paper's method; the plan says so in its notes.

K, our ``speculation.block_size``, counts target queries per round including the anchor (the
paper's K_r); SGLang's DFLASH block is the same verify window, DSPARK's gamma is K - 1.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SGLANG_VERSION = "0.5.23"
ROUTER_VERSION = "0.3.2"

# Defaults of server.sglang (conf/server/sglang.yaml is the documented copy): the adapter also
# works on a config that names only some of them.
DEFAULTS: dict[str, Any] = {
    "launch": "subprocess",
    "command": [".venv-sglang/bin/python", "-m", "sglang.launch_server"],
    "router_command": [".venv-sglang/bin/python", "-m", "sglang_router.launch_router"],
    "env": {},
    "attach_health_urls": [],
    "model_path": None,
    "tokenizer_path": None,
    "served_model_name": None,
    "trust_remote_code": True,
    "tp": 1,
    "gpus": None,
    "mem_fraction_static": None,
    "context_length": None,
    "page_size": None,
    "kv_cache_dtype": "auto",
    "max_running_requests": "auto",
    "disable_radix_cache": True,
    "enable_metrics": True,
    "hisparse": {
        "top_k": None,
        "device_buffer_size": None,
        "host_to_device_ratio": None,
        "extra": {},
    },
    "speculative": {
        "draft_model_path": None,
        "block_size": None,
        "on_prefill": True,
        "draft_window_size": None,
    },
    "pd": {
        "enabled": False,
        "transfer_backend": "mooncake",
        "ib_device": None,
        "bootstrap_port": 8998,
        "policy": "round_robin",
        "mini_lb": False,
        "prefill": {"port": 0, "tp": 1, "gpus": None, "extra_args": []},
        "decode": {"port": 0, "tp": 1, "gpus": None, "extra_args": []},
        "router_extra_args": [],
    },
    "extra_args": [],
}

KV_CACHE_DTYPES = {"fp8": "fp8_e4m3", "bf16": "bfloat16"}
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
SPEC_ALGORITHMS = {"dflash2": "DFLASH", "dflash": "DFLASH", "dspark": "DSPARK"}
RESIDENT_BACKENDS = ("resident",)
HISPARSE_BACKENDS = ("hisparse",)


class UnsupportedOnSGLang(ValueError):
    """A configuration SGLang cannot express; raised before any process starts."""


@dataclass
class ServerLaunch:
    """One ``sglang.launch_server`` process: its arguments (after the command prefix)."""

    role: str  # "server" (co-located) | "prefill" | "decode"
    args: list[str]
    host: str
    port: int
    gpus: list[int] | None = None

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.port}"


@dataclass
class LaunchPlan:
    """Everything needed to start (or attach to) one SGLang deployment for one run."""

    servers: list[ServerLaunch]
    router_args: list[str] | None  # PD only
    url: str  # where the load generator sends requests (router under PD)
    command: list[str]
    router_command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def commands(self) -> list[tuple[str, list[str]]]:
        """(role, argv) in start order: workers first, then the router."""
        out = [(s.role, [*self.command, *s.args]) for s in self.servers]
        if self.router_args is not None:
            out.append(("router", [*self.router_command, *self.router_args]))
        return out

    def describe(self) -> str:
        lines = []
        for s in self.servers:
            env = f"CUDA_VISIBLE_DEVICES={','.join(map(str, s.gpus))} " if s.gpus else ""
            lines.append(f"# {s.role}\n{env}{shlex.join([*self.command, *s.args])}")
        if self.router_args is not None:
            lines.append(f"# router\n{shlex.join([*self.router_command, *self.router_args])}")
        lines.append(f"# load goes to {self.url}")
        lines += [f"# note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---------------------------------------------------------------------------- config access

_SECTIONS = ("system", "model", "hardware", "server", "seed")


def _plain(cfg: Any) -> dict:
    """The sections the adapter reads, as plain resolved containers (a DictConfig or a dict).

    Only these are resolved: the rest of a run's config (hydra.*, ${now:...}) is not needed.
    """
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is in both environments
        DictConfig = ()
    if isinstance(cfg, DictConfig):
        return {
            k: (
                OmegaConf.to_container(cfg[k], resolve=True)
                if OmegaConf.is_config(cfg[k])
                else cfg[k]
            )
            for k in _SECTIONS
            if k in cfg
        }
    return dict(cfg)


def _merge(base: dict, over: Mapping | None) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def settings(cfg: Any) -> dict:
    """server.sglang merged over DEFAULTS; unknown keys are an error naming them."""
    root = _plain(cfg)
    given = ((root.get("server") or {}).get("sglang")) or {}
    _check_keys(given, DEFAULTS, "server.sglang")
    return _merge(DEFAULTS, given)


def _check_keys(given: Mapping, allowed: Mapping, where: str) -> None:
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    for k, v in given.items():
        if isinstance(allowed[k], dict) and isinstance(v, Mapping) and k not in ("env", "extra"):
            _check_keys(v, allowed[k], f"{where}.{k}")


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "", None):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _int(v: Any, where: str, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < lo:
        raise ValueError(f"{where} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _args_list(v: Any, where: str) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return shlex.split(v)
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{where} must be a list of arguments, got {v!r}")
    return [str(a) for a in v]


def _gpus(v: Any, where: str) -> list[int] | None:
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if isinstance(v, str):
        v = [x for x in v.split(",") if x.strip()]
    try:
        return [_int(int(g), where, lo=0) for g in v]
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a list of GPU indices, got {v!r}") from None


# ---------------------------------------------------------------------------- what maps where


@dataclass(frozen=True)
class SpecMapping:
    drafter: str  # ours: dflash2 | dspark
    algorithm: str  # SGLang: DFLASH | DSPARK
    block_size: int | None  # K, target queries per round including the anchor
    draft_model_path: str | None
    draft_window_size: int | None


def check_supported(cfg: Any) -> None:
    """Raise UnsupportedOnSGLang for a system SGLang cannot run; return None otherwise."""
    root = _plain(cfg)
    system = root.get("system") or {}
    name = system.get("name", "?")
    kv = str(system.get("kv_backend", ""))
    if kv.startswith("adaptive"):
        what = "optional residency that follows load (sec. 3.1-3.2) exists"
        if system.get("speculation"):
            what = (
                "optional residency that follows load (sec. 3.1-3.2) and speculative "
                "verification over the hierarchy (sec. 3.3-3.4) exist"
            )
        raise UnsupportedOnSGLang(
            f"system={name} (kv_backend={kv}) has no SGLang equivalent: SGLang {SGLANG_VERSION}'s "
            f"HiSparse keeps a fixed per-request device buffer of B rows at every load; {what} "
            "only in the bundled engine. On SGLang run system=hisparse, system=resident, "
            "system=resident_dflash2 or system=resident_dspark, and the adaptive systems on "
            "the bundled engine (server.mode=subprocess)."
        )
    if kv not in RESIDENT_BACKENDS + HISPARSE_BACKENDS:
        raise UnsupportedOnSGLang(
            f"system.kv_backend={kv!r} has no SGLang mapping; supported on SGLang: "
            f"{list(RESIDENT_BACKENDS + HISPARSE_BACKENDS)}"
        )
    speculation(cfg)  # raises for an unsupported drafter


def speculation(cfg: Any) -> SpecMapping | None:
    root = _plain(cfg)
    spec = (root.get("system") or {}).get("speculation")
    if not spec:
        return None
    if isinstance(spec, str):
        spec = {"drafter": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"system.speculation must be a mapping or null, got {spec!r}")
    drafter = str(spec.get("drafter", "dflash2")).lower()
    if drafter not in SPEC_ALGORITHMS:
        raise UnsupportedOnSGLang(
            f"system.speculation.drafter={drafter!r} has no SGLang equivalent; SGLang "
            f"{SGLANG_VERSION} runs dflash2 (as DFLASH) and dspark (as DSPARK)"
        )
    s = settings(cfg)["speculative"]
    block = s.get("block_size")
    where = "server.sglang.speculative.block_size"
    if block is None:
        block, where = spec.get("block_size"), "system.speculation.block_size"
    if block is not None:
        if not isinstance(block, (int, float)) or isinstance(block, bool):
            raise ValueError(
                f"{where}={block!r}: SGLang serves one static block per server; "
                f"set server.sglang.speculative.block_size to an integer"
            )
        block = _int(block, where, lo=2)
    window = s.get("draft_window_size")
    window = None if window is None else _int(window, "server.sglang.speculative.draft_window_size")
    return SpecMapping(
        drafter=drafter,
        algorithm=SPEC_ALGORITHMS[drafter],
        block_size=block,
        draft_model_path=s.get("draft_model_path"),
        draft_window_size=window,
    )


def hisparse_config(cfg: Any) -> dict | None:
    """The --hisparse-config JSON object, or None for a system without HiSparse."""
    root = _plain(cfg)
    if str((root.get("system") or {}).get("kv_backend")) not in HISPARSE_BACKENDS:
        return None
    h = settings(cfg)["hisparse"]
    model = root.get("model") or {}
    hw = root.get("hardware") or {}
    top_k = h.get("top_k")
    if top_k is None:
        top_k = model.get("index_topk")
    if top_k is None:
        raise ValueError("HiSparse needs k: set model.index_topk or server.sglang.hisparse.top_k")
    top_k = _int(top_k, "hisparse top_k (model.index_topk)")
    buf = h.get("device_buffer_size")
    if buf is None:  # the bundled engine's resolved B (system.kv.hot_cache_rows) at SGLang's k
        from systems.engine.config import kv_options_from, model_config_from

        mcfg = model_config_from({**model, "index_topk": top_k}, "cpu")
        buf = kv_options_from(root["system"], mcfg, "cpu").hot_cache_rows
    buf = _int(buf, "hisparse device_buffer_size (system.kv.hot_cache_rows)")
    if buf < top_k:
        raise ValueError(
            f"HiSparse device_buffer_size B={buf} must be >= top_k k={top_k} "
            "(SGLang rejects it; so does the paper's B >= k)"
        )
    ratio = h.get("host_to_device_ratio")
    if ratio is None:
        host, dev = hw.get("host_pool_gib"), hw.get("kv_pool_gib")
        ratio = max(1, math.floor(float(host) / float(dev))) if host and dev else 2
    ratio = _int(ratio, "hisparse host_to_device_ratio")
    out = {"top_k": top_k, "device_buffer_size": buf, "host_to_device_ratio": ratio}
    extra = h.get("extra") or {}
    clash = sorted(set(extra) & set(out))
    if clash:
        raise ValueError(f"server.sglang.hisparse.extra repeats {clash}; set them directly")
    out.update(extra)
    return out


def _kv_cache_dtype(s: dict, model: Mapping) -> str | None:
    v = s.get("kv_cache_dtype")
    if v in (None, "none"):
        return None
    if v != "auto":
        return str(v)
    fmt = model.get("kv_format")
    if fmt is None:
        return None
    if fmt not in KV_CACHE_DTYPES:
        raise ValueError(
            f"model.kv_format={fmt!r} has no SGLang --kv-cache-dtype; known: "
            f"{sorted(KV_CACHE_DTYPES)} (or set server.sglang.kv_cache_dtype)"
        )
    return KV_CACHE_DTYPES[fmt]


# ---------------------------------------------------------------------------- argument lists


def _common_args(cfg: Any, host: str, port: int, tp: int) -> list[str]:
    """Arguments every SGLang server of the run shares (model, size, cache settings)."""
    root = _plain(cfg)
    s = settings(cfg)
    model = root.get("model") or {}
    hw = root.get("hardware") or {}
    if not s.get("model_path"):
        raise ValueError(
            "server.sglang.model_path is required: the HF repo id or local "
            "directory of the checkpoint SGLang serves (our model presets only "
            "carry its geometry: k, B, KV format)"
        )
    a = [
        "--model-path",
        str(s["model_path"]),
        "--host",
        str(host),
        "--port",
        str(port),
        "--tp-size",
        str(_int(tp, "tensor parallel size")),
    ]
    if s.get("tokenizer_path"):
        a += ["--tokenizer-path", str(s["tokenizer_path"])]
    if s.get("served_model_name"):
        a += ["--served-model-name", str(s["served_model_name"])]
    if s.get("trust_remote_code"):
        a.append("--trust-remote-code")
    if s.get("enable_metrics"):
        a.append("--enable-metrics")
    mrr = s.get("max_running_requests")
    if mrr == "auto":
        mrr = hw.get("max_running_requests")
    if mrr is not None:
        a += ["--max-running-requests", str(_int(mrr, "max_running_requests"))]
    dtype = _kv_cache_dtype(s, model)
    if dtype:
        a += ["--kv-cache-dtype", dtype]
    for key, flag in (("page_size", "--page-size"), ("context_length", "--context-length")):
        if s.get(key) is not None:
            a += [flag, str(_int(s[key], f"server.sglang.{key}"))]
    if s.get("mem_fraction_static") is not None:
        f = float(s["mem_fraction_static"])
        if not 0 < f < 1:
            raise ValueError(f"server.sglang.mem_fraction_static must be in (0, 1), got {f}")
        a += ["--mem-fraction-static", str(f)]
    if root.get("seed") is not None:
        a += ["--random-seed", str(int(root["seed"]))]
    if s.get("disable_radix_cache") or hisparse_config(cfg) is not None:
        a.append("--disable-radix-cache")  # HiSparse asserts it; matched across methods
    return a


def _hisparse_args(cfg: Any) -> list[str]:
    h = hisparse_config(cfg)
    if h is None:
        return []
    return ["--enable-hisparse", "--hisparse-config", json.dumps(h, separators=(",", ":"))]


def _spec_args(cfg: Any) -> list[str]:
    sp = speculation(cfg)
    if sp is None:
        return []
    a = ["--speculative-algorithm", sp.algorithm]
    if sp.draft_model_path:
        a += ["--speculative-draft-model-path", str(sp.draft_model_path)]
    elif sp.algorithm == "DFLASH":
        raise ValueError(
            "DFLASH needs a draft checkpoint: set "
            "server.sglang.speculative.draft_model_path (a DFlash2 draft model)"
        )
    if sp.block_size is not None:
        if sp.algorithm == "DFLASH":
            a += ["--speculative-dflash-block-size", str(sp.block_size)]
        else:
            a += ["--speculative-dspark-block-size", str(sp.block_size - 1)]
    if sp.draft_window_size is not None:
        a += ["--speculative-draft-window-size", str(sp.draft_window_size)]
    return a


def server_args(cfg: Any, port: int, host: str | None = None) -> list[str]:
    """One co-located SGLang server (prefill and decode in the same process)."""
    check_supported(cfg)
    s = settings(cfg)
    host = host or _server_host(cfg)
    return [
        *_common_args(cfg, host, port, s["tp"]),
        *_hisparse_args(cfg),
        *_spec_args(cfg),
        *_args_list(s.get("extra_args"), "server.sglang.extra_args"),
    ]


def pd_server_args(
    cfg: Any, prefill_port: int, decode_port: int, host: str | None = None
) -> tuple[list[str], list[str]]:
    """Prefill and decode servers of a disaggregated deployment.

    HiSparse is a decode-side feature in SGLang (the prefill side transfers KV straight into the
    decode host pool); the drafter runs on both sides unless speculative.on_prefill is false.
    """
    check_supported(cfg)
    s = settings(cfg)
    pd = s["pd"]
    host = host or _server_host(cfg)
    backend = str(pd.get("transfer_backend"))
    if backend not in TRANSFER_BACKENDS:
        raise ValueError(
            f"server.sglang.pd.transfer_backend={backend!r}; allowed: {list(TRANSFER_BACKENDS)}"
        )
    boot = _int(pd.get("bootstrap_port"), "server.sglang.pd.bootstrap_port")
    shared = [
        "--disaggregation-transfer-backend",
        backend,
        "--disaggregation-bootstrap-port",
        str(boot),
    ]
    if pd.get("ib_device"):
        shared += ["--disaggregation-ib-device", str(pd["ib_device"])]
    extra = _args_list(s.get("extra_args"), "server.sglang.extra_args")
    spec = _spec_args(cfg)
    prefill = [
        *_common_args(cfg, host, prefill_port, pd["prefill"]["tp"]),
        "--disaggregation-mode",
        "prefill",
        *shared,
        *(spec if s["speculative"].get("on_prefill", True) else []),
        *extra,
        *_args_list(pd["prefill"].get("extra_args"), "server.sglang.pd.prefill.extra_args"),
    ]
    decode = [
        *_common_args(cfg, host, decode_port, pd["decode"]["tp"]),
        "--disaggregation-mode",
        "decode",
        *shared,
        *_hisparse_args(cfg),
        *spec,
        *extra,
        *_args_list(pd["decode"].get("extra_args"), "server.sglang.pd.decode.extra_args"),
    ]
    return prefill, decode


def router_args(
    cfg: Any, prefill_url: str, decode_url: str, port: int, host: str | None = None
) -> list[str]:
    """sglang_router.launch_router in PD mode in front of one prefill and one decode server."""
    pd = settings(cfg)["pd"]
    policy = str(pd.get("policy"))
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"server.sglang.pd.policy={policy!r}; allowed: {list(ROUTER_POLICIES)}")
    boot = _int(pd["bootstrap_port"], "server.sglang.pd.bootstrap_port")
    a = [
        "--pd-disaggregation",
        "--prefill",
        prefill_url,
        str(boot),
        "--decode",
        decode_url,
        "--host",
        str(host or _server_host(cfg)),
        "--port",
        str(port),
        "--policy",
        policy,
    ]
    if pd.get("mini_lb"):
        a.append("--mini-lb")
    return a + _args_list(pd.get("router_extra_args"), "server.sglang.pd.router_extra_args")


def _server_host(cfg: Any) -> str:
    return str(((_plain(cfg).get("server") or {}).get("host")) or "127.0.0.1")


# ---------------------------------------------------------------------------- the plan


def _check_gpu_count(root: Mapping, s: dict) -> None:
    """output_tok_s_per_gpu divides by hardware.num_gpus: it must count the GPUs that decode
    (a co-located server's tensor parallel size, the decode server's under PD), or a 4-GPU
    server's total would be reported per GPU."""
    decode = s["pd"]["decode"]["tp"] if s["pd"].get("enabled") else s.get("tp")
    decode = _int(decode, "tensor parallel size")
    have = int(((root.get("hardware") or {}).get("num_gpus")) or 1)
    if have != decode:
        raise ValueError(
            f"hardware.num_gpus={have}, but this deployment decodes on {decode} GPU(s) "
            f"({'server.sglang.pd.decode.tp' if s['pd'].get('enabled') else 'server.sglang.tp'}): "
            f"output per GPU divides by hardware.num_gpus; set hardware.num_gpus={decode}"
        )


def build_plan(cfg: Any, pick_port: Callable[[], int] | None = None) -> LaunchPlan:
    """Validate ``cfg`` and lay out the processes of one deployment. Starts nothing.

    Ports set to 0 are drawn from ``pick_port`` (required then).
    """
    root = _plain(cfg)
    check_supported(cfg)
    s = settings(cfg)
    srv = root.get("server") or {}
    host = _server_host(cfg)
    _check_gpu_count(root, s)

    def port(v: Any, where: str) -> int:
        v = 0 if v is None else _int(v, where, lo=0)
        if v == 0:
            if pick_port is None:
                raise ValueError(f"{where}=0 needs a free-port picker")
            return pick_port()
        return v

    command = _args_list(s.get("command"), "server.sglang.command")
    router_command = _args_list(s.get("router_command"), "server.sglang.router_command")
    if not command:
        raise ValueError(
            "server.sglang.command is empty: give the launch command prefix, "
            "e.g. [python, -m, sglang.launch_server]"
        )
    env = {str(k): str(v) for k, v in (s.get("env") or {}).items()}
    notes = _notes(root, s)
    front = port(srv.get("port"), "server.port")
    if not s["pd"].get("enabled"):
        srv_launch = ServerLaunch(
            "server",
            server_args(cfg, front, host),
            host,
            front,
            _gpus(s.get("gpus"), "server.sglang.gpus"),
        )
        return LaunchPlan([srv_launch], None, srv_launch.url, command, router_command, env, notes)
    pd = s["pd"]
    pp = port(pd["prefill"].get("port"), "server.sglang.pd.prefill.port")
    dp = port(pd["decode"].get("port"), "server.sglang.pd.decode.port")
    if len({front, pp, dp, int(pd["bootstrap_port"])}) < 4:
        raise ValueError(
            f"PD ports must differ: router {front}, prefill {pp}, decode {dp}, "
            f"bootstrap {pd['bootstrap_port']}"
        )
    pre_args, dec_args = pd_server_args(cfg, pp, dp, host)
    prefill = ServerLaunch(
        "prefill",
        pre_args,
        host,
        pp,
        _gpus(pd["prefill"].get("gpus"), "server.sglang.pd.prefill.gpus"),
    )
    decode = ServerLaunch(
        "decode",
        dec_args,
        host,
        dp,
        _gpus(pd["decode"].get("gpus"), "server.sglang.pd.decode.gpus"),
    )
    if not router_command:
        raise ValueError("server.sglang.router_command is empty; PD needs the router")
    r_args = router_args(cfg, prefill.url, decode.url, front, host)
    url = f"http://{_url_host(host)}:{front}"
    return LaunchPlan([prefill, decode], r_args, url, command, router_command, env, notes)


def _notes(root: Mapping, s: dict) -> list[str]:
    notes = []
    system = root.get("system") or {}
    spec = system.get("speculation") or {}
    if str(system.get("kv_backend")) in HISPARSE_BACKENDS:
        if not s["pd"].get("enabled"):
            notes.append(
                "SGLang documents HiSparse as a decode-instance feature of PD "
                "disaggregation; this co-located server relies on its non-PD path"
            )
        if spec:
            notes.append(
                "speculation over HiSparse uses SGLang's own minimal integration "
                "(linear drafts), not the paper's verification over the hierarchy"
            )
    if isinstance(spec, Mapping) and spec.get("acceptance") == "calibrated":
        notes.append(
            "SGLang runs real drafts and real acceptance: calibrated acceptance of "
            "the bundled engine does not apply"
        )
    if (
        isinstance(spec, Mapping)
        and spec.get("drafter") == "dspark"
        and not s["speculative"].get("draft_model_path")
    ):
        notes.append("DSPARK without a draft path: SGLang uses the draft bundled with the target")
    return notes
