"""Imports every bundled backend so that its @register line runs. Add new backends here."""

from systems.kv import resident  # noqa: F401
from systems.kv import hisparse  # noqa: F401
from systems.kv import adaptive  # noqa: F401
