"""From a composed Hydra config (conf/) to the engine's typed configs.

Typed dataclasses are the schema: an unknown or ill-typed field fails here at start-up with a
ValueError naming it, before any memory is allocated.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from systems.engine.engine import EngineConfig
from systems.kv.base import KVConfig
from systems.models.config import ModelConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def resolve_device(device: str) -> str:
    if device == "auto":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _typed(cls, data: dict[str, Any], where: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(names)}")
    return cls(**data)


def model_config_from(cfg: DictConfig | dict, device: str) -> ModelConfig:
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    if data.get("dtype", "auto") == "auto":
        data["dtype"] = "bfloat16" if device.startswith("cuda") else "float32"
    return _typed(ModelConfig, data, "model")


def engine_config_from_cfg(cfg: DictConfig) -> EngineConfig:
    device = resolve_device(cfg.get("device", "auto"))
    mcfg = model_config_from(cfg.model, device)
    hw = cfg.hardware
    system = cfg.system
    extra = system.get("kv")
    extra = OmegaConf.to_container(extra, resolve=True) if extra is not None else {}
    max_total = int(cfg.workload.input_len) + int(cfg.workload.output_len) \
        if "workload" in cfg else 0
    kv = KVConfig(
        backend=str(system.kv_backend),
        kv_pool_gib=float(hw.kv_pool_gib),
        max_running_requests=int(hw.max_running_requests),
        max_total_tokens=0,
        hot_cache_rows=int(mcfg.hot_cache_rows or 2 * mcfg.index_topk),
        host_pool_gib=float(hw.get("host_pool_gib", 1.0)),
        extra=extra,
    )
    if max_total > mcfg.max_context_len:
        raise ValueError(f"workload.input_len + workload.output_len = {max_total} exceeds "
                         f"model.max_context_len = {mcfg.max_context_len}")
    eng = cfg.get("engine", {}) or {}
    return EngineConfig(model=mcfg, kv=kv, device=device,
                        max_waiting=int(eng.get("max_waiting", 4096)),
                        max_new_tokens_cap=int(eng.get("max_new_tokens_cap", 8192)),
                        prefix_cache_entries=int(eng.get("prefix_cache_entries", 16)),
                        max_handoffs_per_step=int(eng.get("max_handoffs_per_step", 0)),
                        seed=int(cfg.get("seed", 0)),
                        speculation=OmegaConf.to_container(system.speculation, resolve=True)
                        if system.get("speculation") else None,
                        profile=_profile(cfg), profile_dir=cfg.get("profile_dir"),
                        **_graph_options(eng))


_GRAPH_KEYS = ("disable_cuda_graph", "cuda_graph_max_bs", "cuda_graph_scan_step",
               "cuda_graph_max_graphs", "cuda_graph_emulate", "cuda_graph_capture_after")


def _graph_options(eng) -> dict:
    unknown = sorted(set(eng) - {"max_waiting", "max_new_tokens_cap", "prefix_cache_entries",
                                 "max_handoffs_per_step", *_GRAPH_KEYS})
    if unknown:
        raise ValueError(f"engine: unknown field(s) {unknown}")
    types = {f.name: f.type for f in dataclasses.fields(EngineConfig)}
    return {k: (bool(eng[k]) if types[k] in (bool, "bool") else int(eng[k]))
            for k in _GRAPH_KEYS if k in eng}


def _profile(cfg: DictConfig) -> dict | None:
    prof = cfg.get("profile")
    if prof is None or prof.get("name", "none") == "none":
        return None
    return OmegaConf.to_container(prof, resolve=True)


def compose(overrides: list[str] | None = None) -> DictConfig:
    from hydra import compose as hcompose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hcompose(config_name="config", overrides=list(overrides or []))


def compose_engine_config(overrides: list[str] | None = None,
                          config_path: str | None = None) -> EngineConfig:
    cfg = OmegaConf.load(config_path) if config_path else compose(overrides)
    if config_path and overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return engine_config_from_cfg(cfg)
