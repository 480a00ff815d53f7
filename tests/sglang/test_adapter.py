"""What our configs map to on SGLang, checked in the main environment (no sglang import).

test_server_args.py checks the same lists against SGLang's parser in .venv-sglang.
"""

from __future__ import annotations

import json

import pytest

from systems.sglang import adapter
from tests.sglang.common import DRAFT_PATH, sglang_cfg


def _flag(args: list[str], name: str):
    return args[args.index(name) + 1] if name in args else None


def test_hisparse_maps_k_b_and_host_ratio():
    cfg = sglang_cfg("system=hisparse", "model=glm53_mini", "hardware=h200", "server.port=30000")
    (srv,) = adapter.build_plan(cfg).servers
    assert json.loads(_flag(srv.args, "--hisparse-config")) == {
        "top_k": 512,
        "device_buffer_size": 1024,
        "host_to_device_ratio": 5,
    }  # 64 / 12 GiB
    assert "--enable-hisparse" in srv.args and "--disable-radix-cache" in srv.args
    assert _flag(srv.args, "--kv-cache-dtype") == "fp8_e4m3"
    assert _flag(srv.args, "--max-running-requests") == "256"


def test_zero_hot_cache_rows_means_two_k():
    cfg = sglang_cfg("system=hisparse", "model=tiny", "system.kv.hot_cache_rows=0", "server.port=1")
    assert adapter.hisparse_config(cfg)["device_buffer_size"] == 2 * 8


def test_resident_has_no_hisparse_and_speculation_maps_block_sizes():
    cfg = sglang_cfg("system=resident", "model=tiny", "server.port=1")
    args = adapter.build_plan(cfg).servers[0].args
    assert "--enable-hisparse" not in args and "--speculative-algorithm" not in args
    cfg = sglang_cfg("system=resident_dflash2", "model=glm53_mini", "server.port=1")
    args = adapter.build_plan(cfg).servers[0].args
    assert (
        _flag(args, "--speculative-algorithm"),
        _flag(args, "--speculative-dflash-block-size"),
        _flag(args, "--speculative-draft-model-path"),
    ) == ("DFLASH", "4", DRAFT_PATH)
    cfg = sglang_cfg("system=resident_dspark", "model=dsv41_mini", "server.port=1")
    args = adapter.build_plan(cfg).servers[0].args
    # our K counts the anchor (8 target queries); DSpark's gamma counts proposals only
    assert (
        _flag(args, "--speculative-algorithm"),
        _flag(args, "--speculative-dspark-block-size"),
    ) == ("DSPARK", "7")


@pytest.mark.parametrize(
    "system", ["adaptive_hisparse", "adaptive_dhisparse", "adaptive_dhisparse_dspark"]
)
def test_adaptive_systems_have_no_sglang_equivalent(system):
    cfg = sglang_cfg(f"system={system}", "server.port=1")
    with pytest.raises(adapter.UnsupportedOnSGLang, match=f"system={system}.*no SGLang equivalent"):
        adapter.build_plan(cfg)
    assert issubclass(adapter.UnsupportedOnSGLang, ValueError)


def test_pd_puts_hisparse_on_decode_and_the_drafter_on_both():
    cfg = sglang_cfg(
        "system=hisparse",
        "model=glm53_mini",
        "server.port=30000",
        "server.sglang.pd.enabled=true",
        "+system.speculation.drafter=dflash2",
        "+system.speculation.block_size=6",
    )
    plan = adapter.build_plan(cfg, pick_port=iter([30100, 30200]).__next__)
    prefill, decode = plan.servers
    assert (prefill.port, decode.port) == (30100, 30200)
    assert _flag(prefill.args, "--disaggregation-mode") == "prefill"
    assert _flag(decode.args, "--disaggregation-mode") == "decode"
    assert "--enable-hisparse" not in prefill.args and "--enable-hisparse" in decode.args
    assert _flag(prefill.args, "--speculative-dflash-block-size") == "6"
    assert _flag(decode.args, "--speculative-dflash-block-size") == "6"
    assert plan.router_args[:6] == [
        "--pd-disaggregation",
        "--prefill",
        prefill.url,
        "8998",
        "--decode",
        decode.url,
    ]
    assert plan.url == "http://127.0.0.1:30000"
    assert any("minimal integration" in n for n in plan.notes)
    cfg = sglang_cfg(
        "system=resident_dflash2",
        "server.port=30000",
        "server.sglang.pd.enabled=true",
        "server.sglang.speculative.on_prefill=false",
        "server.sglang.pd.prefill.port=30100",
        "server.sglang.pd.decode.port=30200",
    )
    prefill, decode = adapter.build_plan(cfg).servers
    assert "--speculative-algorithm" not in prefill.args
    assert "--speculative-algorithm" in decode.args


def test_port_zero_needs_a_picker_and_ports_must_differ():
    cfg = sglang_cfg("system=resident")  # server.port=0
    with pytest.raises(ValueError, match="free-port picker"):
        adapter.build_plan(cfg)
    assert adapter.build_plan(cfg, pick_port=lambda: 31234).url == "http://127.0.0.1:31234"
    cfg = sglang_cfg(
        "system=resident",
        "server.port=30000",
        "server.sglang.pd.enabled=true",
        "server.sglang.pd.prefill.port=30000",
        "server.sglang.pd.decode.port=30200",
    )
    with pytest.raises(ValueError, match="PD ports must differ"):
        adapter.build_plan(cfg)


def test_describe_prints_runnable_commands():
    cfg = sglang_cfg(
        "system=hisparse",
        "model=tiny",
        "server.port=30000",
        "server.sglang.gpus=[2,3]",
        "server.sglang.tp=2",
        "hardware.num_gpus=2",
    )
    text = adapter.build_plan(cfg).describe()
    assert "CUDA_VISIBLE_DEVICES=2,3 .venv-sglang/bin/python -m sglang.launch_server" in text
    assert '--hisparse-config \'{"top_k":8,' in text and "--tp-size 2" in text


def test_plain_dicts_work_without_hydra():
    cfg = {
        "system": {"name": "hisparse", "kv_backend": "hisparse", "kv": {"hot_cache_rows": 256}},
        "model": {"index_topk": 64, "kv_format": "bf16"},
        "hardware": {"kv_pool_gib": 2, "host_pool_gib": 7, "max_running_requests": 8},
        "server": {"port": 40000, "sglang": {"model_path": "m"}},
    }
    args = adapter.build_plan(cfg).servers[0].args
    assert json.loads(_flag(args, "--hisparse-config"))["host_to_device_ratio"] == 3
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['bogus'\]"):
        adapter.settings({"server": {"sglang": {"pd": {"bogus": 1}}}})


def test_per_gpu_output_needs_the_decoding_gpus_counted():
    """output_tok_s_per_gpu divides by hardware.num_gpus: a 2-GPU server with num_gpus=1 would
    report its total per GPU, so the plan refuses it, naming the setting."""
    cfg = sglang_cfg("system=hisparse", "model=tiny", "server.port=30000", "server.sglang.tp=2")
    with pytest.raises(ValueError, match="set hardware.num_gpus=2"):
        adapter.build_plan(cfg)
