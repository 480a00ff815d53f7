"""Fused resolver: Triton kernel (TRITON_INTERPRET=1 on CPU) against the PyTorch reference.

Every case checks, for kernel and reference on identical copies of the state: the same
locations, hot_pos, hot_lru, counters, overflow and the same kv_pool bytes; and, against
ground truth, that the bytes at every returned location are the selected row (from host,
from the tail or from the direct map) and that every filled hot slot holds its row.
kv_pool is poisoned (0xA5) everywhere no row is supposed to be.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from systems.kernels import resolver as rv  # noqa: E402
from tests.kernels.support import needs_nvidia_backend, run_compiled  # noqa: E402


def _interpreter_usable() -> bool:
    """True when triton's language library was created with the interpreter on."""
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        return isinstance(tl.standard.zeros, InterpretedFunction) and isinstance(
            rv._resolver_kernel, InterpretedFunction
        )
    except Exception:
        return False


_IN_PROCESS = _interpreter_usable()

if not _IN_PROCESS:
    # Triton was imported earlier in this process without TRITON_INTERPRET=1 (tests/conftest.py
    # should set it globally): run this file in a fresh interpreter-mode process instead.

    @pytest.fixture(autouse=True)
    def _only_the_subprocess_test(request):
        if request.node.name != "test_resolver_suite_in_subprocess":
            pytest.skip("triton imported without TRITON_INTERPRET=1; covered by the subprocess run")

    def test_resolver_suite_in_subprocess():
        env = dict(os.environ, TRITON_INTERPRET="1")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                os.path.abspath(__file__),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


# the interpreter converts 1-element arrays to Python ints (NumPy deprecation noise)
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

POISON = 0xA5


# ----------------------------------------------------------------------------------------
# state builder
# ----------------------------------------------------------------------------------------


class State:
    """A consistent synthetic KV state for one source, plus ground truth for every row."""

    def __init__(
        self,
        *,
        R,
        Q,
        K,
        B,
        row_bytes,
        page_size,
        hist_lens,
        tail_lens,
        seed,
        fill=0.5,
        direct=0.0,
        lru_max=20,
        staging=False,
        empty_lru_random=True,
    ):
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.R, self.Q, self.K, self.B = R, Q, K, B
        self.rb, self.ps = row_bytes, page_size
        self.hist = [int(x) for x in hist_lens]
        self.tail_len = [int(x) for x in tail_lens]
        T = max(1, max(self.tail_len))
        ps = page_size
        P = max(1, max((h + t + ps - 1) // ps for h, t in zip(self.hist, self.tail_len)))
        self.P, self.T = P, T
        QK = Q * K

        # host store: distinct random page per (request, page)
        perm = torch.randperm(R * P, generator=g).to(torch.int32)
        self.host_page_table = perm.reshape(R, P).clone()
        self.host_pool = torch.randint(
            0, 256, (R * P * ps, row_bytes), generator=g, dtype=torch.uint8
        )

        # direct (optional history) pages: ready for a fraction of complete history pages
        dpt = torch.full((R, P), -1, dtype=torch.int32)
        next_page = 0
        for r in range(R):
            for j in range(self.hist[r] // ps):  # complete pages only
                if torch.rand((), generator=g).item() < direct:
                    dpt[r, j] = next_page
                    next_page += 1
        self.direct_page_table = dpt
        n_direct_rows = next_page * ps

        tail_base = n_direct_rows + 5
        hot_region = tail_base + R * T + 7
        self.hot_loc_base = torch.tensor(
            [hot_region + r * (B + 3) for r in range(R)], dtype=torch.int32
        )
        stg_region = hot_region + R * (B + 3) + 11
        self.staging_loc_base = (
            torch.tensor([stg_region + r * QK for r in range(R)], dtype=torch.int32)
            if staging
            else None
        )
        N = stg_region + R * QK + 13
        kv = torch.full((N, row_bytes), POISON, dtype=torch.uint8)

        # tail rows: own random bytes at shuffled locations
        tail_locs = (tail_base + torch.randperm(R * T, generator=g)).to(torch.int32).reshape(R, T)
        self.tail_loc = tail_locs
        self.tail_start = torch.tensor(self.hist, dtype=torch.int32)
        self.tail_rows = torch.randint(0, 256, (R, T, row_bytes), generator=g, dtype=torch.uint8)
        for r in range(R):
            kv[tail_locs[r].long()] = self.tail_rows[r]
        # direct pages hold the history rows
        for r in range(R):
            for j in range(P):
                if dpt[r, j] >= 0:
                    pos = torch.arange(j * ps, (j + 1) * ps)
                    kv[int(dpt[r, j]) * ps + torch.arange(ps)] = self.host_rows(r, pos)

        # hot cache
        hot_pos = torch.full((R, B), -1, dtype=torch.int32)
        hot_lru = torch.randint(0, lru_max, (R, B), generator=g, dtype=torch.int64)
        if not empty_lru_random:
            hot_lru.zero_()
        for r in range(R):
            n_fill = min(B, int(round(fill * B)), self.hist[r])
            if n_fill > 0:
                pos = torch.randperm(self.hist[r], generator=g)[:n_fill]
                slots = torch.randperm(B, generator=g)[:n_fill]
                hot_pos[r, slots] = pos.to(torch.int32)
                kv[int(self.hot_loc_base[r]) + slots] = self.host_rows(r, pos)
        self.hot_pos, self.hot_lru = hot_pos, hot_lru
        self.kv_pool = kv
        self.selections = torch.full((R, Q, K), -1, dtype=torch.int32)

    # ground truth ---------------------------------------------------------------------
    def host_rows(self, r, pos):
        pos = torch.as_tensor(pos, dtype=torch.int64)
        rows = self.host_page_table[r].long()[pos // self.ps] * self.ps + pos % self.ps
        return self.host_pool[rows]

    def expected_row(self, r, p):
        if p >= self.hist[r]:
            return self.tail_rows[r, p - self.hist[r]]
        return self.host_rows(r, [p])[0]

    # selections -------------------------------------------------------------------------
    def draw_selections(
        self, w_hit=1.0, w_miss=1.0, w_direct=1.0, w_tail=0.3, w_pad=0.1, w_dup=0.5
    ):
        """Fill selections with a mix of hits, misses, direct rows, tail rows, padding and
        duplicates (within and across queries)."""
        g = self.g
        R, Q, K = self.R, self.Q, self.K
        sel = torch.full((R, Q, K), -1, dtype=torch.int32)
        for r in range(R):
            h = self.hist[r]
            hot = [int(x) for x in self.hot_pos[r] if x >= 0]
            ready = [p for p in range(h) if self.direct_page_table[r, p // self.ps] >= 0]
            hotset = set(hot)
            miss = [
                p
                for p in range(h)
                if p not in hotset and self.direct_page_table[r, p // self.ps] < 0
            ]
            tail = list(range(h, h + self.tail_len[r]))
            pools = [(w_hit, hot), (w_miss, miss), (w_direct, ready), (w_tail, tail)]
            flat = []
            for _ in range(Q * K):
                ws = [w if len(c) else 0.0 for w, c in pools] + [w_pad, w_dup if flat else 0.0]
                tot = sum(ws)
                if tot == 0:
                    flat.append(-1)
                    continue
                x = torch.rand((), generator=g).item() * tot
                kind = 0
                while kind < len(ws) - 1 and x >= ws[kind]:
                    x -= ws[kind]
                    kind += 1
                if kind < 4:
                    cands = pools[kind][1]
                    flat.append(cands[int(torch.randint(len(cands), (1,), generator=g))])
                elif kind == 4:
                    flat.append(-1)
                else:
                    flat.append(flat[int(torch.randint(len(flat), (1,), generator=g))])
            sel[r] = torch.tensor(flat, dtype=torch.int32).reshape(Q, K)
        self.selections = sel
        return sel

    def args(self, use_direct=True):
        return dict(
            selections=self.selections.clone(),
            tail_start=self.tail_start.clone(),
            tail_loc=self.tail_loc.clone(),
            hot_pos=self.hot_pos.clone(),
            hot_lru=self.hot_lru.clone(),
            hot_loc_base=self.hot_loc_base.clone(),
            host_page_table=self.host_page_table.clone(),
            kv_pool=self.kv_pool.clone(),
            host_pool=self.host_pool,  # read only (and may be a padded view)
        ), dict(
            page_size=self.ps,
            direct_page_table=self.direct_page_table.clone() if use_direct else None,
            staging_loc_base=None
            if self.staging_loc_base is None
            else self.staging_loc_base.clone(),
        )


def run_and_compare(
    st_: State,
    stamp,
    *,
    use_direct=True,
    copy_programs=None,
    stamp_tensor=False,
    advance=True,
    **triton_kw,
):
    """Run reference and kernel on identical copies; assert identical results and correct bytes.
    With advance=True the state object takes the (identical) post-call state."""
    pos_ref, kw_ref = st_.args(use_direct)
    pos_tri, kw_tri = st_.args(use_direct)
    s_ref = torch.tensor([stamp], dtype=torch.int64) if stamp_tensor else stamp
    s_tri = torch.tensor([stamp], dtype=torch.int64) if stamp_tensor else stamp
    ref = rv.resolve(**pos_ref, stamp=s_ref, impl="reference", **kw_ref)
    launch = (
        (lambda **a: rv.resolve_triton(**a, **triton_kw))
        if triton_kw
        else (lambda **a: rv.resolve(**a, impl="triton"))
    )  # the dispatcher unless tuning knobs are set
    tri = launch(**pos_tri, stamp=s_tri, copy_programs_per_request=copy_programs, **kw_tri)

    assert torch.equal(ref.locations, tri.locations), (ref.locations, tri.locations)
    assert torch.equal(ref.counters, tri.counters), (ref.counters, tri.counters)
    assert torch.equal(ref.overflow, tri.overflow), (ref.overflow, tri.overflow)
    assert torch.equal(pos_ref["hot_pos"], pos_tri["hot_pos"])
    assert torch.equal(pos_ref["hot_lru"], pos_tri["hot_lru"])
    assert torch.equal(pos_ref["kv_pool"], pos_tri["kv_pool"])

    # ground truth: bytes at every returned location
    kv = pos_tri["kv_pool"]
    R, Q, K = st_.selections.shape
    sel = st_.selections
    loc = tri.locations
    n_valid = 0
    for r in range(R):
        for i in range(Q * K):
            p = int(sel[r].reshape(-1)[i])
            l_ = int(loc[r].reshape(-1)[i])
            if p < 0:
                assert l_ == rv.LOC_PAD
                continue
            n_valid += 1
            if l_ == rv.LOC_OVERFLOW:
                assert st_.staging_loc_base is None
                continue
            assert l_ >= 0
            assert torch.equal(kv[l_], st_.expected_row(r, p)), (r, i, p, l_)
    # every filled hot slot holds its row; untouched parts of the pool are unchanged
    hp = pos_tri["hot_pos"]
    for r in range(R):
        for s in range(st_.B):
            if hp[r, s] >= 0:
                assert torch.equal(
                    kv[int(st_.hot_loc_base[r]) + s], st_.expected_row(r, int(hp[r, s]))
                )
    # counters are a partition of the valid selections
    assert int(tri.counters[:, :3].sum()) == n_valid
    assert int(rv.host_bytes_moved(tri.counters, st_.rb)) == int(tri.counters[:, 3].sum()) * st_.rb
    if advance:
        st_.hot_pos, st_.hot_lru, st_.kv_pool = hp.clone(), pos_tri["hot_lru"].clone(), kv.clone()
    return ref, tri


def _scratch_clean(*extra):
    for ws in [*rv._WORKSPACES.values(), *extra]:
        if ws.scratch is not None:
            assert bool((ws.scratch == 0x7FFFFFFF).all()), "scratch not reset"
        assert int(ws.ctrl[0]) == 0 and int(ws.ctrl[1]) == 0, "tickets not re-armed"
        if ws.pflags is not None:  # pid roles: a flag left set would let the next call's copy
            # programs run before their resolver
            assert int(ws.pflags.abs().sum()) == 0 and int(ws.pdone.abs().sum()) == 0, (
                "flags not re-armed"
            )


# ----------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------


def _odd_state(Q: int, K: int, seed: int) -> State:
    """Three requests of odd history and tail lengths, a partly filled cache, some direct pages."""
    s = State(
        R=3,
        Q=Q,
        K=K,
        B=16,
        row_bytes=12,
        page_size=4,
        hist_lens=[30, 55, 17],
        tail_lens=[2, 1, 3],
        seed=seed,
        fill=0.6,
        direct=0.3,
    )
    s.draw_selections()
    return s


def test_basic_decode_odd_shapes():
    s = _odd_state(Q=1, K=9, seed=1)
    ref, tri = run_and_compare(s, stamp=100)
    assert int(tri.counters[:, 3].sum()) > 0
    _scratch_clean()


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_hot_rows_update_the_slot_tables_in_place(impl):
    """hot_rows: the slot state stays in a table of every slot, each request reads and writes
    its own row in place; the result is the call on gathered rows, other rows are untouched."""
    s = _odd_state(Q=2, K=7, seed=4)
    pos, kw = s.args()
    want = rv.resolve(**pos, stamp=77, impl="reference", **kw)
    rows = torch.tensor([5, 0, 3])  # a slot table of 7 rows, requests on rows 5, 0, 3
    g = torch.Generator().manual_seed(9)
    table_pos = torch.randint(-1, 40, (7, s.B), generator=g, dtype=torch.int32)
    table_lru = torch.randint(0, 50, (7, s.B), generator=g)
    pos2, kw2 = s.args()
    table_pos[rows], table_lru[rows] = pos2.pop("hot_pos"), pos2.pop("hot_lru")
    before_pos, before_lru = table_pos.clone(), table_lru.clone()
    got = rv.resolve(
        **pos2, hot_pos=table_pos, hot_lru=table_lru, stamp=77, impl=impl, hot_rows=rows, **kw2
    )
    assert torch.equal(got.locations, want.locations)
    assert torch.equal(got.counters, want.counters)
    assert torch.equal(table_pos[rows], pos["hot_pos"])
    assert torch.equal(table_lru[rows], pos["hot_lru"])
    assert torch.equal(pos2["kv_pool"], pos["kv_pool"])
    others = torch.tensor([1, 2, 4, 6])
    assert torch.equal(table_pos[others], before_pos[others])
    assert torch.equal(table_lru[others], before_lru[others])
    with pytest.raises(ValueError, match="hot_rows must be int64"):
        rv.resolve(**s.args()[0], stamp=78, impl=impl, hot_rows=rows[:2], **s.args()[1])


@pytest.mark.parametrize("copy_programs", [1, 3])
def test_verification_k41_row656_duplicates(copy_programs):
    s = State(
        R=3,
        Q=4,
        K=41,
        B=96,
        row_bytes=656,
        page_size=8,
        hist_lens=[200, 90, 150],
        tail_lens=[4, 4, 2],
        seed=2,
        fill=0.5,
        direct=0.25,
    )
    s.draw_selections(w_dup=2.0)
    ref, tri = run_and_compare(s, stamp=50, copy_programs=copy_programs)
    c = tri.counters
    # shared retrieval: fewer copies than selections of missing rows
    assert int(c[:, 3].sum()) < int(c[:, 2].sum())
    _scratch_clean()


def test_all_hit():
    s = State(
        R=3,
        Q=2,
        K=9,
        B=32,
        row_bytes=12,
        page_size=4,
        hist_lens=[60, 60, 40],
        tail_lens=[1, 1, 1],
        seed=3,
        fill=1.0,
    )
    s.draw_selections(w_hit=1, w_miss=0, w_direct=0, w_tail=0, w_pad=0)
    ref, tri = run_and_compare(s, stamp=33)
    assert int(tri.counters[:, 2].sum()) == 0 and int(tri.counters[:, 3].sum()) == 0
    assert int(tri.counters[:, 1].sum()) == 3 * 18


def test_all_miss_cold_cache():
    s = State(
        R=2,
        Q=1,
        K=17,
        B=32,
        row_bytes=656,
        page_size=4,
        hist_lens=[80, 100],
        tail_lens=[1, 1],
        seed=4,
        fill=0.0,
    )
    s.draw_selections(w_hit=0, w_miss=1, w_direct=0, w_tail=0, w_pad=0, w_dup=0.2)
    ref, tri = run_and_compare(s, stamp=7)
    assert int(tri.counters[:, 1].sum()) == 0
    # empty slots are taken first, in slot order: the victims are slots 0..m-1
    for r in range(2):
        m = int(tri.counters[r, 3])
        assert bool((s.hot_pos[r, :m] >= 0).all()) and bool((s.hot_pos[r, m:] == -1).all())


def test_b_equals_k_full_cache_lru_order():
    s = State(
        R=2,
        Q=1,
        K=16,
        B=16,
        row_bytes=12,
        page_size=2,
        hist_lens=[64, 40],
        tail_lens=[1, 2],
        seed=5,
        fill=1.0,
        lru_max=6,
    )
    s.draw_selections(w_hit=0.5, w_miss=1, w_direct=0, w_tail=0, w_pad=0, w_dup=0)
    old_lru = s.hot_lru.clone()
    old_pos = s.hot_pos.clone()
    ref, tri = run_and_compare(s, stamp=10)
    # victims are the unprotected slots with the smallest lru (ties: lower slot)
    for r in range(2):
        changed = (s.hot_pos[r] != old_pos[r]).nonzero().squeeze(1)
        kept_unsel = [sl for sl in range(16) if int(s.hot_lru[r, sl]) != 10]
        if len(changed) and kept_unsel:
            assert int(old_lru[r, changed].max()) <= min(int(old_lru[r, sl]) for sl in kept_unsel)


def test_empty_slots_are_victims_before_old_rows():
    """Empty slots go first even when their stale lru is larger than every filled slot's."""
    s = State(
        R=2,
        Q=1,
        K=6,
        B=16,
        row_bytes=12,
        page_size=4,
        hist_lens=[90, 70],
        tail_lens=[1, 1],
        seed=16,
        fill=0.5,
        lru_max=5,
    )
    empty = s.hot_pos < 0
    s.hot_lru[empty] = 1000 + torch.arange(int(empty.sum()))
    s.draw_selections(w_hit=0, w_miss=1, w_direct=0, w_tail=0, w_pad=0, w_dup=0)
    pos_before = s.hot_pos.clone()
    ref, tri = run_and_compare(s, stamp=2000)
    for r in range(2):
        assert torch.equal(
            s.hot_pos[r][~empty[r]], pos_before[r][~empty[r]]
        )  # no filled slot evicted
        n_new = int(tri.counters[r, 3])
        # all copies went to formerly empty slots, the lowest-index ones first
        new_slots = (empty[r] & (s.hot_pos[r] >= 0)).nonzero().squeeze(1)
        assert new_slots.numel() == n_new
        assert torch.equal(new_slots, empty[r].nonzero().squeeze(1)[:n_new])


def test_tail_only_skips_scan():
    s = State(
        R=3,
        Q=2,
        K=5,
        B=8,
        row_bytes=12,
        page_size=4,
        hist_lens=[20, 33, 9],
        tail_lens=[6, 6, 6],
        seed=6,
        fill=0.5,
        direct=0.5,
    )
    s.draw_selections(w_hit=0, w_miss=0, w_direct=1, w_tail=1, w_pad=0.2)
    before = (s.hot_pos.clone(), s.hot_lru.clone())
    ref, tri = run_and_compare(s, stamp=99)
    assert torch.equal(s.hot_pos, before[0]) and torch.equal(s.hot_lru, before[1])
    assert int(tri.counters[:, 1:].sum()) == 0


def test_newest_row_and_padding():
    s = State(
        R=2,
        Q=3,
        K=7,
        B=8,
        row_bytes=12,
        page_size=4,
        hist_lens=[25, 12],
        tail_lens=[1, 3],
        seed=7,
        fill=0.5,
    )
    s.draw_selections(w_pad=2.0, w_tail=1.0)
    # the newest row of each request appears in every query
    for r in range(2):
        s.selections[r, :, 0] = s.hist[r] + s.tail_len[r] - 1
    s.selections[1, 2] = -1  # a fully padded query
    run_and_compare(s, stamp=4)


def test_very_different_lengths_r5():
    s = State(
        R=5,
        Q=2,
        K=11,
        B=24,
        row_bytes=12,
        page_size=4,
        hist_lens=[3, 500, 40, 1000, 17],
        tail_lens=[1, 5, 2, 8, 1],
        seed=8,
        fill=0.7,
        direct=0.4,
    )
    s.draw_selections()
    run_and_compare(s, stamp=1000)
    _scratch_clean()


def test_direct_map_partially_ready_and_no_direct_table():
    s = State(
        R=3,
        Q=2,
        K=13,
        B=32,
        row_bytes=12,
        page_size=4,
        hist_lens=[100, 64, 80],
        tail_lens=[2, 2, 2],
        seed=9,
        fill=0.5,
        direct=0.5,
    )
    s.draw_selections(w_direct=3.0)
    ref, tri = run_and_compare(s, stamp=21, advance=False)
    assert int(tri.counters[:, 0].sum()) > 0
    # same selections without the direct map: those rows go through the hot cache / host
    ref2, tri2 = run_and_compare(s, stamp=21, use_direct=False, advance=False)
    assert int(tri2.counters[:, 0].sum()) < int(tri.counters[:, 0].sum())


@pytest.mark.parametrize("staging", [False, True])
def test_overflow_q4(staging):
    s = State(
        R=3,
        Q=4,
        K=8,
        B=8,
        row_bytes=12,
        page_size=4,
        hist_lens=[100, 100, 60],
        tail_lens=[1, 1, 1],
        seed=10,
        fill=0.5,
        staging=staging,
    )
    s.draw_selections(w_hit=0.3, w_miss=1, w_direct=0, w_tail=0.1, w_pad=0, w_dup=0.2)
    ref, tri = run_and_compare(s, stamp=300, copy_programs=2)
    assert int(tri.overflow.sum()) > 0
    if staging:
        assert bool((tri.locations != rv.LOC_OVERFLOW).all())
        assert torch.equal(tri.counters[:, 3], tri.counters[:, 3])
    else:
        assert int((tri.locations == rv.LOC_OVERFLOW).sum()) > 0
    # the cache cannot grow beyond B; protected hits + in-cache misses == B on overflow
    for r in range(3):
        if int(tri.overflow[r]) > 0:
            assert int((s.hot_lru[r] == 300).sum()) == s.B


@pytest.mark.parametrize("copy_programs", [1, 4])
def test_sequence_of_calls_state_evolves(copy_programs):
    """Several calls in a row on evolving state (stamps increase): the scratch is self-cleaning,
    the ticket counters re-arm and the epoch advances."""
    s = State(
        R=3,
        Q=2,
        K=10,
        B=16,
        row_bytes=20,
        page_size=4,
        hist_lens=[70, 45, 90],
        tail_lens=[2, 3, 1],
        seed=11,
        fill=0.3,
        direct=0.2,
    )
    for step in range(4):
        s.draw_selections(w_hit=1.0, w_miss=1.0)
        run_and_compare(s, stamp=500 + step, copy_programs=copy_programs)
        _scratch_clean()


@pytest.mark.parametrize("copy_programs,staging", [(2, False), (3, True)])
def test_early_copy_matches_the_reference(copy_programs, staging):
    """early_copy: the copy programs read their first tile of host rows before the victims are
    published and the resolver program copies nothing; same locations, state and bytes as the
    reference over a sequence of calls (more misses than one copy tile, overflow to staging).
    The interpreter runs programs one after another in ticket order, so this checks the tile split
    and the results, not the flag ordering (the sm_90a compile test checks the release / acquire
    instructions; bench_resolver --check and benchmarks/check_cuda_graph.py run it on the GPU)."""
    s = State(
        R=3,
        Q=4,
        K=8,
        B=8,
        row_bytes=20,
        page_size=4,
        hist_lens=[100, 100, 60],
        tail_lens=[1, 1, 1],
        seed=13,
        fill=0.5,
        staging=staging,
    )
    for step in range(3):
        s.draw_selections(w_hit=0.3, w_miss=1, w_direct=0, w_tail=0.1, w_pad=0.1, w_dup=0.2)
        ref, tri = run_and_compare(
            s, stamp=700 + step, copy_programs=copy_programs, early_copy=True, copy_rows=2
        )
        assert int(tri.counters[:, 3].sum()) > 2 * copy_programs  # several tiles per copy program
        _scratch_clean()
    with pytest.raises(ValueError, match="early_copy"):
        rv.resolve_triton(
            **s.args(True)[0],
            stamp=800,
            copy_programs_per_request=1,
            early_copy=True,
            **s.args(True)[1],
        )


@pytest.mark.parametrize(
    "copy_programs,early,staging",
    [(2, False, True), (4, False, False), (3, True, False), (4, True, True)],
)
def test_pid_roles_match_the_reference_and_re_arm(copy_programs, early, staging):
    """pid_roles: programs 0..R-1 resolve and the rest copy, with no ticket; each request's last copy
    program resets its flag and done counter, so every call starts from zero. Same results as the
    reference over a sequence of calls, and the per-request flags are zero after each call."""
    s = State(
        R=3,
        Q=4,
        K=8,
        B=8,
        row_bytes=20,
        page_size=4,
        hist_lens=[100, 100, 60],
        tail_lens=[1, 1, 1],
        seed=19,
        fill=0.5,
        staging=staging,
    )
    for step in range(3):
        s.draw_selections(w_hit=0.3, w_miss=1, w_direct=0, w_tail=0.1, w_pad=0.1, w_dup=0.2)
        ref, tri = run_and_compare(
            s,
            stamp=950 + step,
            copy_programs=copy_programs,
            pid_roles=True,
            early_copy=early,
            copy_rows=1,
        )
        assert int(tri.counters[:, 3].sum()) > copy_programs  # every copy program has rows to copy
        _scratch_clean()  # and the per-request flags are zero again
    # more waiting copy programs than multiprocessors could deadlock: such a call takes tickets
    assert not rv.copy_settings(64, 1, copy_programs_per_request=4, pid_roles=True, num_sms=132)[
        "pid_roles"
    ]
    assert rv.copy_settings(43, 1, copy_programs_per_request=4, pid_roles=True, num_sms=132)[
        "pid_roles"
    ]
    assert not rv.copy_settings(8, 1, copy_programs_per_request=1, pid_roles=True)["pid_roles"]


@pytest.mark.parametrize("copy_grid", [1, 4])
@pytest.mark.parametrize("Q", [1, 4])
def test_copy_grid_matches_the_reference(Q, copy_grid, monkeypatch):
    """copy_grid (the HiSparse baseline's fixed copy grid): one resolver program per request
    copies nothing, then a second launch of copy_grid programs copies every request's misses.
    Same results as the reference over a sequence of calls, plain decode and verification
    overflowing to staging, with a request without pending selections and one whose selections
    all hit. The workspace's copy counts are poisoned before each call, so a request whose count
    the resolver did not rewrite would copy rows that are not its misses."""
    K, B = (9, 16) if Q == 1 else (8, 8)
    if Q > 1:  # request blocks of 2: the tile numbering carries over from one block to the next
        monkeypatch.setattr(rv, "COPY_GRID_REQ_BLOCK", 2)
    s = State(
        R=3,
        Q=Q,
        K=K,
        B=B,
        row_bytes=20,
        page_size=4,
        hist_lens=[100, 70, 60],
        tail_lens=[1, 2, 1],
        seed=23,
        fill=0.5,
        direct=0.2,
        staging=Q > 1,
    )
    ws = rv.ResolverWorkspace("cpu").ensure(s.R, s.P * s.ps, Q * K)
    for step in range(3):
        s.draw_selections(w_hit=0.5, w_miss=1, w_direct=0.2, w_tail=0.1, w_pad=0.1, w_dup=0.2)
        if step == 1:  # request 1 selects one tail row: no scan, nothing to copy
            s.selections[1] = -1
            s.selections[1, 0, 0] = s.hist[1]
        if step == 2:  # request 2 selects only hot rows
            hot = s.hot_pos[2][s.hot_pos[2] >= 0]
            s.selections[2] = hot[torch.arange(Q * K) % hot.numel()].reshape(Q, K)
        ws.meta.fill_(Q * K)
        ws.mpos.zero_()
        ws.victims.zero_()
        ref, tri = run_and_compare(
            s, stamp=1100 + step, copy_grid=copy_grid, workspace=ws, copy_rows=1
        )
        copies = tri.counters[:, 3]
        assert int(copies.sum()) > copy_grid  # more copy tiles (one row each) than programs
        if step == 1:
            assert int(copies[1]) == 0 and int(tri.counters[1, 0]) == 1
        if step == 2:
            assert int(copies[2]) == 0 and int(tri.counters[2, 2]) == 0
            assert int(tri.counters[2, 1]) > 0
        if Q > 1:
            assert int(tri.overflow.sum()) > 0
        _scratch_clean(ws)


def test_copy_grid_rejects_copy_programs_and_early_copy():
    s = _odd_state(Q=1, K=9, seed=1)
    for bad, match in (
        (dict(copy_grid=4, copy_programs_per_request=2), "copy_programs_per_request"),
        (dict(copy_grid=4, early_copy=True), "early_copy"),
        (dict(copy_grid=4, pid_roles=True), "pid_roles"),
        (dict(copy_grid=0), "copy_grid must be >= 1"),
    ):
        with pytest.raises(ValueError, match=match):
            rv.resolve_triton(**s.args()[0], stamp=5, **bad, **s.args()[1])
    with pytest.raises(ValueError, match="copy_grid must be >= 1"):  # resolve passes it on
        rv.resolve(**s.args()[0], stamp=5, copy_grid=-1, **s.args()[1])
    assert rv.copy_settings(3, 1, copy_programs_per_request=1, copy_grid=4) == dict(
        copy_programs_per_request=1, early_copy=False, pid_roles=False, copy_grid=4
    )
    assert rv.copy_settings(3, 1)["copy_grid"] is None


@pytest.mark.parametrize("stride", [24, 32])
def test_padded_host_store_rows(stride):
    """A host store whose rows are padded (the 20-byte rows a column slice of a 24- or 32-byte wide
    store, as a sector- or line-aligned host layout would be): same results and bytes as the
    reference, which reads the same view; the padding is never copied."""
    s = State(
        R=3,
        Q=2,
        K=8,
        B=8,
        row_bytes=20,
        page_size=4,
        hist_lens=[100, 80, 60],
        tail_lens=[1, 1, 1],
        seed=23,
        fill=0.5,
    )
    wide = torch.full((s.host_pool.shape[0], stride), 0xEE, dtype=torch.uint8)
    wide[:, :20] = s.host_pool
    s.host_pool = wide[:, :20]
    assert s.host_pool.stride(0) == stride and not s.host_pool.is_contiguous()
    for step in range(2):
        s.draw_selections(w_hit=0.3, w_miss=1, w_direct=0.1, w_tail=0.1, w_pad=0.1, w_dup=0.2)
        run_and_compare(s, stamp=60 + step, copy_programs=2, copy_rows=2)
    bad = wide.clone()
    bad = bad.as_strided((wide.shape[0], 20), (17, 1))  # rows closer than row_bytes: refused
    with pytest.raises(ValueError, match="row stride"):
        rv.resolve_triton(**dict(s.args(True)[0], host_pool=bad), stamp=70, **s.args(True)[1])


def test_workspace_reuse_across_shapes():
    shapes = [(2, 1, 9, 8, 40), (5, 2, 5, 16, 200), (1, 3, 4, 4, 12)]
    for n, (R, Q, K, B, H) in enumerate(shapes):
        s = State(
            R=R,
            Q=Q,
            K=K,
            B=B,
            row_bytes=8,
            page_size=4,
            hist_lens=[H] * R,
            tail_lens=[1] * R,
            seed=20 + n,
            fill=0.5,
        )
        s.draw_selections()
        run_and_compare(s, stamp=40 + n, copy_programs=2)
    _scratch_clean()


def test_a_fixed_workspace_refuses_to_grow():
    """A backend's workspace is sized once and fixed: CUDA graphs hold its buffers' addresses,
    so a call asking for more rows, positions or selections fails loudly instead of moving
    them (a graph captured before would then read freed memory)."""
    ws = rv.ResolverWorkspace("cpu").ensure(4, 64, 16).fixed()
    scratch = ws.scratch
    assert ws.ensure(3, 64, 8) is ws and ws.scratch is scratch  # within its size: reused
    for grow in ((5, 64, 16), (4, 65, 16), (4, 64, 17)):
        with pytest.raises(RuntimeError, match="fixed at 4 requests"):
            ws.ensure(*grow)
    assert ws.scratch is scratch


def test_large_lru_values_many_radix_passes():
    s = State(
        R=2,
        Q=1,
        K=20,
        B=64,
        row_bytes=12,
        page_size=8,
        hist_lens=[300, 300],
        tail_lens=[1, 1],
        seed=12,
        fill=1.0,
    )
    g = torch.Generator().manual_seed(3)
    s.hot_lru = torch.randint(0, 1 << 50, (2, 64), generator=g, dtype=torch.int64)
    s.hot_lru[:, ::7] = 12345  # ties at a small value
    s.hot_lru[0, 5] = (1 << 59) - 2  # the largest lru below the largest allowed stamp
    s.draw_selections(w_hit=0.5, w_miss=1, w_direct=0, w_tail=0, w_pad=0)
    run_and_compare(s, stamp=(1 << 59) - 1)


@pytest.mark.parametrize(
    "tile,bits,scan,regs,rows",
    [
        (16, 1, 16, None, None),
        (16, 3, 32, None, 1),
        (32, 8, 1024, None, 4),
        (256, 4, 64, None, None),
        (16, 3, 128, True, 128),
        (16, 3, 128, False, 2),
        (16, 12, 128, True, 32),
        (32, 11, 16, None, None),
    ],
)
def test_radix_tile_and_digit_width_do_not_change_results(tile, bits, scan, regs, rows):
    """Victim selection with several tiles per pass (B = 100 > tile), odd digit widths, ties
    and a wide stamp range: the same victims as the reference for every setting, with the
    victim keys in registers (B fits one scan tile: scan >= 128, the default there) or in
    the workspace."""
    s = State(
        R=2,
        Q=2,
        K=24,
        B=100,
        row_bytes=12,
        page_size=8,
        hist_lens=[400, 300],
        tail_lens=[1, 2],
        seed=31,
        fill=0.9,
    )
    g = torch.Generator().manual_seed(4)
    s.hot_lru = torch.randint(0, 1 << 20, (2, 100), generator=g, dtype=torch.int64)
    s.hot_lru[:, ::5] = 777  # ties straddling the threshold
    s.draw_selections(w_hit=0.3, w_miss=1, w_direct=0, w_tail=0.1, w_pad=0.1)
    s2 = State(
        R=2,
        Q=2,
        K=24,
        B=100,
        row_bytes=12,
        page_size=8,
        hist_lens=[400, 300],
        tail_lens=[1, 2],
        seed=31,
        fill=0.9,
    )
    s2.hot_lru, s2.selections = s.hot_lru.clone(), s.selections.clone()
    run_and_compare(
        s2,
        stamp=1 << 21,
        radix_tile=tile,
        radix_bits=bits,
        scan_tile=scan,
        keys_in_registers=regs,
        copy_rows=rows,
    )
    with pytest.raises(ValueError, match="radix_bits"):
        rv.resolve_triton(**s.args(True)[0], stamp=1 << 22, radix_bits=13, **s.args(True)[1])
    with pytest.raises(ValueError, match="copy_rows"):
        rv.resolve_triton(**s.args(True)[0], stamp=1 << 22, copy_rows=3, **s.args(True)[1])
    with pytest.raises(ValueError, match="keys_in_registers"):
        rv.resolve_triton(
            **s.args(True)[0],
            stamp=1 << 22,
            scan_tile=64,
            keys_in_registers=True,
            **s.args(True)[1],
        )


def test_slots_already_stamped_with_the_calls_stamp():
    """Slots that hold lru == stamp before the call (stamps need not exceed every old lru) are
    candidate victims like any other: the keys rebuilt from the slot state must not take them for
    this call's hits (the scratch decides then), with the oldest stamps tied at the threshold."""
    s = State(
        R=2,
        Q=1,
        K=8,
        B=40,
        row_bytes=12,
        page_size=8,
        hist_lens=[300, 200],
        tail_lens=[1, 1],
        seed=37,
        fill=1.0,
        lru_max=20,
    )
    s.hot_lru = torch.randint(
        10, 20, (2, 40), generator=torch.Generator().manual_seed(5), dtype=torch.int64
    )
    s.hot_lru[:, ::5] = 7  # the oldest slots, so the victims: unless mistaken for this call's hits
    s.draw_selections(w_hit=0.3, w_miss=1, w_direct=0, w_tail=0, w_pad=0)
    for step in range(3):  # stamp 7, then again 7 (every hit slot now holds it), then 8
        run_and_compare(s, stamp=7 + step // 2, scan_tile=16, keys_in_registers=False)
        s.draw_selections(w_hit=0.5, w_miss=1, w_direct=0, w_tail=0, w_pad=0)


@pytest.mark.parametrize(
    "scan,regs,stages", [(128, None, 1), (16, False, 1), (16, False, 2), (32, False, 1)]
)
def test_scan_by_position_scratch_matches_the_bitmap(scan, regs, stages):
    """The scan's membership test either reads a bit per pending position or gathers the
    position scratch (the default below SCAN_WIDE_BATCH): the same locations and state as the
    reference either way, with
    duplicates across queries, tail and padding selections."""
    s = State(
        R=3,
        Q=2,
        K=24,
        B=100,
        row_bytes=12,
        page_size=8,
        hist_lens=[400, 300, 90],
        tail_lens=[1, 2, 3],
        seed=35,
        fill=0.9,
    )
    s.draw_selections(w_hit=0.5, w_miss=1, w_direct=0, w_tail=0.1, w_pad=0.1)
    for bitmap in (False, True):
        run_and_compare(
            s,
            stamp=1 << 21,
            scan_tile=scan,
            keys_in_registers=regs,
            pending_bitmap=bitmap,
            scan_stages=stages,
        )


def test_default_scan_tile_for_a_cache_larger_than_one_tile(monkeypatch):
    """B past SCAN_TILE takes SCAN_TILE_MULTI-slot tiles with the keys in the workspace (here
    scaled down: one tile would be 64 slots, B = 100 takes 16-slot tiles)."""
    monkeypatch.setattr(rv, "SCAN_TILE", 64)
    monkeypatch.setattr(rv, "SCAN_TILE_MULTI", 16)
    s = State(
        R=2,
        Q=2,
        K=24,
        B=100,
        row_bytes=12,
        page_size=8,
        hist_lens=[400, 300],
        tail_lens=[1, 2],
        seed=33,
        fill=0.9,
    )
    s.draw_selections(w_hit=0.3, w_miss=1, w_direct=0, w_tail=0.1, w_pad=0.1)
    run_and_compare(s, stamp=1 << 21, radix_bits=8)


def test_wide_batch_defaults_take_small_tiles_and_the_bitmap(monkeypatch):
    """The defaults for a batch past SCAN_WIDE_BATCH whose position scratch passes
    PENDING_BITMAP_BYTES (here scaled down): SCAN_TILE_MULTI-slot tiles and the pending bitmap,
    the same result as the reference, over a sequence of calls (the bitmap self-cleans)."""
    monkeypatch.setattr(rv, "SCAN_WIDE_BATCH", 2)
    monkeypatch.setattr(rv, "PENDING_BITMAP_BYTES", 0)
    monkeypatch.setattr(rv, "SCAN_TILE_MULTI", 32)
    s = State(
        R=3,
        Q=1,
        K=24,
        B=100,
        row_bytes=12,
        page_size=8,
        hist_lens=[400, 300, 200],
        tail_lens=[1, 2, 3],
        seed=37,
        fill=0.9,
    )
    for step in range(3):
        s.draw_selections(w_hit=0.5, w_miss=1, w_direct=0, w_tail=0.1, w_pad=0.1)
        run_and_compare(s, stamp=(1 << 21) + step, radix_bits=8)


def test_stamp_tensor_accumulate_and_out():
    s = State(
        R=2,
        Q=2,
        K=6,
        B=8,
        row_bytes=12,
        page_size=4,
        hist_lens=[30, 30],
        tail_lens=[1, 1],
        seed=13,
        fill=0.5,
    )
    s.draw_selections()
    run_and_compare(s, stamp=9, stamp_tensor=True)
    # accumulate into preallocated outputs
    pos, kw = s.args()
    loc = torch.empty((2, 2, 6), dtype=torch.int32)
    cnt = torch.full((2, 4), 5, dtype=torch.int64)
    ovf = torch.empty(2, dtype=torch.int32)
    res = rv.resolve(
        **pos, stamp=torch.tensor([10]), out=(loc, cnt, ovf), accumulate_counters=True, **kw
    )
    assert res.locations is loc and res.counters is cnt
    pos2, kw2 = s.args()
    ref = rv.resolve(**pos2, stamp=10, impl="reference", **kw2)
    assert torch.equal(cnt, ref.counters + 5) and torch.equal(loc, ref.locations)


@pytest.mark.parametrize("row_bytes", [1, 6, 12, 656])
def test_row_widths(row_bytes):
    s = State(
        R=2,
        Q=1,
        K=9,
        B=12,
        row_bytes=row_bytes,
        page_size=4,
        hist_lens=[50, 31],
        tail_lens=[1, 2],
        seed=14 + row_bytes,
        fill=0.4,
    )
    s.draw_selections()
    run_and_compare(s, stamp=3)


def test_empty_batch():
    s = State(R=1, Q=2, K=3, B=4, row_bytes=4, page_size=4, hist_lens=[10], tail_lens=[1], seed=17)
    pos, kw = s.args()
    for k in (
        "selections",
        "tail_start",
        "tail_loc",
        "hot_pos",
        "hot_lru",
        "hot_loc_base",
        "host_page_table",
    ):
        pos[k] = pos[k][:0]
    kw["direct_page_table"] = kw["direct_page_table"][:0]
    for impl in ("reference", "triton"):
        res = rv.resolve(**pos, stamp=1, impl=impl, **kw)
        assert res.locations.shape == (0, 2, 3) and res.counters.shape == (0, 4)


def test_reference_rejects_invalid_input():
    s = State(R=1, Q=1, K=4, B=4, row_bytes=4, page_size=4, hist_lens=[10], tail_lens=[2], seed=15)
    s.draw_selections()
    s.selections[0, 0, 0] = 10 + 5  # past the tail
    pos, kw = s.args()
    with pytest.raises(AssertionError):
        rv.resolve(**pos, stamp=1, impl="reference", **kw)
    s.selections[0, 0, 0] = 1
    s.hot_pos[0, :2] = 3  # duplicate hot position
    pos, kw = s.args()
    with pytest.raises(AssertionError):
        rv.resolve(**pos, stamp=1, impl="reference", **kw)
    with pytest.raises(TypeError):
        pos, kw = s.args()
        pos["hot_lru"] = pos["hot_lru"].to(torch.int32)
        rv.resolve(**pos, stamp=1, impl="triton", **kw)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    R=st.integers(1, 3),
    Q=st.integers(1, 3),
    K=st.integers(1, 12),
    B=st.integers(1, 20),
    ps=st.sampled_from([1, 2, 4]),
    rb=st.sampled_from([1, 4, 12]),
    fill=st.floats(0, 1),
    direct=st.floats(0, 0.8),
    staging=st.booleans(),
    copy_programs=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    weights=st.tuples(*[st.floats(0, 1)] * 6),
)
def test_property_kernel_matches_reference(
    R, Q, K, B, ps, rb, fill, direct, staging, copy_programs, seed, weights
):
    g = torch.Generator().manual_seed(seed)
    hist = torch.randint(1, 60, (R,), generator=g).tolist()
    tails = torch.randint(1, 4, (R,), generator=g).tolist()
    s = State(
        R=R,
        Q=Q,
        K=K,
        B=B,
        row_bytes=rb,
        page_size=ps,
        hist_lens=hist,
        tail_lens=tails,
        seed=seed,
        fill=fill,
        direct=direct,
        staging=staging,
        lru_max=4,
    )
    for step in range(2):
        s.draw_selections(*weights)
        run_and_compare(s, stamp=10 + step, copy_programs=copy_programs)


# ----------------------------------------------------------------------------------------
# compile-mode and benchmark-script checks (subprocesses)
# ----------------------------------------------------------------------------------------

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_AOT = r"""
import sys
from systems.kernels import resolver as rv
variants = [dict(), dict(HAS_DIRECT=False, HAS_STAGING=False, COPY_PROGRAMS=False, STAMP_IS_PTR=True, ACCUM=True),
            dict(word_type="i32", WORDS=3, WPAD=4, ROWS=64, QBLK=16, BBLK=16, RBLK=16),
            dict(REG_KEYS=True, BBLK=4096, QBLK=512, HAS_STAGING=False, COPY_PROGRAMS=False),
            dict(BITMAP=True), dict(BITMAP=True, REG_KEYS=True, BBLK=4096, QBLK=512), dict(SCAN_STAGES=2),
            dict(REG_KEYS=True, BBLK=4096, QBLK=512, HAS_STAGING=False, COPY_PROGRAMS=False, DIGIT=12, NBINS=4096),
            dict(EARLY=True), dict(TIMING=True),
            dict(REG_KEYS=True, BBLK=4096, QBLK=512, HAS_STAGING=False, COPY_PROGRAMS=False, TIMING=True),
            dict(HSTRIDE=84), dict(PID_ROLES=True),
            dict(PID_ROLES=True, EARLY=True, REG_KEYS=True, BBLK=4096, QBLK=512, HAS_STAGING=False),
            dict(DEFER_COPY=True, COPY_PROGRAMS=False)]
for v in variants:
    k = rv.aot_compile(90, **v)
    ptx = k.asm["ptx"]
    assert "bar.sync" in ptx and "atom.global" in ptx, v
    if v.get("COPY_PROGRAMS", True):
        assert "release" in ptx, "the flag handoff must publish with release"
        assert "acquire" in ptx, "copy programs must acquire their request's flag"
    if not v or v == dict(HSTRIDE=84):  # 656-byte rows, unpadded or 672 bytes apart
        assert "ld.global.v2.b64" in ptx, "row copy should use 16-byte loads"
    if v.get("DEFER_COPY"):
        assert "ld.global.v2.b64" not in ptx, "copy_grid: the resolver copies no rows"
    assert ("globaltimer" in ptx) == bool(v.get("TIMING")), "phase times are read only when asked"
for v in [dict(), dict(HSTRIDE=84), dict(word_type="i32", WORDS=3, WPAD=4, ROWS=64, HAS_STAGING=False, REQ_BLK=16)]:
    ptx = rv.aot_compile_copy(90, **v).asm["ptx"]
    if v.get("word_type", "i64") == "i64":
        assert "ld.global.v2.b64" in ptx, "the copy_grid copy should use 16-byte loads"
print("ok")
"""


@pytest.mark.slow
@needs_nvidia_backend
def test_kernel_compiles_for_sm90_without_gpu():
    """Compile the real kernel for Hopper in a non-interpreter process."""
    run_compiled(_AOT, timeout=240)


@pytest.mark.slow
def test_bench_script_cpu_dry_run(tmp_path):
    """benchmarks/bench_resolver.py end to end at toy sizes on CPU (--check included)."""
    out = tmp_path / "fig8.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(_ROOT, "benchmarks", "bench_resolver.py"),
            "--cpu-dry-run",
            "--check",
            "--out",
            str(out),
        ],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    import json

    summary = json.loads(out.read_text())
    assert summary["check"]["passed"]
    for k in (
        "host_path_gbps",
        "fit_r2",
        "nomiss_b4096_batch8_us",
        "nomiss_b4096_batch160_us",
        "miss77_b4096_batch8_us",
        "miss77_b4096_batch160_us",
    ):
        assert k in summary
    assert len(summary["fig8a"]["points"]) == 6


@pytest.mark.slow
def test_bench_script_ablation_of_the_miss_path(tmp_path):
    """--ablate-c times (c) with the host store in device memory and with one and three radix
    passes, each checked to copy every miss (toy sizes on CPU; the GPU run gives the times)."""
    out = tmp_path / "fig8.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(_ROOT, "benchmarks", "bench_resolver.py"),
            "--cpu-dry-run",
            "--skip",
            "a",
            "--ablate-c",
            "--sweep-copy-programs",
            "--sweep-scan",
            "64sbp2,64g",
            "--sweep-copy-rows",
            "32",
            "--sweep-radix",
            "4096:12",
            "--interleave",
            "1",
            "--sweep-kw",
            "copy_rows=2",
            # one program per request where a variant names no copy grid: the sweeps'
            # machinery is under test here, and the interpreter runs programs in turn
            "--copy-programs",
            "1",
            "--out",
            str(out),
        ],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    import json

    rows = [p for p in json.loads(out.read_text())["fig8c_points"] if p.get("ablate")]
    assert {p["ablate"] for p in rows} == {
        "baseline",
        "host_in_hbm",
        "stamps_1pass",
        "stamps_3pass",
        "l2_warm",
    }
    pts = json.loads(out.read_text())["fig8c_points"]
    assert any(p.get("keys_in_registers") is False and p.get("scan_stages") == 2 for p in pts)
    assert {p.get("copy_programs_per_request") for p in pts} >= {1, 2, 4, 8}
    assert any(p.get("copy_rows") == 32 for p in pts)
    assert any(p.get("radix_bits") == 12 for p in pts)
    inter = [p for p in pts if p.get("interleaved")]
    assert {p["variant"] for p in inter} == {"defaults", "copy_rows=2"} and len(
        {p["batch"] for p in inter}
    ) == 2
    assert len({p["batch"] for p in rows}) == 2 and all(p["us_median"] > 0 for p in rows)


def test_phase_summary_takes_the_slowest_request_per_phase():
    """bench_resolver --phase-times: per phase, the median over timings of the slowest request's
    time in it (a request that skipped a phase counts 0), and the slowest start-to-end time."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_resolver", os.path.join(_ROOT, "benchmarks", "bench_resolver.py")
    )
    br = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(br)
    names = ("start", "a", "b")
    # 3 timings x 2 requests x 3 boundaries (ns); request 1 skips phase b in the first timing
    t = torch.tensor(
        [
            [[0, 1000, 4000], [0, 2000, 2000]],
            [[0, 3000, 5000], [0, 1000, 2000]],
            [[0, 2000, 3000], [0, 1000, 9000]],
        ],
        dtype=torch.int64,
    )
    per, program = br.phase_summary(t, names)
    assert per == {"a": 2.0, "b": 3.0}  # a: max per timing 2, 3, 2; b: 3, 2, 8
    assert program == 5.0  # totals' maxima 4, 5, 9


def test_phase_times_needs_a_gpu():
    """phase_times reads the GPU's global timer: the interpreter refuses it with a clear error."""
    st_ = State(
        R=2, Q=1, K=8, B=16, row_bytes=16, page_size=4, hist_lens=[40, 50], tail_lens=[4, 4], seed=3
    )
    st_.draw_selections()
    pos, kw = st_.args()
    with pytest.raises(ValueError, match="global timer"):
        rv.resolve_triton(**pos, stamp=30, phase_times=torch.zeros((2, 8), dtype=torch.int64), **kw)
