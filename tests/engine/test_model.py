import pytest
import torch

from systems.engine.prefill import PrefixStore
from systems.models.config import ModelConfig
from systems.models.kv_format import decode_rows, encode_rows
from tests.helpers import golden_prompts, make_engine, run_greedy


def test_fp8_row_matches_paper_656_bytes():
    cfg = ModelConfig(kv_dim=576, kv_rope_dim=64, kv_format="fp8")
    assert cfg.row_bytes == 656
    x = torch.randn(3, 5, 576)
    b = encode_rows(x, cfg)
    assert b.shape == (3, 5, 656) and b.dtype == torch.uint8
    y = decode_rows(b, cfg, torch.float32)
    rel = (y - x).norm() / x.norm()
    assert rel < 0.08  # e4m3 has a 3-bit mantissa
    assert torch.equal(encode_rows(y, cfg), b)  # decode/encode is a fixed point


def test_bf16_rows_roundtrip_exactly():
    cfg = ModelConfig()
    x = torch.randn(7, cfg.kv_dim).to(torch.bfloat16).float()
    assert torch.equal(decode_rows(encode_rows(x, cfg), cfg, torch.float32), x)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"index_topk": 600, "max_context_len": 512}, "index_topk"),
        ({"layer_roles": ["full", "reuse"], "layer_sources": [0, 1]}, "layer_sources"),
        ({"layer_roles": ["reuse", "full"]}, "layer_roles"),
        ({"layer_roles": ["full", "bogus"]}, "layer_roles"),
        ({"kv_format": "fp4"}, "kv_format"),
        ({"selection_locality": 1.5}, "selection_locality"),
        ({"kv_format": "fp8", "kv_dim": 100}, "kv_dim"),
    ],
)
def test_bad_model_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_unknown_config_field_is_rejected():
    with pytest.raises(ValueError, match="unknown field"):
        make_engine("+model.bogus=1")


@pytest.mark.parametrize("model", ["tiny", "tiny_dsv"])
def test_decode_equals_prefill_of_the_same_tokens(model):
    """The decode path (KV through the backend) and a fresh prefill give the same next token."""
    eng = make_engine(f"model={model}", "hardware.kv_pool_gib=0.01")
    prompts = golden_prompts()[:3]
    outs = run_greedy(eng, prompts, 10)
    store = PrefixStore(eng.model)
    for p, o in zip(prompts, outs):
        for j in range(1, len(o)):
            entry, _ = store.get(p + o[:j])
            assert int(entry.last_logits.argmax()) == o[j]


def test_prefix_store_keeps_the_most_recent_prompts_and_the_requests_key():
    """LRU over prompts (a hit moves its entry to the end), and admission looks a request up by
    the key Engine.submit built for it on the caller's thread."""
    from systems.engine.prefill import PromptKey
    from systems.engine.request import Request, SamplingParams

    eng = make_engine("hardware.kv_pool_gib=0.01")
    a, b, c = golden_prompts()[:3]
    store = PrefixStore(eng.model, max_entries=2)
    assert store.get(a)[1] and store.get(b)[1] and not store.get(a)[1]
    store.get(c)  # evicts b, the least recently used
    assert list(store._entries) == [PromptKey(a), PromptKey(c)]
    assert store.get(b)[1] and store.num_prefills == 4
    r = Request(eng.new_rid(), a, SamplingParams(max_new_tokens=2))
    eng.submit(r)
    assert isinstance(r.prompt_key, PromptKey) and r.prompt_key == PromptKey(a)
    eng.run_until_idle()
    assert any(k is r.prompt_key for k in eng.prefixes._entries)


def test_prompt_key_is_one_key_for_a_list_and_an_array_of_the_same_ids():
    """The server's body parser hands prompts over as array('q'), direct callers as lists: one
    prefill entry serves both; ids that are not 64-bit integers are refused by name."""
    from array import array

    from systems.engine.prefill import PromptKey

    ids = [5, 0, 2**40, 7]
    assert PromptKey(ids) == PromptKey(array("q", ids)) and hash(PromptKey(ids)) == hash(
        PromptKey(array("q", ids))
    )
    assert PromptKey(ids) != PromptKey(ids[:-1]) and PromptKey(ids) != PromptKey([*ids[:-1], 8])
    assert {PromptKey(ids): 1}[PromptKey(array("q", ids))] == 1
    with pytest.raises(ValueError, match="64-bit"):
        PromptKey([1, 2**64])


def test_selection_is_causal_topk_including_self():
    cfg = ModelConfig(index_topk=4)
    from systems.models.sparse_model import SparseModel

    m = SparseModel(cfg)
    p = m.layers[0]
    keys = torch.randn(2, 10, cfg.index_dim)
    h = torch.randn(2, 3, cfg.hidden_size)
    pos = torch.tensor([[0, 2, 9], [1, 5, 6]])
    sel = m.select(p, h, keys, pos)
    assert sel.shape == (2, 3, 4)
    for b in range(2):
        for q in range(3):
            s = sel[b, q]
            valid = s[s >= 0]
            assert int(valid[0]) == int(pos[b, q])  # the query's own row ranks first
            assert (valid <= pos[b, q]).all()
            assert len(valid) == min(4, int(pos[b, q]) + 1)
            assert len(set(valid.tolist())) == len(valid)


def test_locality_knob_makes_consecutive_selections_overlap():
    def overlap(lam):
        cfg = ModelConfig(index_topk=16, selection_locality=lam, max_context_len=512)
        from systems.models.sparse_model import SparseModel

        m = SparseModel(cfg)
        keys = torch.randn(1, 400, cfg.index_dim)
        h = torch.randn(1, 2, cfg.hidden_size)
        sel = m.select(m.layers[0], h, keys, torch.tensor([[398, 399]]))
        a, b = set(sel[0, 0].tolist()), set(sel[0, 1].tolist())
        return len(a & b) / 16

    assert overlap(0.95) > overlap(0.0) + 0.3


def test_a_long_prompt_goes_through_the_mlp_in_slices_with_the_same_result(monkeypatch):
    """Past MLP_SLICE_BYTES of intermediate the prefill's MLP runs in token slices (a 125K-token
    prompt's whole would take 55 GB on dsv41_h200): row-wise, so the same history and logits."""
    from systems.models.sparse_model import SparseModel

    eng = make_engine("hardware.kv_pool_gib=0.01")
    prompt = golden_prompts()[0]
    whole, _ = PrefixStore(eng.model).get(prompt)
    calls = []
    mlp = SparseModel._mlp
    monkeypatch.setattr(
        SparseModel, "_mlp", lambda self, p, h: calls.append(h.shape[1]) or mlp(self, p, h)
    )
    per_token = 2 * eng.model.cfg.intermediate_size * 4  # float32 on CPU
    monkeypatch.setattr(SparseModel, "MLP_SLICE_BYTES", 3 * per_token)  # 3 tokens a slice
    sliced, _ = PrefixStore(eng.model).get(prompt)
    assert max(calls) == 3 and len(calls) > len(eng.model.layers)
    torch.testing.assert_close(sliced.last_logits, whole.last_logits, rtol=1e-5, atol=1e-5)
    assert int(sliced.last_logits.argmax()) == int(whole.last_logits.argmax())
