"""Every argument list the adapter builds is accepted by SGLang's own parsers.

Runs in the SGLang environment only (``bash scripts/sglang_env.sh``); the main environment
skips it. For every system x model preset x {co-located, PD}: the server lists go through
``sglang.srt.server_args.prepare_server_args`` (what ``python -m sglang.launch_server`` calls
before it resolves against the checkpoint) and the parsed values are compared with what the
config asked for; the HiSparse JSON goes through SGLang's own ``_parse_sparse_config``; the
router list goes through ``sglang_router.launch_router.parse_router_args``. Systems without an
SGLang equivalent must raise our ValueError before any process starts.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import subprocess

import pytest

pytest.importorskip(
    "sglang",
    reason="sglang is not importable here: these tests run in "
    ".venv-sglang (bash scripts/sglang_env.sh, or make test-sglang)",
)
server_args_mod = pytest.importorskip("sglang.srt.server_args")

from harness.sglang_launch import sglang_server  # noqa: E402
from systems.sglang import adapter  # noqa: E402
from tests.sglang.common import DRAFT_PATH, MODEL_PATH, conf_names, sglang_cfg  # noqa: E402

SYSTEMS = conf_names("system")
MODELS = conf_names("model")
PORTS = {"front": 30000, "prefill": 30100, "decode": 30200}


def _supported(system: str) -> bool:
    return not system.startswith("adaptive")


def _cfg(system: str, model: str, pd: bool, hardware: str = "h200", *extra: str):
    return sglang_cfg(
        f"system={system}",
        f"model={model}",
        f"hardware={hardware}",
        f"server.port={PORTS['front']}",
        f"server.sglang.pd.prefill.port={PORTS['prefill']}",
        f"server.sglang.pd.decode.port={PORTS['decode']}",
        f"server.sglang.pd.enabled={str(pd).lower()}",
        *extra,
    )


def parse(args: list[str]):
    """SGLang's parser on our list; an argparse rejection fails the test with its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return server_args_mod.prepare_server_args(list(args))
    except SystemExit:
        pytest.fail(f"SGLang rejected {args}:\n{err.getvalue()}")


def sglang_sparse_config(json_text: str):
    """SGLang's own reading of --hisparse-config (it raises for B < k and bad fields)."""
    from sglang.srt.mem_cache.sparsity import factory

    class _Memory:
        hisparse_config = json_text

    orig = factory.get_memory
    factory.get_memory = lambda: _Memory()
    try:
        return factory._parse_sparse_config()
    finally:
        factory.get_memory = orig


def check_server(sa, cfg, role: str, port: int) -> None:
    root = adapter._plain(cfg)
    s = adapter.settings(cfg)
    system, model, hw = root["system"], root["model"], root["hardware"]
    assert sa.model_path == MODEL_PATH
    assert sa.host == "127.0.0.1" and sa.port == port
    pd = s["pd"]
    tp = s["tp"] if role == "server" else pd[role]["tp"]
    assert sa.tp_size == tp
    assert sa.trust_remote_code is True and sa.enable_metrics is True
    assert sa.max_running_requests == hw["max_running_requests"]
    assert sa.kv_cache_dtype == adapter.KV_CACHE_DTYPES[model["kv_format"]]
    assert sa.random_seed == root["seed"]
    assert sa.disable_radix_cache is True
    # HiSparse: on the co-located server or the decode server, never on prefill
    hisparse = system["kv_backend"] == "hisparse" and role in ("server", "decode")
    assert sa.enable_hisparse is hisparse
    if hisparse:
        h = json.loads(sa.hisparse_config)
        assert h == {
            "top_k": model["index_topk"],
            "device_buffer_size": (system.get("kv") or {}).get("hot_cache_rows")
            or 2 * model["index_topk"],
            "host_to_device_ratio": max(1, int(hw["host_pool_gib"] // hw["kv_pool_gib"])),
        }
        parsed = sglang_sparse_config(sa.hisparse_config)
        assert (parsed.top_k, parsed.device_buffer_size, parsed.host_to_device_ratio) == (
            h["top_k"],
            h["device_buffer_size"],
            h["host_to_device_ratio"],
        )
    else:
        assert sa.hisparse_config is None
    spec = system.get("speculation")
    if spec:
        assert sa.speculative_algorithm == adapter.SPEC_ALGORITHMS[spec["drafter"]]
        assert sa.speculative_draft_model_path == DRAFT_PATH
        if spec["drafter"] == "dflash2":
            assert sa.speculative_dflash_block_size == spec["block_size"]
        else:
            assert sa.speculative_dspark_block_size == spec["block_size"] - 1
    else:
        assert sa.speculative_algorithm is None
    if role == "server":
        assert sa.disaggregation_mode == "null"
    else:
        assert sa.disaggregation_mode == role
        assert sa.disaggregation_bootstrap_port == pd["bootstrap_port"]
        assert sa.disaggregation_transfer_backend == pd["transfer_backend"]


COMBOS = list(itertools.product(SYSTEMS, MODELS, [False, True]))


@pytest.mark.parametrize(
    "system,model,pd", COMBOS, ids=[f"{s}-{m}-{'pd' if p else 'colo'}" for s, m, p in COMBOS]
)
def test_every_argument_list_parses(system, model, pd):
    cfg = _cfg(system, model, pd)
    if not _supported(system):
        with pytest.raises(ValueError, match="no SGLang equivalent"):
            adapter.build_plan(cfg)
        return
    plan = adapter.build_plan(cfg)
    if not pd:
        (srv,) = plan.servers
        assert plan.router_args is None and plan.url == srv.url
        check_server(parse(srv.args), cfg, "server", PORTS["front"])
        return
    prefill, decode = plan.servers
    check_server(parse(prefill.args), cfg, "prefill", PORTS["prefill"])
    check_server(parse(decode.args), cfg, "decode", PORTS["decode"])
    router = pytest.importorskip(
        "sglang_router.launch_router", reason="sglang-router is not installed in this environment"
    )
    ra = router.parse_router_args(plan.router_args)
    assert ra.pd_disaggregation is True and ra.mini_lb is False
    assert ra.prefill_urls == [(prefill.url, 8998)]
    assert ra.decode_urls == [decode.url]
    assert (ra.host, ra.port, ra.policy) == ("127.0.0.1", PORTS["front"], "round_robin")


def test_cpu_hardware_and_overrides_parse():
    """The other hardware preset, explicit overrides and extra arguments also parse."""
    cfg = _cfg(
        "hisparse",
        "glm53_mini",
        True,
        "cpu",
        "server.sglang.hisparse.top_k=2048",
        "server.sglang.hisparse.device_buffer_size=4096",
        "server.sglang.hisparse.host_to_device_ratio=10",
        "server.sglang.pd.decode.tp=4",
        "server.sglang.pd.transfer_backend=nixl",
        "server.sglang.pd.ib_device=mlx5_0",
        "server.sglang.pd.mini_lb=true",
        "server.sglang.page_size=64",
        "server.sglang.context_length=81920",
        "server.sglang.mem_fraction_static=0.85",
        "server.sglang.extra_args=[--chunked-prefill-size,8192]",
    )
    plan = adapter.build_plan(cfg)
    prefill, decode = map(parse, (s.args for s in plan.servers))
    assert decode.tp_size == 4 and prefill.tp_size == 1
    assert json.loads(decode.hisparse_config) == {
        "top_k": 2048,
        "device_buffer_size": 4096,
        "host_to_device_ratio": 10,
    }
    assert decode.disaggregation_ib_device == "mlx5_0"
    assert decode.disaggregation_transfer_backend == "nixl"
    for sa in (prefill, decode):
        assert (sa.page_size, sa.context_length, sa.mem_fraction_static) == (64, 81920, 0.85)
        assert sa.chunked_prefill_size == 8192
        assert sa.max_running_requests == 32  # hardware=cpu
    router = pytest.importorskip("sglang_router.launch_router")
    assert router.parse_router_args(plan.router_args).mini_lb is True


def test_window_and_dspark_without_draft_parse():
    cfg = _cfg(
        "resident_dflash2",
        "glm53_mini",
        False,
        "h200",
        "server.sglang.speculative.draft_window_size=2048",
        "server.sglang.speculative.block_size=6",
    )
    sa = parse(adapter.build_plan(cfg).servers[0].args)
    assert (sa.speculative_draft_window_size, sa.speculative_dflash_block_size) == (2048, 6)
    cfg = _cfg(
        "resident_dspark",
        "dsv41_mini",
        False,
        "h200",
        "server.sglang.speculative.draft_model_path=null",
    )
    sa = parse(adapter.build_plan(cfg).servers[0].args)
    assert sa.speculative_algorithm == "DSPARK" and sa.speculative_draft_model_path is None


@pytest.mark.parametrize(
    "overrides,match",
    [
        (
            ["system=resident_dflash2", "server.sglang.speculative.draft_model_path=null"],
            "DFLASH needs a draft checkpoint",
        ),
        (
            [
                "system=hisparse",
                "server.sglang.hisparse.device_buffer_size=100",
                "server.sglang.hisparse.top_k=512",
            ],
            "must be >= top_k",
        ),
        (["system=resident", "server.sglang.model_path=null"], "model_path is required"),
        (["system=resident", "+server.sglang.bogus=1"], "unknown key"),
        (
            [
                "system=resident",
                "server.sglang.pd.enabled=true",
                "server.sglang.pd.transfer_backend=tcp",
            ],
            "transfer_backend",
        ),
        (["system=resident_dspark", "system.speculation.drafter=eagle"], "no SGLang equivalent"),
        (["system=adaptive_dhisparse_dspark"], "no SGLang equivalent"),
    ],
)
def test_unsupported_combinations_fail_before_launch(overrides, match, tmp_path, monkeypatch):
    def no_process(*a, **k):
        raise AssertionError("a process was started for a configuration that must fail")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    cfg = sglang_cfg("model=glm53_mini", "server.port=30000", *overrides)
    with pytest.raises(ValueError, match=match):
        with sglang_server(cfg, tmp_path):
            pass
    assert not list(tmp_path.glob("sglang-*.log"))


def test_sglang_rejects_what_the_adapter_rejects():
    """Our pre-launch check for B < k mirrors SGLang's own rule."""
    with pytest.raises(ValueError, match="device_buffer_size"):
        sglang_sparse_config(json.dumps({"top_k": 512, "device_buffer_size": 100}))
