"""server.gil_switch_interval_ms: the server process's thread switch interval (the engine thread
shares the interpreter with the HTTP server), validated and applied by the server's main."""

from __future__ import annotations

import sys

import pytest

from systems.engine.server import ServerConfig, apply_switch_interval


def test_the_interval_is_applied_and_none_keeps_pythons():
    before = sys.getswitchinterval()
    try:
        assert apply_switch_interval(ServerConfig()) == before
        got = apply_switch_interval(ServerConfig.from_cfg({"gil_switch_interval_ms": 0.5}))
        assert got == pytest.approx(0.0005) and sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("bad", [0, -1, 5000, "fast"])
def test_a_bad_interval_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="gil_switch_interval_ms"):
        ServerConfig(gil_switch_interval_ms=bad)


def test_the_default_config_keeps_pythons_interval():
    from systems.engine.config import compose

    assert ServerConfig.from_cfg(compose([]).server).gil_switch_interval_ms is None
