"""Capacity accounting (figures/capacity.py): Table 1 of the paper from its GLM-5.3 geometry,
eqs. (9)-(11), pool arithmetic, and the geometry of our presets.

With the derivation in the module docstring (576-byte accounting rows, 21 x 132-byte index keys,
page-rounded histories, "100K" = 100,000 and "32K" = 32,768 tokens of context) every cell of
Table 1 is reproduced to the printed three decimals, so the 2 % tolerance of the brief is met with
room to spare. Residuals that remain: Table 3's 4.2 MB host bytes per token at the largest GLM
budget comes out at 4.09 MB (2.7 %: the paper's 3.9 % miss rate is rounded), the "about 950"
host sessions at 957 and the 0.93 TB host backup at 0.935 TB.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from figures import capacity as cap
from figures.paper_values import PAPER
from systems.models.config import ModelConfig

GIB = cap.GIB
T1 = PAPER["table1"]
SYS = {
    "resident": "resident",
    "hisparse": "hisparse",
    "adaptive_hisparse": "adaptive_hisparse",
    "resident_drafter": "resident_dflash2",
    "adaptive_dhisparse": "adaptive_dhisparse",
}


@pytest.fixture(scope="module")
def glm():
    return cap.paper_glm53_geometry()


def test_table1_every_cell(glm):
    table = cap.table1(glm)
    n = 0
    for meth, row in table.items():
        paper = T1[SYS[meth]]
        for col in ("gpu_32k", "gpu_100k", "host_100k"):
            if col not in paper:  # the resident rows have no host backup ("-")
                assert col == "host_100k" and row[col] is None
                continue
            ours = row[col]
            assert ours == pytest.approx(float(paper[col]), rel=0.02), (meth, col)
            assert round(ours, 3) == pytest.approx(float(paper[col]), abs=1e-9), (meth, col, ours)
            n += 1
    assert n == 13  # 5 x 2 GPU cells + 3 host cells


def test_resident_has_no_host_backup(glm):
    assert cap.table1(glm)["resident"]["host_100k"] is None
    assert cap.session_memory(glm, "resident_dflash2", 100_000).host_backup == 0


def test_components_and_ratio(glm):
    sm = cap.session_memory(glm, "adaptive_dhisparse", 100_000)
    assert set(sm.components) == {
        "index_keys",
        "hot_cache",
        "tail",
        "metadata",
        "draft_ring",
        "staging_share",
    }
    assert sm.components["hot_cache"] == 4096 * 78 * 576 == 184_025_088  # Table 3: 184 MB
    res = cap.session_memory(glm, "resident", 100_000).gpu_required
    ada = cap.session_memory(glm, "adaptive_hisparse", 100_000).gpu_required
    assert res / ada == pytest.approx(10.3, abs=0.05)
    # ring + staging share: "0.060 GiB of required GPU state per session"
    assert cap.spec_state_gib_per_session(glm) == pytest.approx(0.060, abs=5e-4)
    # "the ring adds 0.025 GiB per session at 32K and at 100K alike"
    for t in (32_768, 100_000):
        c = cap.session_memory(glm, "adaptive_dhisparse", t).components
        assert c["draft_ring"] / GIB == pytest.approx(0.025, abs=5e-4)


def test_ring_size_eq9():
    assert cap.ring_rows(2048, 64, 8) == 2176
    # "a page-rounded size that also covers the six- and four-query blocks"
    assert cap.ring_rows(2048, 64, 6) <= 2176 and cap.ring_rows(2048, 64, 4) <= 2176
    g = cap.paper_glm53_geometry()
    assert g.ring_rows * g.draft.bytes_per_row * 35 / GIB == pytest.approx(0.87, abs=0.005)


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(0, 5000),
    page=st.sampled_from([1, 16, 64, 128]),
    k_max=st.integers(1, 16),
    n=st.integers(0, 10**6),
    slot=st.integers(0, 50),
    other=st.integers(0, 50),
)
def test_ring_never_aliases_live_positions(window, page, k_max, n, slot, other):
    r_d = cap.ring_rows(window, page, k_max)
    assert r_d % page == 0
    assert window + page - 1 + k_max <= r_d < window + page - 1 + k_max + page
    # live positions of a request: the drafter's window before the block start n (aligned down to
    # a page, which adds at most p - 1 positions) and the current block of up to K_max positions
    start = max(0, (max(0, n - window) // page) * page)
    live = range(start, n + k_max)
    assert len(live) <= r_d
    addrs = [cap.ring_address(slot, t, r_d) for t in live]
    assert len(set(addrs)) == len(addrs)  # no two live positions share a row
    assert all(slot * r_d <= a < (slot + 1) * r_d for a in addrs)  # slots own disjoint ranges
    if other != slot:
        a_other = cap.ring_address(other, n, r_d)
        assert not (slot * r_d <= a_other < (slot + 1) * r_d)


def test_staging_eq11(glm):
    m = cap.staging_bytes(chi=4, slots=35, k_max=8, topk=2048, row_bytes=576)
    assert m == 4 * 35 * 8 * 2048 * 576
    assert m / GIB == pytest.approx(1.23, abs=0.005)
    dedicated = cap.staging_gib_per_gpu(glm, 35, chi=78)
    assert dedicated == pytest.approx(24.0, abs=0.05)
    assert dedicated / cap.staging_gib_per_gpu(glm, 35) == pytest.approx(19.5)
    # linear in every factor; the per-session share does not depend on N
    assert cap.staging_bytes(8, 35, 8, 2048, 576) == 2 * m
    share = cap.session_memory(glm, "adaptive_dhisparse", 1).components["staging_share"]
    assert share * 35 == m


def test_pools_and_host(glm):
    assert cap.index_pool_histories(5.37e6, 100_000, 2048, 64) == 52
    assert cap.index_pool_histories(3.72e6, 100_000, 2048, 64) == 36
    g = lambda m: cap.session_memory(glm, m, 100_000).gpu_required  # noqa: E731
    assert cap.sessions_per_gpu(52 * g("adaptive_hisparse"), g("resident")) == 5
    assert cap.sessions_per_gpu(35 * g("adaptive_dhisparse"), g("resident_dflash2")) == 3
    assert cap.sessions_per_gpu(10 * GIB, 1 * GIB, fixed_bytes=2.5 * GIB) == 7
    host = cap.session_memory(glm, "hisparse", 100_000).host_backup
    assert 208 * host / 1e12 == pytest.approx(0.93, abs=0.01)
    assert 4.3e12 / host == pytest.approx(950, rel=0.02)


def test_retrieval_volume_table3():
    g = cap.paper_glm53_geometry()
    rv = cap.retrieval_volume(g)
    assert rv["selections_per_token"] == 43_008
    assert 2400 <= rv["bytes_per_missed_selection"] <= 2500
    assert rv["follower_copies_per_step"] == 57 and rv["resolver_calls_per_step"] == 21
    assert cap.host_bytes_per_token(g, 0.33) / 1e6 == pytest.approx(34, rel=0.03)
    assert cap.host_bytes_per_token(g, 0.039) / 1e6 == pytest.approx(4.2, rel=0.03)
    d = cap.paper_dsv41_geometry()
    rd = cap.retrieval_volume(d)
    assert rd["selections_per_token"] == 4096 and rd["bytes_per_missed_selection"] == 288
    assert rd["hot_cache_bytes_per_session"] / 1e6 == pytest.approx(6, rel=0.03)
    assert cap.host_bytes_per_token(d, 0.36) / 1e6 == pytest.approx(0.42, rel=0.03)
    assert cap.host_bytes_per_token(d, 0.095) / 1e6 == pytest.approx(0.11, rel=0.03)


def test_geometry_from_model_config():
    cfg = ModelConfig()  # tiny: full, follower, full, follower; bf16 rows of 64 bytes
    g = cap.geometry_from_model(cfg, hot_cache_rows=16)
    assert (g.payload_sources, g.index_producers, g.row_bytes, g.index_row_bytes) == (4, 2, 64, 32)
    assert g.hot_cache_rows == (16,) * 4
    assert g.chi == 2
    t = 500
    rows = math.ceil(t / cfg.page_size) * cfg.page_size
    res = cap.session_memory(g, "resident", t)
    assert res.gpu_required == rows * (4 * 64 + 2 * 32)
    hs = cap.session_memory(g, "hisparse", t)
    assert hs.host_backup == rows * 4 * 64
    assert hs.gpu_required == rows * 2 * 32 + 4 * 16 * 64 + cfg.page_size * 4 * 64


def test_presets_keep_the_paper_ratio():
    g = cap.preset_geometry("glm53_mini")
    assert g.row_bytes == 656 and g.payload_sources == 26 and g.index_producers == 7 and g.chi == 4
    r = (
        cap.session_memory(g, "resident", 32_768).gpu_required
        / cap.session_memory(g, "adaptive_hisparse", 32_768).gpu_required
    )
    assert 5 < r < 20  # docs/design.md: about 10x, as Table 1
    assert g.hot_cache_rows[0] == 2 * 512  # fig4's B: 2k
    d = cap.preset_geometry("dsv41_mini")
    assert d.payload_sources == 4 and d.chi == 1
    assert d.hot_cache_rows[0] == 16 * 128  # fig5's B: 16k


def test_bad_input():
    with pytest.raises(ValueError):
        cap.canonical_method("nope")
    with pytest.raises(ValueError):
        cap.KVGeometry("x", 2, 1, 576, 132, 8, (16,), 64, 1)
    with pytest.raises(ValueError):
        cap.ring_rows(10, 0, 8)
