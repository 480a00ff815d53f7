"""Imports every bundled backend so that its @register line runs. Add new backends here."""

from systems.kv import (
    adaptive,  # noqa: F401
    hisparse,  # noqa: F401
    resident,  # noqa: F401
)
