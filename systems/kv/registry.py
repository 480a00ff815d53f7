"""Backend registry: one backend = one module + one ``@register("name", options=...)`` line.

``options`` is the backend's frozen dataclass of knobs (``system.kv`` in the Hydra configs).
The registry turns a ``system.kv`` mapping into that dataclass, so an unknown key fails at start
naming the key and the allowed ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

_REGISTRY: dict[str, Callable] = {}
_OPTIONS: dict[str, type] = {}


def register(name: str, options: type):
    def deco(cls):
        if name in _REGISTRY:
            raise ValueError(f"KV backend {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        _OPTIONS[name] = options
        return cls

    return deco


def _load() -> None:
    import systems.kv.backends  # noqa: F401  (registers the bundled backends)


def available() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def options_class(backend: str) -> type:
    _load()
    if backend not in _OPTIONS:
        raise ValueError(
            f"system.kv_backend: unknown backend {backend!r}; available: {available()}"
        )
    return _OPTIONS[backend]


def check_value_types(cls, data: dict[str, Any], where: str) -> None:
    """A number or flag given as a word (``hot_cache_rows=abc``) is named with its key here,
    not left to an ``int()`` deep in a constructor: the type is the field's default's."""
    for f in dataclasses.fields(cls):
        if f.name not in data or f.default is dataclasses.MISSING:
            continue
        want, v = type(f.default), data[f.name]
        if want in (int, float, bool) and isinstance(v, str):
            raise ValueError(f"{where}.{f.name}: expected {want.__name__}, got {v!r}")


def options_from(backend: str, data: dict[str, Any] | None):
    """The backend's options dataclass from a ``system.kv`` mapping (unresolved: ``auto`` and
    0-means-derived values stay as written; ``systems.engine.config.resolve`` fills them)."""
    cls = options_class(backend)
    data = dict(data or {})
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(
            f"system.kv: unknown key(s) {unknown} for backend {backend!r}; "
            f"allowed: {names or 'none'}"
        )
    check_value_types(cls, data, "system.kv")
    return cls(**data)


def create_backend(model_cfg, kv_cfg, device):
    cls = options_class(kv_cfg.backend)
    if not isinstance(kv_cfg.options, cls):
        raise TypeError(
            f"kv.options is {type(kv_cfg.options).__name__}, backend "
            f"{kv_cfg.backend!r} takes {cls.__name__}"
        )
    return _REGISTRY[kv_cfg.backend](model_cfg, kv_cfg, device)
