"""Backend registry: one backend = one module + one ``@register("name")`` line."""

from __future__ import annotations

from typing import Callable

_REGISTRY: dict[str, Callable] = {}


def register(name: str):
    def deco(cls):
        if name in _REGISTRY:
            raise ValueError(f"KV backend {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def available() -> list[str]:
    return sorted(_REGISTRY)


def create_backend(model_cfg, kv_cfg, device):
    import systems.kv.backends  # noqa: F401  (registers the bundled backends)
    if kv_cfg.backend not in _REGISTRY:
        raise ValueError(f"kv.backend: unknown backend {kv_cfg.backend!r}; "
                         f"available: {available()}")
    return _REGISTRY[kv_cfg.backend](model_cfg, kv_cfg, device)
