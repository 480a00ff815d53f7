"""The prefix cache (DHS_PREFIX_CACHE, systems/disk_cache.py): a server start loads a prompt's
prefill saved by an earlier one, byte for byte, and serves the golden tokens from it."""

import json
from pathlib import Path

import pytest
import torch

import systems.kv.backends  # noqa: F401
from systems.engine.prefill import PrefixStore
from systems.models.config import ModelConfig
from systems.models.sparse_model import SparseModel
from tests.helpers import SMALL_MODEL as SMALL
from tests.helpers import make_engine, run_greedy

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "tiny_greedy.json").read_text())


def _same(a, b) -> bool:
    ka, kb = a.prefix, b.prefix
    return (
        ka.num_tokens == kb.num_tokens
        and torch.equal(ka.kv, kb.kv)
        and ka.index.keys() == kb.index.keys()
        and all(torch.equal(ka.index[s], kb.index[s]) for s in ka.index)
        and torch.equal(a.last_logits, b.last_logits)
        and torch.equal(a.last_logits_host, b.last_logits_host)
        and torch.equal(a.tail_hidden, b.tail_hidden)
    )


def test_a_saved_prefill_is_loaded_byte_for_byte(tmp_path, monkeypatch):
    model = SparseModel(ModelConfig(**SMALL))
    prompt, other = list(range(1, 30)), list(range(2, 31))
    computed, _ = PrefixStore(model, keep_hidden=4).get(prompt)  # cache off
    monkeypatch.setenv("DHS_PREFIX_CACHE", str(tmp_path))
    first = PrefixStore(model, keep_hidden=4)
    first.get(prompt)  # computed and saved
    assert (first.num_prefills, first.num_loads) == (1, 0)
    assert len(list(tmp_path.glob("prefix-*.pt"))) == 1

    second = PrefixStore(model, keep_hidden=4)  # a later server start
    loaded, now = second.get(prompt)
    assert (second.num_prefills, second.num_loads) == (0, 1) and now
    assert _same(computed, loaded)
    # a drafter keeping a shorter tail reads the same file; another prompt is prefilled anew
    short = PrefixStore(model, keep_hidden=2)
    tail2, _ = short.get(prompt)
    assert short.num_loads == 1 and torch.equal(tail2.tail_hidden, computed.tail_hidden[-2:])
    second.get(other)
    assert second.num_prefills == 1 and len(list(tmp_path.glob("prefix-*.pt"))) == 2
    # other model settings (here the selection locality, which the prompt's KV may not even
    # depend on) never read a file saved under another config
    moved = SparseModel(ModelConfig(**{**SMALL, "selection_locality": 0.5}))
    again = PrefixStore(moved, keep_hidden=4)
    again.get(prompt)
    assert (again.num_prefills, again.num_loads) == (1, 0)


@pytest.mark.parametrize(
    "system", ["resident", "hisparse", "adaptive_hisparse", "adaptive_dhisparse"]
)
def test_served_tokens_from_cached_prefills_are_the_golden_ones(system, tmp_path, monkeypatch):
    monkeypatch.setenv("DHS_PREFIX_CACHE", str(tmp_path))
    n = len(GOLDEN["prompts"])
    for start in range(2):  # the first start saves the prefills, the second loads them
        spec = ["system.speculation.window=64"] if "dhisparse" in system else []
        eng = make_engine("model=tiny", f"system={system}", "hardware.kv_pool_gib=0.01", *spec)
        outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
        assert outs == GOLDEN["outputs"]["tiny"]
        loads = eng.metrics()["dhs_num_prefix_loads_total"]
        assert (eng.prefixes.num_prefills, loads) == ((n, 0) if start == 0 else (0, n))
