"""Step tables kernel (TRITON_INTERPRET=1 on CPU) against the reference: every table equal,
dtype and value, on odd shapes, with and without the adaptive backend's direct pages."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402

from systems.kernels import step_tables as st  # noqa: E402
from tests.kernels.support import interpreted, needs_nvidia_backend, run_compiled  # noqa: E402


def _case(B, Q, S, T, PH, direct, seed):
    g = torch.Generator().manual_seed(seed)
    ns, PI, ipage, G, hot = 9, 6, 8, 32, 12
    slots = torch.randperm(ns, generator=g)[:B]
    positions = torch.randint(0, PI * ipage, (B, Q), generator=g)
    positions[0, -1] = -1  # a padded query: no row
    index_pages = torch.randint(-1, 40, (ns, PI), generator=g, dtype=torch.int32)
    tail_start = torch.randint(0, 200, (ns,), generator=g, dtype=torch.int32)
    slot_page = torch.randint(0, 50, (ns,), generator=g, dtype=torch.int32)
    host_pages = torch.randint(-1, 500, (ns, PH), generator=g, dtype=torch.int32)
    direct_pages = (
        torch.randint(-1, 60 * S, (S, ns, PH), generator=g, dtype=torch.int32) if direct else None
    )
    args = (slots, positions, index_pages, ipage, tail_start, slot_page, host_pages, direct_pages)
    return args, dict(S=S, NG=50 * G + 7 * G, G=G, hot=hot, T=T)


@interpreted(st._step_tables_kernel)
@pytest.mark.parametrize(
    "B,Q,S,T,PH", [(1, 1, 1, 5, 7), (3, 4, 3, 16, 70), (5, 2, 2, 13, 1030), (2, 8, 26, 8, 9)]
)
@pytest.mark.parametrize("direct", [False, True])
def test_kernel_matches_reference(B, Q, S, T, PH, direct):
    args, kw = _case(B, Q, S, T, PH, direct, seed=B * 100 + Q * 10 + S)
    want = st.step_tables(*args, impl="reference", **kw)
    got = st.step_tables(*args, impl="triton", **kw)
    assert set(got) == set(want)
    for k, w in want.items():
        if w is None:
            assert got[k] is None, k
            continue
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(got[k], w), (k, (got[k] != w).nonzero()[:5])


@interpreted(st._step_tables_kernel)
def test_no_requests_and_a_bad_impl():
    args, kw = _case(1, 1, 2, 4, 3, True, seed=0)
    empty = (args[0][:0], args[1][:0]) + args[2:]
    got = st.step_tables(*empty, impl="triton", **kw)
    assert got["tail_loc"].shape == (2, 0, 4) and got["direct"].shape == (2, 0, 3)
    with pytest.raises(ValueError, match="unknown step tables impl"):
        st.step_tables(*args, impl="cuda", **kw)


_AOT = r"""
from systems.kernels import step_tables as st
from systems.kernels.aot import compile_for_nvidia
ptrs = ("slots_ptr", "pos_ptr", "iwl_ptr", "wl_ptr")
types = {n: "*i64" for n in ptrs}
for n in ("ipg_ptr", "ts_ptr", "page_ptr", "hpt_ptr", "dpt_ptr", "ts_out", "tail_out", "hpt_out",
          "hot_out", "dir_out"):
    types[n] = "*i32"
types.update(ipg_stride="i64", hpt_stride="i64", dpt_stride="i64", dpt_sstride="i64", NG="i64")
for direct in (False, True):
    c = dict(HAS_DIRECT=direct, BLOCK_Q=4, BLOCK_T=128, BLOCK_P=1024)
    compile_for_nvidia(st._step_tables_kernel, c, types)
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_compiles_for_sm90_without_gpu():
    run_compiled(_AOT)


def test_auto_selfcheck_covers_the_step_tables(monkeypatch):
    """Step tables that differ from the reference send model.attention_impl=auto to the
    references, with the reason; the real kernel passes (under the interpreter here)."""
    from systems.kernels import selfcheck

    cpu = torch.device("cpu")
    monkeypatch.setattr(selfcheck, "_VERDICT", {})
    assert selfcheck.check_kernels(cpu) == (True, "ok")
    real = st.step_tables_triton

    def off_by_one(*a, **k):
        out = real(*a, **k)
        out["tail_loc"] = out["tail_loc"] + 1
        return out

    monkeypatch.setattr(selfcheck, "_VERDICT", {})
    monkeypatch.setattr(st, "step_tables_triton", off_by_one)
    ok, why = selfcheck.check_kernels(cpu)
    assert not ok and "step tables (tail_loc) differ" in why
