"""Census math on hand-made counter snapshots; geometry rows of Table 3."""

from __future__ import annotations

import pytest

from profiling import census as C
from systems.models.config import ModelConfig


def snap(**kw):
    base = {
        C.SELECTED: 0,
        C.DIRECT: 0,
        C.HOT: 0,
        C.FROM_HOST: 0,
        C.HOST_ROWS: 0,
        C.HOST_BYTES: 0,
        C.RESOLVER_CALLS: 0,
        C.BACKUP_ROWS: 0,
        C.TOKENS: 0,
        C.REQUESTS: 0,
        C.STEPS: 0,
    }
    base.update(kw)
    return base


def test_census_between_two_snapshots():
    a = snap(
        **{
            C.SELECTED: 1000,
            C.DIRECT: 600,
            C.HOT: 350,
            C.FROM_HOST: 50,
            C.HOST_ROWS: 40,
            C.HOST_BYTES: 40 * 656,
            C.RESOLVER_CALLS: 10,
            C.TOKENS: 5,
            C.REQUESTS: 1,
            C.STEPS: 5,
            C.BACKUP_ROWS: 3,
        }
    )
    b = snap(
        **{
            C.SELECTED: 1000 + 8192,
            C.DIRECT: 600 + 5710,
            C.HOT: 350 + 2478,
            C.FROM_HOST: 50 + 4,
            C.HOST_ROWS: 40 + 4,
            C.HOST_BYTES: (40 + 4) * 656,
            C.RESOLVER_CALLS: 10 + 32,
            C.TOKENS: 5 + 16,
            C.REQUESTS: 1 + 2,
            C.STEPS: 5 + 8,
            C.BACKUP_ROWS: 3 + 16,
        }
    )
    c = C.census(a, b, interval_s=2.0)
    assert c.tokens == 16 and c.requests == 2 and c.steps == 8
    assert c.row_lookups == 8192 and c.row_lookups_per_token == 512
    assert c.selections_per_token == 512  # no geometry: lookups as they are
    assert c.direct_share == pytest.approx(5710 / 8192)
    assert c.hot_share == pytest.approx(2478 / 8192)
    assert c.host_share == pytest.approx(4 / 8192)
    assert c.direct_share + c.hot_share + c.host_share == pytest.approx(1.0)
    assert c.host_bytes_per_token == pytest.approx(4 * 656 / 16)
    assert c.host_bytes_per_request == pytest.approx(4 * 656 / 2)
    assert c.bytes_per_copied_row == 656
    assert c.resolver_calls_per_step == 4
    assert c.follower_copies_per_step is None and c.follower_split == "none"
    assert c.backup_rows_per_token == 1
    assert c.interval_s == 2.0


def test_census_overrides_and_empty_divisors():
    b = snap(**{C.SELECTED: 10, C.DIRECT: 10, C.HOST_BYTES: 0})
    c = C.census(None, b, tokens=5, requests=0, steps=0)
    assert c.row_lookups_per_token == 2
    assert c.host_bytes_per_request is None and c.resolver_calls_per_step is None
    assert c.bytes_per_copied_row is None


def test_resident_backend_has_no_counters():
    c = C.census({C.TOKENS: 0}, {C.TOKENS: 10, C.STEPS: 10})
    assert c.row_lookups == 0 and c.host_share is None and c.host_bytes_per_token == 0


def test_counter_going_backwards_is_an_error():
    with pytest.raises(ValueError, match="backwards"):
        C.census(snap(**{C.TOKENS: 10}), snap(**{C.TOKENS: 5}))


def glm_like():
    return ModelConfig(
        name="g",
        index_topk=8,
        kv_dim=32,
        layer_roles=["full", "follower", "follower", "full", "follower"],
    )


def dsv_like():
    return ModelConfig(
        name="d",
        index_topk=8,
        kv_dim=32,
        layer_roles=["full", "reuse", "reindex", "reuse", "full", "reuse"],
        layer_sources=[0, 0, 0, 0, 1, 1],
    )


def test_geometry_glm_like():
    g = C.retrieval_geometry(glm_like(), hot_cache_rows=16)
    assert g.selecting_layers == 2 and g.selections_per_token == 16
    assert g.kv_sources == 5 and g.follower_layers == 3
    assert g.sources_per_selection == pytest.approx(2.5)  # (1+2) and (1+1) sources
    assert g.bytes_per_missed_selection == pytest.approx(2.5 * 64)
    assert g.resolver_calls_per_step == 2 and g.follower_copies_per_step == 3
    assert g.hot_cache_rows == 16 and g.hot_cache_bytes_per_session == 16 * 64 * 5


def test_geometry_deepseek_like():
    g = C.retrieval_geometry(dsv_like(), hot_cache_rows=32)
    assert g.selecting_layers == 3 and g.kv_sources == 2
    assert g.sources_per_selection == 1.0  # reuse/reindex read the shared source
    assert g.follower_copies_per_step == 0
    assert g.hot_cache_rows == 32


def test_geometry_scales_lookups_to_producer_selections():
    g = C.retrieval_geometry(glm_like(), hot_cache_rows=16)
    # per token every resolver call (2 producers + 3 followers) looks up k = 8 rows
    a = snap()
    b = snap(
        **{C.SELECTED: 10 * 5 * 8, C.DIRECT: 400, C.RESOLVER_CALLS: 50, C.TOKENS: 10, C.STEPS: 10}
    )
    c = C.census(a, b, geometry=g)
    assert c.row_lookups_per_token == 40
    assert c.selections_per_token == 16  # = geometry's selections per token
    assert c.follower_split == "geometry"
    assert c.resolver_calls_per_step == 2 and c.follower_copies_per_step == 3


def test_follower_counter_wins_over_geometry():
    g = C.retrieval_geometry(glm_like(), hot_cache_rows=16)
    b = snap(**{C.RESOLVER_CALLS: 50, C.FOLLOWER_COPIES: 20, C.STEPS: 10})
    c = C.census(snap(**{C.FOLLOWER_COPIES: 0}), b, geometry=g)
    assert c.follower_split == "counter"
    assert c.follower_copies_per_step == 2 and c.resolver_calls_per_step == 3


def test_collector_and_series():
    t = [100.0]
    state = snap()

    def read():
        return dict(state)

    col = C.CensusCollector(read, interval_s=1.0, clock=lambda: t[0])
    col.start()
    for i in range(1, 4):
        t[0] += 0.5
        state[C.TOKENS] += 4
        state[C.SELECTED] += 40
        state[C.FROM_HOST] += i
        col.step()  # rate-limited: samples at 101.0 and 102.0 only
    assert [s["ts"] for s in col.samples] == [100.0, 101.0]
    col.sample()
    assert len(col.samples) == 3
    res = col.result()
    assert res.tokens == 12 and res.host_rows == 6 and res.interval_s == 1.5
    series = col.series()
    assert [r["tokens"] for r in series] == [8, 4]
    assert series[0]["ts"] == 101.0
