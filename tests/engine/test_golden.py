"""Every registered KV backend reproduces the resident backend's golden greedy tokens."""

import json
from pathlib import Path

import pytest

from systems.kv.registry import available, create_backend  # noqa: F401
import systems.kv.backends  # noqa: F401
from tests.helpers import make_engine, run_greedy

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "tiny_greedy.json").read_text())
BACKENDS = available()


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_reproduces_golden_tokens(backend, model):
    eng = make_engine(f"model={model}", f"system.kv_backend={backend}",
                      "hardware.kv_pool_gib=0.01")
    outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
    assert outs == GOLDEN["outputs"][model]
    eng.backend.check_integrity()
    assert eng.backend.is_empty
