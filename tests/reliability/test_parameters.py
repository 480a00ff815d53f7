"""Every parameter validated, applied or refused (issue 26, point 4): the values the issue found
accepted with a 200 are 400s naming the field; ``stop`` and ``stop_token_ids`` are applied as
SGLang / OpenAI define them; ``seed`` is refused as unsupported; a prompt word of thousands of
digits is a word, not a 500. The hypothesis fuzz over both APIs is test_fuzz_http.py."""

import json

import pytest

from tests.reliability.support import PROMPTS, served

P = PROMPTS[1]

# (endpoint, body, the field a 400 must name)
INVALID = [
    # token ids: only ints (a JSON true is not one), inside the vocabulary, at least one
    ("/generate", {"input_ids": [1, True]}, "input_ids"),
    ("/generate", {"input_ids": [1, 2.0]}, "input_ids"),
    ("/generate", {"input_ids": [5, -3, 7]}, "input_ids"),
    ("/generate", {"input_ids": [5, 10**9]}, "input_ids"),
    ("/generate", {"input_ids": []}, "input_ids"),
    ("/generate", {"sampling_params": {"top_p": 5}}, "sampling_params.top_p"),
    ("/generate", {"sampling_params": {"top_p": -1}}, "sampling_params.top_p"),
    ("/generate", {"sampling_params": {"top_k": -5}}, "sampling_params.top_k"),
    ("/generate", {"sampling_params": {"top_k": "abc"}}, "sampling_params.top_k"),
    ("/generate", {"sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
    ("/generate", {"sampling_params": {"min_p": 99}}, "sampling_params.min_p"),
    ("/generate", {"sampling_params": {"stop": {"a": 1}}}, "sampling_params.stop"),
    ("/generate", {"sampling_params": {"stop": [""]}}, "sampling_params.stop"),
    ("/generate", {"sampling_params": {"stop_token_ids": ["x"]}}, "sampling_params.stop_token_ids"),
    (
        "/generate",
        {"sampling_params": {"stop_token_ids": [100_000]}},
        "sampling_params.stop_token_ids",
    ),
    ("/generate", {"sampling_params": {"n": True}}, "sampling_params.n"),
    ("/generate", {"sampling_params": []}, "sampling_params"),
    ("/generate", {"sampling_params": {"no_stop_trim": "yes"}}, "sampling_params.no_stop_trim"),
    (
        "/generate",
        {"sampling_params": {"temperature": 0.7, "top_p": 0.9}},
        "sampling_params.top_p",
    ),  # valid, but the sampler cannot apply it: refused, not ignored
    ("/generate", {"return_logprob": True}, "return_logprob"),
    ("/generate", {"lora_path": "adapter"}, "lora_path"),
    ("/v1/completions", {"top_p": 5}, "top_p"),
    ("/v1/completions", {"top_k": "abc"}, "top_k"),
    ("/v1/completions", {"stop": {"a": 1}}, "stop"),
    ("/v1/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),  # OpenAI: at most 4
    ("/v1/completions", {"seed": "abc"}, "seed"),
    ("/v1/completions", {"seed": 7}, "seed"),  # unsupported, said so
    ("/v1/completions", {"presence_penalty": 1e9}, "presence_penalty"),
    ("/v1/completions", {"frequency_penalty": 0.5}, "frequency_penalty"),
    ("/v1/completions", {"n": True}, "n"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"echo": "no"}, "echo"),
    ("/v1/completions", {"user": 5}, "user"),
    (
        "/v1/completions",
        {"stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
    ),
    ("/v1/completions", {"stream_options": {"x": 1}}, "stream_options.x"),
]


def _with(path: str, extra: dict) -> dict:
    if path == "/generate":
        body = {"input_ids": P, "sampling_params": {"max_new_tokens": 2}}
        sp = extra.get("sampling_params", {})
        if isinstance(sp, dict):
            body["sampling_params"].update(sp)
        else:
            body["sampling_params"] = sp
        body.update({k: v for k, v in extra.items() if k != "sampling_params"})
        return body
    return {"prompt": P, "max_tokens": 2, **extra}


@pytest.fixture
async def server():
    async with served("hardware.kv_pool_gib=0.01", "engine.max_new_tokens_cap=64") as x:
        yield x


async def test_invalid_values_are_400s_naming_the_field(server):
    s, eng, _ = server
    for path, extra, field in INVALID:
        r = await s.post(path, json=_with(path, extra))
        out = await r.json()
        assert r.status == 400, (path, extra, out)
        assert out["error"]["param"] == field, (path, extra, out)
    r = await s.post(
        "/generate",
        data=json.dumps({"input_ids": "1 2 3"}),
        headers={"Content-Type": "application/json"},
    )
    assert r.status == 400 and (await r.json())["error"]["param"] == "input_ids"
    out = await (await s.post("/generate", json={"input_ids": [5, -3, 10**9]})).json()
    assert "token id -3 outside" in out["error"]["message"]  # the first one out of range
    assert eng.stats["finished_total"] == 0


async def test_neutral_values_are_accepted(server):
    s, _, _ = server
    ok = [
        (
            "/generate",
            {"sampling_params": {"top_p": 1, "top_k": -1, "min_p": 0, "temperature": 0.7, "n": 1}},
        ),
        ("/generate", {"sampling_params": {"top_p": 0.5, "top_k": 3, "temperature": 0}}),
        ("/generate", {"return_logprob": False, "lora_path": None, "top_logprobs_num": 0}),
        (
            "/v1/completions",
            {
                "seed": None,
                "presence_penalty": 0,
                "n": 1,
                "best_of": 1,
                "echo": False,
                "logprobs": None,
                "user": "u",
            },
        ),
    ]
    for path, extra in ok:
        r = await s.post(path, json=_with(path, extra))
        assert r.status == 200, (extra, await r.text())


async def test_seed_is_refused_as_unsupported(server):
    s, _, _ = server
    r = await s.post("/v1/completions", json={"prompt": P, "max_tokens": 2, "seed": 1})
    err = (await r.json())["error"]
    assert r.status == 400 and err["param"] == "seed" and "not supported" in err["message"]


async def _greedy(s, n: int = 12) -> list[int]:
    r = await s.post(
        "/generate",
        json={
            "input_ids": P,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        },
    )
    return (await r.json())["output_ids"]


async def test_stop_strings_end_the_output_as_sglang_and_openai_define_them(server):
    s, eng, _ = server
    ids = await _greedy(s)
    # a word whose first occurrence in the text is token k (" w12" also occurs in " w123")
    k = next(
        i for i in range(2, len(ids)) if f" w{ids[i]}" not in "".join(f" w{t}" for t in ids[:i])
    )
    word = f" w{ids[k]}"
    base = {
        "input_ids": P,
        "sampling_params": {
            "max_new_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "stop": [" zz", word],
        },
    }
    out = await (await s.post("/generate", json=base)).json()
    # generation stops at the token that completes the stop string; the text is cut before it
    assert out["output_ids"] == ids[: k + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert out["text"] == "".join(f" w{i}" for i in ids[:k])
    kept = await (
        await s.post(
            "/generate",
            json={**base, "sampling_params": {**base["sampling_params"], "no_stop_trim": True}},
        )
    ).json()
    assert kept["text"] == "".join(f" w{i}" for i in ids[: k + 1])
    # streaming: the last event's cumulative text is the trimmed one
    r = await s.post("/generate", json={**base, "stream": True})
    events = [
        json.loads(ln[6:]) for ln in (await r.read()).split(b"\n") if ln.startswith(b"data: {")
    ]
    assert [t for e in events for t in e["output_ids"]] == ids[: k + 1]
    assert events[-1]["text"] == out["text"]
    # OpenAI: a string stop, finish_reason "stop", the stop sequence not returned
    o = await (
        await s.post(
            "/v1/completions", json={"prompt": P, "max_tokens": 12, "temperature": 0, "stop": word}
        )
    ).json()
    assert o["choices"][0]["finish_reason"] == "stop"
    assert o["choices"][0]["text"] == out["text"] and o["usage"]["completion_tokens"] == k + 1
    r = await s.post(
        "/v1/completions",
        json={"prompt": P, "max_tokens": 12, "temperature": 0, "stop": word, "stream": True},
    )
    chunks = [
        json.loads(ln[6:]) for ln in (await r.read()).split(b"\n") if ln.startswith(b"data: {")
    ]
    assert "".join(c["choices"][0]["text"] for c in chunks) == out["text"]
    # a stop string applies under ignore_eos too (SGLang); one never produced changes nothing
    r = await s.post(
        "/generate",
        json={**base, "sampling_params": {**base["sampling_params"], "stop": "w999999"}},
    )
    assert (await r.json())["output_ids"] == ids


async def test_stop_token_ids_end_the_output_unless_ignore_eos(server):
    s, eng, _ = server
    ids = await _greedy(s)
    eos = eng.cfg.model.eos_token_id
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    assert eos not in ids[: k + 1]  # else the run without ignore_eos would end at EOS first
    sp = {"max_new_tokens": 12, "temperature": 0, "stop_token_ids": [ids[k]]}
    out = await (await s.post("/generate", json={"input_ids": P, "sampling_params": sp})).json()
    assert out["output_ids"] == ids[: k + 1]  # the stop token is part of the output (SGLang)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[k]}
    # like EOS, it does not stop a request that ignores EOS
    out = await (
        await s.post(
            "/generate", json={"input_ids": P, "sampling_params": {**sp, "ignore_eos": True}}
        )
    ).json()
    assert out["output_ids"] == ids


async def test_a_prompt_word_of_thousands_of_digits_is_a_word(server):
    s, _, _ = server
    for path, body in (
        ("/generate", {"text": "w" + "9" * 5000 + " w5", "sampling_params": {"max_new_tokens": 2}}),
        ("/v1/completions", {"prompt": "w" + "1" * 4400, "max_tokens": 2}),
    ):
        r = await s.post(path, json=body)
        assert r.status == 200, await r.text()
