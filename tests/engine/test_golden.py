"""Every registered KV backend reproduces the resident backend's golden greedy tokens."""

import json
from pathlib import Path

import pytest

import systems.kv.backends  # noqa: F401
from systems.kv.registry import available, create_backend  # noqa: F401
from tests.helpers import make_engine, run_greedy

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "tiny_greedy.json").read_text())
BACKENDS = available()


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_reproduces_golden_tokens(backend, model):
    eng = make_engine(f"model={model}", f"system.kv_backend={backend}", "hardware.kv_pool_gib=0.01")
    outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"][model]
    eng.backend.check_integrity()
    assert eng.backend.is_empty


@pytest.mark.parametrize("max_bs", [3, 5])
@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_protocol_reproduces_golden_tokens(backend, model, max_bs):
    """The CUDA-graph protocol (static inputs, host/device split of the step, scan-length
    buckets), emulated on CPU: the same golden tokens, and the captured region never syncs.
    The 5 requests run together: a batch cap of 3 sends every step down the eager path with
    bucketed scans, a cap of 5 through captured graphs; a 16-position bucket makes the scan
    length change within the run. Graphs are captured at their uses here (make_engine leaves
    the start-up warm-up off; tests/engine/test_cuda_graph.py covers it)."""
    eng = make_engine(
        f"model={model}",
        f"system.kv_backend={backend}",
        "hardware.kv_pool_gib=0.01",
        "+engine.cuda_graph_emulate=true",
        f"engine.cuda_graph_max_bs={max_bs}",
        "engine.cuda_graph_scan_step=16",
    )
    outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"][model]
    st = eng.graph_runner.stats
    if max_bs < len(GOLDEN["prompts"]):
        assert st["captures"] == 0 and st["eager_steps"] > 0
    else:
        assert st["captures"] >= 2 and st["replays"] > st["captures"]
        assert {L for (_, _, L) in eng.graph_runner.graphs} >= {144, 160}
    eng.backend.check_integrity()


@pytest.mark.parametrize(
    "backend,impl",
    [("resident", "triton"), ("adaptive_hisparse", "triton"), ("hisparse", "triton_mma")],
)
def test_fused_attention_kernel_reproduces_golden_tokens(backend, impl):
    """model.attention_impl=triton (the GPU default; here under TRITON_INTERPRET=1): the indexer's
    scores over paged keys and the attention over rows read in place by location give the
    reference's tokens, prefill and decode, through a backend. Two prompts (5 and 23 tokens) and
    the golden's first 12 tokens, under half the interpreter's time of three and 24: the longer
    prompt's decode still crosses a 16-row page, past the hierarchy backends' 16-row hot cache
    (2k), beside a request of another length (tests/kernels/ hold the kernels' shapes against
    the reference, and test_backend_reproduces_golden_tokens every prompt and token)."""
    from triton.runtime.interpreter import InterpretedFunction

    from systems.kernels.sparse_attention import _sparse_attention_kernel

    if not isinstance(_sparse_attention_kernel, InterpretedFunction):
        pytest.skip("triton imported without TRITON_INTERPRET=1 in this process")
    eng = make_engine(
        "model=tiny",
        f"system.kv_backend={backend}",
        "hardware.kv_pool_gib=0.01",
        f"model.attention_impl={impl}",
    )
    assert eng.model.attention_impl == impl and eng.backend.index_impl == "triton"
    outs = run_greedy(eng, GOLDEN["prompts"][:2], 12)
    assert outs == [o[:12] for o in GOLDEN["outputs"]["tiny"][:2]]


@pytest.mark.parametrize("backend", ["adaptive_hisparse"])  # HiSparse's target, inherited
def test_fp8_rows_encoded_in_place_give_the_write_kv_path_tokens(backend):
    """The fused path encodes a step's new fp8 rows straight into the backend's pool
    (``kv_write_target``); forcing the same engine through ``write_kv`` (encode, then scatter)
    must give the same tokens, and the in-place path must actually have run."""
    from triton.runtime.interpreter import InterpretedFunction

    from systems.kernels.fused_ops import _encode_fp8_kernel

    if not isinstance(_encode_fp8_kernel, InterpretedFunction):
        pytest.skip("triton imported without TRITON_INTERPRET=1 in this process")
    args = (
        "model=tiny",
        "model.kv_format=fp8",
        "model.kv_dim=160",
        "model.kv_rope_dim=32",
        f"system.kv_backend={backend}",
        "hardware.kv_pool_gib=0.01",
        "model.attention_impl=triton",
    )
    outs = []
    for in_place in (True, False):
        eng = make_engine(*args)
        target = eng.backend.kv_write_target
        used = []

        def spy(source, target=target, used=used, in_place=in_place):
            used.append(source)
            return target(source) if in_place else None

        eng.backend.kv_write_target = spy
        # the decode steps write positions 14-16 of the second prompt: across a 16-row page
        # (the 23-token golden prompt's writes stayed inside one, at a longer prefill)
        prompts = [GOLDEN["prompts"][0], GOLDEN["prompts"][1][:14]]
        outs.append(run_greedy(eng, prompts, 4))
        assert used  # the model asked for the target on the fused path
        eng.backend.check_integrity()
    assert outs[0] == outs[1]


def test_batch_invariant_gemm_gives_cublas_tokens():
    """``model.gemm_impl=triton`` (systems/kernels/gemm.py, under the interpreter here): every
    projection through the fixed-tile kernel, the tokens of the default GEMM."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton GEMM runs on CPU only under TRITON_INTERPRET=1")
    prompts = GOLDEN["prompts"][:3]
    outs = []
    for impl in ("cublas", "triton"):
        eng = make_engine("model=tiny", "hardware.kv_pool_gib=0.01", f"model.gemm_impl={impl}")
        assert eng.model.gemm_impl == impl
        outs.append(run_greedy(eng, prompts, 6))
    assert outs[0] == outs[1] == [o[:6] for o in GOLDEN["outputs"]["tiny"][:3]]
