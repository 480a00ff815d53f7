"""benchmarks/check_gemm_invariance.py measures the shapes the model really multiplies by."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from check_gemm_invariance import layer_shapes  # noqa: E402

from tests.helpers import make_engine  # noqa: E402


def test_layer_shapes_are_the_models_weights():
    """The GPU fuses each layer's input projections and the MLP's gate and up (the CPU keeps
    them apart): the fused shapes of the tiny model's drawn weights."""
    eng = make_engine("model=tiny")
    m = eng.model
    layers = [dict(p) for p in m.layers]
    for p in layers:
        type(m)._fuse_weights(p)
    got = {tuple(p["w_in"].shape) for p in layers}
    shapes = layer_shapes(eng.cfg.model)
    assert got == {shapes["w_in full"], shapes["w_in follower"]}
    for name in ("wo", "w13", "w2"):
        assert {tuple(p[name].shape) for p in layers} == {shapes[name]}
    assert tuple(m.lm_head.shape) == shapes["lm_head"]
