"""The server's command line: a user's mistake is one line and exit code 2, before the engine is
built (minutes on a large preset), as SGLang's and vLLM's launchers answer a bad flag."""

from __future__ import annotations

import socket

import pytest

from systems.engine import server


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        server.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(capsys, port):
    assert "argument --port" in _error(capsys, ["--port", port])


def test_a_port_in_use_fails_before_the_engine_is_built(capsys, monkeypatch):
    def no_engine(*a, **k):
        raise AssertionError("the engine was built for a port it cannot serve on")

    monkeypatch.setattr(server, "Engine", no_engine)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _error(capsys, ["--port", str(port), "server.engine_process=false"])
    assert line == f"error: cannot listen on 127.0.0.1:{port}: in use"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["+nope=1"], "unknown config key(s) ['nope']"),
        (["+workload.nope=1"], "unknown workload key(s) ['nope']"),
        (["workload.nope=1"], "Could not override 'workload.nope'"),
        (["system=nope"], "Could not find 'system/nope'"),
        (["device=tpu"], "expected auto, cpu, cuda or cuda:N"),
        (["--config", "/nonexistent/config.yaml"], "No such file or directory"),
    ],
)
def test_a_bad_config_is_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        server.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_port_zero_and_a_free_port_pass_the_check():
    server.check_can_listen("127.0.0.1", 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    server.check_can_listen("127.0.0.1", free)
