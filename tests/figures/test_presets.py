"""The H200 presets (conf/model/glm53_h200.yaml, dsv41_h200.yaml) and their derivation
(figures/presets.py, docs/presets.md): they compose through the real Hydra configs, fit the
H200's memory, keep every derived quantity in its band, and the pool arithmetic is the engine's.
Nothing full-size is built: the presets are GPU-only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from figures import presets as P
from systems.engine.config import compose, resolve_engine_config
from systems.kv.base import KVConfig
from systems.kv.hisparse import HiSparseOptions
from systems.kv.registry import create_backend
from systems.spec.config import SpeculationConfig

PRESETS = list(P.DEPLOYMENTS)
SYSTEMS = ["resident", "hisparse", "adaptive_hisparse"]


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_with_its_overrides(preset):
    d = P.DEPLOYMENTS[preset]
    for system in [*SYSTEMS, d.spec_system]:
        spec = system == d.spec_system
        cfg = compose(["device=cpu", f"system={system}", *P.overrides(preset, speculative=spec)])
        e = resolve_engine_config(cfg)
        m = e.model
        assert m.name == preset
        assert m.max_context_len == d.max_context_len  # the YAML holds the deployment's context
        assert e.kv.max_running_requests == d.hierarchy_slots
        assert e.kv.kv_pool_gib == pytest.approx(
            P.memory(m, d, P.hot_cache_rows(preset))["kv_pool_gib"]
        )
        if system != "resident":
            assert e.kv.options.hot_cache_rows == P.hot_cache_rows(preset)
        if spec:
            assert (e.speculation.draft_layers, e.speculation.draft_dim) == (
                d.draft_layers,
                d.draft_dim,
            )
            assert e.speculation.drafter == d.drafter
        else:
            assert e.speculation is None


def test_geometry_follows_the_paper():
    glm, dsv = P.model_config("glm53_h200"), P.model_config("dsv41_h200")
    # GLM-like: 7 producers announce for 26 payload layers that keep their own rows (21 : 78)
    assert (len(glm.index_sources), glm.num_sources, glm.row_bytes) == (7, 26, 656)
    assert P.hot_cache_rows("glm53_h200") == 2 * glm.index_topk
    # DeepSeek-like: 8 selecting layers over 4 shared sources; B = 16k
    assert (dsv.num_selecting_layers, dsv.num_sources) == (8, 4)
    assert P.hot_cache_rows("dsv41_h200") == 16 * dsv.index_topk
    # the mini presets stay what the CPU tests use
    assert P.model_config("glm53_mini").hidden_size == 1024


@pytest.mark.parametrize("preset", PRESETS)
def test_derivation_in_band(preset):
    rows = P.derivation(preset)
    out = [(r.key, r.ours, r.band) for r in rows if not r.in_band]
    assert not out, f"{preset}: derived quantities out of their bands: {out}"
    by = {r.key: r for r in rows}
    assert by["hbm_share"].ours < 1.0  # the H200's 141 GB with pools, drafter, prefixes
    assert by["host_share"].ours <= P.HOST_USABLE  # pinned backing within 128 GiB
    lo, hi = P.PAPER_FIXED_SHARE
    # with a served step fit the band bounds the fit's share; the model's is shown unbounded
    bounded = "fixed_share_served" if P.step_fit(preset) else "fixed_share"
    assert lo <= by[bounded].ours <= hi
    assert (by["fixed_share"].band is None) == bool(P.step_fit(preset))
    assert by["drafter_share"].ours <= 0.05


def test_served_fit_carries_the_weights_to_a_share():
    """The served fit at its own weights gives back its measured share; more weight bytes add
    their read time to the load-independent part; weights_for_share inverts it."""
    fit = {"weights_bytes": 10e9, "intercept_ms": 3.0, "ms_per_request": 0.1}
    d = P.DSV  # batch 64: 6.4 ms of per-request cost

    class M:
        def __init__(self, w):
            self.w = w

        def weight_bytes(self, _):
            return self.w

    assert P.served_fixed_share(M(10e9), d, fit) == pytest.approx(3.0 / 9.4)
    extra = 4.22e12 * 2e-3  # 2 ms more of weight reads
    assert P.served_fixed_share(M(10e9 + extra), d, fit) == pytest.approx(5.0 / 11.4)
    for share in (0.3, 0.575, 0.65):
        w = P.weights_for_share(d, fit, share)
        assert P.served_fixed_share(M(w), d, fit) == pytest.approx(share)


def test_the_step_fit_file_is_table_1s_fit(tmp_path, monkeypatch):
    """--fit-step writes Table 1's fit of the committed runs with the weights the preset has."""
    import json

    from figures import table1

    monkeypatch.setattr(P, "step_fit_path", lambda preset: tmp_path / f"step-{preset}.json")

    class R:
        def __init__(self, name):
            self.path, self.repeats, self.commit = Path("/r") / name, [], "abc1234"

    monkeypatch.setattr(
        table1, "measured_fixed_share", lambda results, preset: (0.4, 2.0, 0.05, [R("x"), R("y")])
    )
    path, written = P.write_step_fit("dsv41_h200", Path("/r"))
    got = json.loads(path.read_text())
    assert got == written
    assert got["weights_bytes"] == P.model_config("dsv41_h200").weight_bytes(2)
    assert (got["intercept_ms"], got["ms_per_request"], got["runs"]) == (2.0, 0.05, ["x", "y"])
    assert got["commits"] == ["abc1234"]


def test_a_calibration_of_other_weights_is_not_the_presets(tmp_path):
    """A locality calibration is quoted only where it measured the preset's geometry (the
    random weights' shapes): one made before the FFN changed is named as due again."""
    import json

    m = P.model_config("dsv41_h200")
    geo = {"hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size}
    point = {"lambda": m.selection_locality, "b_over_k": 16, "host_share_pct": 9.9}
    cal = {"points": [point], "model_geometry": geo, "env": {"gpu": "NVIDIA H200"},
           "paper_host_share_pct": {"16": 9.5}}  # fmt: skip
    f = tmp_path / "locality-dsv41_h200-at16k.json"
    f.write_text(json.dumps(cal))
    got = P._locality_source("dsv41_h200", "dsv", tmp_path)
    assert got.startswith("calibrated on the NVIDIA H200: host share 9.9 % at B = 16k")
    cal["model_geometry"] = {**geo, "intermediate_size": 22528}
    f.write_text(json.dumps(cal))
    got = P._locality_source("dsv41_h200", "dsv", tmp_path)
    assert f"intermediate_size 22528 (now {m.intermediate_size})" in got
    assert "checked again" in got and "9.9" not in got


def test_glm_derivation_numbers():
    by = {r.key: r for r in P.derivation("glm53_h200")}
    assert by["slots"].ours == 52 and by["slots"].paper == 52
    assert by["spec_slots"].paper == 35 and 32 <= by["spec_slots"].ours <= 38
    assert by["round_over_step"].paper == pytest.approx(2.2)
    assert by["resident_over_offloaded"].paper == pytest.approx(10.3)
    assert by["k_over_context"].ours == pytest.approx(2048 / 100_000)
    # the step model's terms add up, and a round reads the weights once
    d, m = P.GLM, P.model_config("glm53_h200")
    step, rnd = P.step_ms(m, d, 1), P.step_ms(m, d, 4)
    assert step["total"] == pytest.approx(sum(v for k, v in step.items() if k != "total"))
    assert rnd["weights"] == step["weights"] and rnd["index_keys"] == step["index_keys"]
    assert rnd["selected_rows"] == pytest.approx(4 * step["selected_rows"])
    assert by["fixed_share"].ours == pytest.approx(step["weights"] / step["total"])


@pytest.mark.parametrize(
    "preset, change, key",
    [
        ("glm53_h200", {"intermediate_size": 3 * 7680}, "fixed_share"),  # weights 2x heavier
        ("glm53_h200", {"index_topk": 512}, "k_over_context"),
        ("glm53_h200", {"index_dim": 256}, "resident_over_offloaded"),
        # the served fit bounds DeepSeek's share: its old FFN left the fit's 35 %, a far wider
        # one passes the band's top
        ("dsv41_h200", {"intermediate_size": 22528}, "fixed_share_served"),
        ("dsv41_h200", {"intermediate_size": 4 * 73728}, "fixed_share_served"),
    ],
)
def test_an_edit_out_of_band_fails(preset, change, key):
    """The band check can fail: the derivation of an edited preset leaves its band."""
    m = dataclasses.replace(P.model_config(preset), **change)
    row = {r.key: r for r in P.derivation(preset, m)}[key]
    assert not row.in_band, (key, row.ours, row.band)


def test_doc_is_generated():
    """docs/presets.md is the module's output (make presets-doc), so it cannot drift."""
    assert P.DOC.read_text() == P.markdown(), "run make presets-doc"


# ------------------------------------------------------------------- the pool arithmetic
def _small(preset, **kw):
    return dataclasses.replace(P.model_config(preset), max_context_len=1024, **kw)


@pytest.mark.parametrize(
    "preset, topk, b_over_k, q_max",
    [("glm53_h200", 64, 2, 1), ("glm53_h200", 64, 2, 8), ("dsv41_h200", 32, 16, 8)],
)
def test_slot_bytes_is_the_backends(preset, topk, b_over_k, q_max):
    """slot_bytes / host_slot_bytes size a hierarchy slot as systems/kv/hisparse.py does: a pool
    of 5.5 slots holds 5, on a small model of the preset's layer structure."""
    m = _small(preset, index_topk=topk)
    B = b_over_k * topk
    per_slot = P.slot_bytes(m, B, q_max)
    kv = KVConfig(
        backend="hisparse",
        kv_pool_gib=5.5 * per_slot / P.GIB,
        max_running_requests=64,
        host_pool_gib=1.0,
        max_queries_per_step=q_max,
        options=HiSparseOptions(hot_cache_rows=B).resolved(m, "cpu", q_max),
    )
    be = create_backend(m, kv, "cpu")
    assert be.num_slots == 5
    assert be.host_pool.numel() == 5 * P.host_slot_bytes(m, B, q_max)


@pytest.mark.parametrize("running", [0, 2, 5])
def test_optional_capacity_is_the_adaptive_backends(running):
    """optional_capacity counts the payload pages and the lent pages of free slots' index
    history as systems/kv/adaptive.py builds them, on a small model of the GLM preset's layers
    with a hot cache per slot and a few spare pages."""
    from systems.kv.adaptive import AdaptiveOptions

    m = _small("glm53_h200", index_topk=16)
    B, slots = 16, 6  # a G-row unit of 21 KB: several per slot's 139 KB of index history
    per_slot = P.slot_bytes(m, B, 1)
    kv = KVConfig(
        backend="adaptive_hisparse",
        kv_pool_gib=(slots * per_slot + 9 * m.num_sources * (B + 16) * m.row_bytes) / P.GIB,
        max_running_requests=slots,
        host_pool_gib=1.0,
        options=AdaptiveOptions(hot_cache_rows=B).resolved(m, "cpu", 1),
    )
    be = create_backend(m, kv, "cpu")
    assert be.num_slots == slots and be.lent_slots
    busy = set(range(running))
    lendable = sum(1 for sl in be.lent_slots if not busy & set(sl))
    assert P.optional_capacity(m, B, be.capacity, slots, running) == (be.num_payload, lendable)


def test_resident_pages_are_the_backends():
    m = _small("glm53_h200", index_topk=64)
    per_token = m.num_sources * m.row_bytes + len(m.index_sources) * m.index_row_bytes
    kv = KVConfig(backend="resident", kv_pool_gib=0.05, max_running_requests=4)
    be = create_backend(m, kv, "cpu")
    assert be.pages.num_pages == int(0.05 * P.GIB) // (m.page_size * per_token)


def test_drafter_fixed_bytes_are_the_drafters():
    from systems.engine.config import model_config_from
    from systems.models.drafters import DRAFTERS
    from systems.models.sparse_model import SparseModel

    tiny = model_config_from(compose(["model=tiny"]).model, "cpu")
    target = SparseModel(tiny, torch.device("cpu"))
    spec = SpeculationConfig(draft_layers=2, draft_dim=32, window=128)
    d = dataclasses.replace(P.GLM, draft_layers=2, draft_dim=32, window=128)
    dr = DRAFTERS["dflash2"](
        target,
        num_layers=2,
        dim=32,
        window=spec.window,
        num_slots=3,
        page=tiny.page_size,
        k_max=spec.k_max,
        seed=0,
    )
    assert dr.fixed_bytes == P.drafter_fixed_elements(tiny, d, 3) * target.dtype.itemsize


def test_the_h200_experiments_run_their_preset_as_derived():
    """Every experiment on an H200 preset holds the pool, slots and host store the derivation
    gives (its YAML repeats them; a preset re-derived without its experiments would leave them
    stale)."""
    from omegaconf import OmegaConf

    exps = sorted(
        (Path(__file__).resolve().parents[2] / "conf" / "experiment").glob("*_h200*.yaml")
    )
    checked = 0
    for path in exps:
        cfg = compose([f"experiment={path.stem}"])
        preset = cfg.model.name
        if preset not in P.DEPLOYMENTS:
            continue
        want = dict(o.split("=", 1) for o in P.overrides(preset) if o.startswith("hardware."))
        got = {k: str(OmegaConf.select(cfg, k)) for k in want}
        assert got == want, path.stem
        checked += 1
    assert checked >= 10
