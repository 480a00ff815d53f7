"""The prefix cache (DHS_PREFIX_CACHE, systems/disk_cache.py): a server start loads a prompt's
prefill saved by an earlier one, byte for byte, and serves the golden tokens from it."""

import json
from pathlib import Path

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
    saved, _ = first.get(prompt)
    assert (first.num_prefills, first.num_loads) == (1, 0)
    assert len(list(tmp_path.glob("prefix-*.pt"))) == 1 and _same(computed, saved)

    second = PrefixStore(model, keep_hidden=4)  # a later server start
    loaded, now = second.get(prompt)
    assert (second.num_prefills, second.num_loads) == (0, 1) and now
    assert _same(computed, loaded)
    # another prompt, or another share of the hidden states kept, is prefilled anew
    second.get(other)
    PrefixStore(model, keep_hidden=2).get(prompt)
    assert second.num_prefills == 1 and len(list(tmp_path.glob("prefix-*.pt"))) == 3


def test_served_tokens_from_cached_prefills_are_the_golden_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("DHS_PREFIX_CACHE", str(tmp_path))
    for start in range(2):  # the first start saves the prefills, the second loads them
        eng = make_engine("model=tiny", "system.kv_backend=hisparse", "hardware.kv_pool_gib=0.01")
        outs = run_greedy(eng, GOLDEN["prompts"], GOLDEN["max_new_tokens"])
        assert outs == GOLDEN["outputs"]["tiny"]
        n = len(GOLDEN["prompts"])
        loads = eng.metrics()["dhs_num_prefix_loads_total"]
        assert (eng.prefixes.num_prefills, loads) == ((n, 0) if start == 0 else (0, n))
