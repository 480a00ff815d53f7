"""The typed configuration: one resolve, defaults in one place, unknown keys named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from systems.engine.config import CONF_DIR, compose, resolve_engine_config
from systems.engine.engine import Engine, EngineConfig
from systems.kv.adaptive import AdaptiveOptions
from systems.kv.base import KVOptions
from systems.kv.hisparse import HiSparseOptions
from systems.kv.registry import available, options_class
from systems.spec.config import SpeculationConfig

SYSTEMS = sorted(p.stem for p in (CONF_DIR / "system").glob("*.yaml"))


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("system", SYSTEMS)
def test_yaml_lists_the_dataclass_defaults(system):
    """The YAML files show every knob; the dataclasses own the defaults: the two agree."""
    cfg = compose([f"system={system}"])
    kv = cfg.system.get("kv")
    kv = OmegaConf.to_container(kv, resolve=True) if kv is not None else {}
    cls = options_class(cfg.system.kv_backend)
    assert kv == {k: v for k, v in _defaults(cls).items() if k in kv}
    assert set(kv) == set(_defaults(cls)), "a knob of the backend is missing from its YAML"
    spec = cfg.system.get("speculation")
    if spec is not None:
        spec = OmegaConf.to_container(spec, resolve=True)
        d = _defaults(SpeculationConfig)
        # a DSpark system picks a larger block; everything else is the default
        assert {k: v for k, v in spec.items() if k not in ("drafter", "block_size")} == {
            k: d[k] for k in spec if k not in ("drafter", "block_size")
        }


def test_engine_section_matches_engine_config_defaults():
    eng = OmegaConf.to_container(compose([]).engine, resolve=True)
    d = _defaults(EngineConfig)
    assert eng == {k: d[k] for k in eng}


def test_every_backend_declares_options():
    for name in available():
        assert issubclass(options_class(name), KVOptions)
        assert dataclasses.is_dataclass(options_class(name))
        assert options_class(name).__dataclass_params__.frozen


def test_resolve_fills_auto_values_once():
    e = resolve_engine_config(compose(["device=cpu", "system=adaptive_dhisparse"]))
    o = e.kv.options
    assert isinstance(o, AdaptiveOptions)
    assert o.hot_cache_rows == 2 * e.model.index_topk  # 0 means 2k
    assert o.resolver_impl == "reference" and o.tail_rows == max(2 * 8, 16)
    assert e.kv.max_queries_per_step == e.speculation.k_max == 8
    assert e.speculation.scheduler_confidence == "drafter"
    assert e.speculation.calibrated_emitted_per_round == pytest.approx(2.88)
    assert e.speculation.window <= e.model.max_context_len
    assert e.model.dtype == "float32"
    assert o.resolved(e.model, "cpu", 8) == o  # resolving again changes nothing


def test_experiment_sets_b_for_its_hierarchy_systems_only():
    cfg = compose(["experiment=fig5", "system=hisparse", "device=cpu"])
    assert cfg.system.kv.hot_cache_rows == 2048
    cfg = compose(["experiment=fig5", "system=resident", "device=cpu"])
    assert "kv" not in cfg.system


@pytest.mark.parametrize(
    "override, match",
    [
        (
            "+system.kv.bogus=1",
            r"system.kv: unknown key\(s\) \['bogus'\] for backend 'hisparse'; "
            r"allowed: \['hot_cache_rows'",
        ),
        ("+system.kv.reclaim_order=oldest_first", r"unknown key\(s\) \['reclaim_order'\]"),
        ("system.kv.hot_cache_rows=4", r"hot_cache_rows=4 must be >= k"),
        ("system.kv.resolver_impl=cuda", r"system.kv.resolver_impl: must be one of"),
        ("+engine.max_wait=3", r"engine: unknown field\(s\) \['max_wait'\]"),
        ("+model.hot_cache_rows=16", r"model.hot_cache_rows: B is a KV-policy knob now"),
        ("model.gemm_impl=cutlass", r"model.gemm_impl: must be one of cublas, triton"),
        ("system.kv.hot_cache_rows=abc", r"system.kv.hot_cache_rows: expected int, got 'abc'"),
        ("engine.overlap_schedule=maybe", r"engine.overlap_schedule: expected bool"),
        ("hardware.kv_pool_gib=lots", r"hardware.kv_pool_gib: expected float, got 'lots'"),
    ],
)
def test_bad_keys_are_named(override, match):
    with pytest.raises(ValueError, match=match):
        resolve_engine_config(compose(["device=cpu", "system=hisparse", override]))


@pytest.mark.parametrize("group", ["system", "hardware", "server", "logger", "profile"])
def test_unknown_keys_of_the_config_groups_are_named(group):
    """A key no option of the group has (a typo, a knob of another group) stops the run."""
    from systems.engine.config import check_known_keys

    cfg = compose(["device=cpu", "system=hisparse", f"+{group}.kv_pool=1"])
    with pytest.raises(ValueError, match=rf"unknown {group} key\(s\) \['kv_pool'\]"):
        check_known_keys(cfg)
    check_known_keys(compose(["device=cpu", "system=adaptive_dhisparse", "server=sglang"]))
    # a key the code reads where given, which no option lists (docs/profiling.md's)
    check_known_keys(compose(["profile=host", "+profile.switch_interval_ms=0.2"]))


def test_speculation_keys_on_a_system_without_speculation_are_refused():
    """+system.speculation.block_size=4 on hisparse would turn speculation on (the default
    drafter) in runs named hisparse."""
    with pytest.raises(ValueError, match=r"set without a drafter: this system has no spec"):
        resolve_engine_config(
            compose(["device=cpu", "system=hisparse", "+system.speculation.block_size=4"])
        )


def test_bad_speculation_knobs_are_named():
    with pytest.raises(ValueError, match=r"system.speculation: unknown field\(s\) \['blok'\]"):
        resolve_engine_config(
            compose(["device=cpu", "system=resident_dflash2", "+system.speculation.blok=4"])
        )
    with pytest.raises(ValueError, match=r"system.speculation.block_size: 9 must be in"):
        resolve_engine_config(
            compose(["device=cpu", "system=resident_dflash2", "system.speculation.block_size=9"])
        )
    with pytest.raises(ValueError, match=r"system.speculation.acceptance: must be one of"):
        resolve_engine_config(
            compose(
                ["device=cpu", "system=resident_dflash2", "system.speculation.acceptance=maybe"]
            )
        )


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        HiSparseOptions().hot_cache_rows = 3  # type: ignore[misc]


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_system_starts_on_cpu_with_make_runs_defaults(system):
    """`make run ARGS="system=..."` composes experiment=default_cpu: every system builds."""
    cfg = compose(["experiment=default_cpu", f"system={system}"])
    eng = Engine(resolve_engine_config(cfg))
    assert eng.backend.num_slots >= 1
    eng.backend.check_integrity()


def test_conf_and_code_cite_no_b_on_the_model():
    for p in (CONF_DIR / "model").glob("*.yaml"):
        assert "hot_cache_rows" not in OmegaConf.to_container(OmegaConf.load(p)), p.name
    assert Path(CONF_DIR).is_dir()


def test_a_device_this_machine_lacks_is_an_error_unless_the_engine_runs_elsewhere():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    cfg = compose(["device=cuda"])
    with pytest.raises(ValueError, match="device=cuda: this machine has no CUDA GPU"):
        resolve_engine_config(cfg)
    assert resolve_engine_config(cfg, check_device=False).device == "cuda"  # SGLang's machine
    with pytest.raises(ValueError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_engine_config(compose(["device=tpu"]), check_device=False)
