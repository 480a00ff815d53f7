"""Property-based fuzzing of /generate and /v1/completions over real HTTP: bodies (well-formed
JSON with hostile values, and raw bytes), headers (Content-Type / charset / Content-Encoding and
arbitrary extra headers) and query strings.

Properties, for every request: the server answers (never crashes, never hangs); no client error
is a 5xx; every error is JSON ``{"error": {"message", "type", "param"}}`` with a non-empty
message, and a 400 names the offending field in ``param`` (the body itself, a field that was
sent, or a required field that was missing); a 200 is a complete, well-formed answer. After the
run the engine has leaked nothing. DHS_FUZZ_EXAMPLES=2000 fuzzes longer.

Out of scope here: HTTP framing (request line, Content-Length / Transfer-Encoding, encodings
aiohttp cannot decode such as br without Brotli). Those are answered by aiohttp's HTTP parser
before any handler runs, with a plain-text 4xx that names the problem."""

import gzip
import http.client
import json
import os
import urllib.parse
import zlib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.helpers import make_engine
from tests.reliability.support import ThreadedServer, assert_drained, wait_idle_sync

EXAMPLES = int(os.environ.get("DHS_FUZZ_EXAMPLES", "250"))
CAP = 6  # engine.max_new_tokens_cap: valid requests stay cheap
VOCAB = 512
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

# Fields each endpoint may legitimately name although the client did not send them: required
# fields and fields whose default can be out of range for this server.
IMPLIED = {
    "/generate": {"text", "input_ids", "sampling_params.max_new_tokens"},
    "/v1/completions": {"prompt", "max_tokens"},
}


@pytest.fixture(scope="module")
def server():
    eng = make_engine(f"engine.max_new_tokens_cap={CAP}", "hardware.kv_pool_gib=0.01")
    with ThreadedServer(eng) as srv:
        yield srv
        wait_idle_sync(eng)
        assert_drained(eng)
        assert eng.error is None


# ---------------------------------------------------------------- strategies
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
anything = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)
ids = st.lists(st.integers(-3, VOCAB + 3), max_size=10)
words = st.lists(
    st.sampled_from(
        [
            "w1",
            "w7",
            "w511",
            "w512",
            "hello",
            "_target_",
            "/etc/passwd",
            "..",
            "\u00e9",
            "\U0001f600",
            "\t",
            "\ud800",
        ]
    ),
    max_size=8,
).map(" ".join)
prompt = st.one_of(
    ids,
    words,
    st.text(max_size=20),
    anything,
    st.lists(ids, min_size=1, max_size=2),
    st.lists(words, min_size=1, max_size=2),
)
small_int = st.one_of(st.integers(-2, CAP + 2), anything)
temperature = st.one_of(st.floats(-1, 3), st.integers(-1, 200), anything)
extra_keys = st.dictionaries(
    st.sampled_from(["_target_", "hydra", "config", "path", "", "x", "__class__", "model_path"]),
    anything,
    max_size=2,
)

stop = st.one_of(
    st.sampled_from(["w1", " w7", "w", "", "\ud800"]),
    st.lists(st.sampled_from(["w1", "w5", " w", "x"]), max_size=5),
    anything,
)
sampling = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "max_new_tokens": small_int,
            "temperature": temperature,
            "ignore_eos": anything,
            "n": st.one_of(st.just(1), anything),
            "stop": stop,
            "top_p": anything,
            "top_k": anything,
            "min_p": anything,
            "stop_token_ids": st.one_of(ids, anything),
            "no_stop_trim": anything,
            "skip_special_tokens": anything,
            "_target_": st.just("os.system"),
        },
    ),
    anything,
)

valid_ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10)
valid_text = st.lists(
    st.sampled_from(["w1", "w7", "hello", "\u00e9", "/etc/passwd"]), min_size=1, max_size=6
).map(" ".join)
valid_stop = st.one_of(
    st.sampled_from(["w1", " w7", "w"]),
    st.lists(st.sampled_from(["w1", "w5", " w3"]), min_size=1, max_size=4),
)
valid_sampling = st.fixed_dictionaries(
    {"max_new_tokens": st.integers(1, CAP)},
    optional={
        "temperature": st.one_of(st.just(0), st.floats(0, 2)),
        "ignore_eos": st.booleans(),
        "top_p": st.floats(0.01, 1),
        "top_k": st.sampled_from([-1, 1, 5, 600]),
        "min_p": st.floats(0, 1),
        "stop": valid_stop,
        "no_stop_trim": st.booleans(),
        "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=4),
    },
)
valid_generate = st.tuples(
    st.sampled_from(["input_ids", "text"]), valid_ids, valid_text, valid_sampling, st.booleans()
).map(
    lambda t: {t[0]: t[1] if t[0] == "input_ids" else t[2], "sampling_params": t[3], "stream": t[4]}
)
valid_openai = st.tuples(
    st.one_of(valid_ids, valid_text, valid_ids.map(lambda x: [x])),
    st.integers(1, CAP),
    st.one_of(st.just(0), st.floats(0, 2)),
    st.booleans(),
    st.one_of(st.none(), valid_stop),
).map(
    lambda t: {
        "prompt": t[0],
        "max_tokens": t[1],
        "temperature": t[2],
        "stream": t[3],
        "model": "anything",
        **({"stop": t[4]} if t[4] is not None else {}),
    }
)


def mutated(valid, fields):
    """A valid body with one field replaced by an arbitrary value (or a nested one)."""
    return st.tuples(valid, st.sampled_from(fields), anything).map(
        lambda t: (
            {**t[0], t[1]: t[2]}
            if "." not in t[1]
            else {
                **t[0],
                "sampling_params": {**t[0].get("sampling_params", {}), t[1].split(".", 1)[1]: t[2]},
            }
        )
    )


hostile_generate = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={
            "text": prompt,
            "input_ids": prompt,
            "sampling_params": sampling,
            "stream": st.one_of(st.booleans(), anything),
            "rid": st.one_of(st.text(max_size=8), anything),
            "return_logprob": anything,
            "lora_path": anything,
            "top_logprobs_num": anything,
            "image_data": anything,
        },
    ),
    extra_keys,
).map(lambda t: {**t[0], **t[1]})

hostile_openai = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={
            "prompt": prompt,
            "max_tokens": small_int,
            "temperature": temperature,
            "stream": st.one_of(st.booleans(), anything),
            "ignore_eos": anything,
            "stream_options": st.one_of(
                st.fixed_dictionaries({"include_usage": anything}), anything
            ),
            "n": st.one_of(st.just(1), anything),
            "best_of": anything,
            "echo": anything,
            "logprobs": anything,
            "model": st.one_of(st.just("/etc/passwd"), st.text(max_size=8)),
            "seed": anything,
            "stop": stop,
            "top_p": anything,
            "top_k": anything,
            "presence_penalty": anything,
            "frequency_penalty": anything,
            "user": anything,
        },
    ),
    extra_keys,
).map(lambda t: {**t[0], **t[1]})

generate_body = st.one_of(
    valid_generate,
    hostile_generate,
    mutated(
        valid_generate,
        [
            "input_ids",
            "text",
            "stream",
            "rid",
            "sampling_params",
            "sampling_params.max_new_tokens",
            "sampling_params.temperature",
            "sampling_params.ignore_eos",
            "sampling_params.n",
            "sampling_params.top_p",
            "sampling_params.top_k",
            "sampling_params.min_p",
            "sampling_params.stop",
            "sampling_params.stop_token_ids",
            "sampling_params.no_stop_trim",
            "return_logprob",
            "logprob_start_len",
            "_target_",
        ],
    ),
)
openai_body = st.one_of(
    valid_openai,
    hostile_openai,
    mutated(
        valid_openai,
        [
            "prompt",
            "max_tokens",
            "temperature",
            "stream",
            "ignore_eos",
            "n",
            "stream_options",
            "echo",
            "logprobs",
            "best_of",
            "stop",
            "seed",
            "top_p",
            "top_k",
            "presence_penalty",
            "frequency_penalty",
            "user",
            "model",
            "_target_",
        ],
    ),
)

# mostly JSON (the body is what is fuzzed); anything else must be a 415 before the body is read
json_ctype = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/json; charset=bogus",
    ]
)
content_type = st.one_of(
    json_ctype,
    json_ctype,
    json_ctype,
    st.sampled_from(
        [
            None,
            "application/json; charset=utf-16",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
            "*/*",
            "application/jsonx",
            "text/json",
        ]
    ),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
)
header_name = st.sampled_from(
    [
        "X-Request-Id",
        "Accept",
        "Accept-Encoding",
        "User-Agent",
        "Authorization",
        "Cookie",
        "X-Forwarded-For",
        "Origin",
        "Range",
        "If-None-Match",
        "X-Config",
        "X-Hydra-Override",
    ]
)
header_value = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
query = st.dictionaries(st.text(max_size=8), st.text(max_size=12), max_size=3)


def _encode(body, how: str) -> tuple[bytes, str | None]:
    """Serialize a body: plain JSON (NaN/Infinity allowed), or damaged, or compressed."""
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    if how == "truncate":
        return raw[: max(0, len(raw) // 2)], None
    if how == "gzip":
        return gzip.compress(raw), "gzip"
    if how == "bad_gzip":
        return raw, "gzip"
    if how == "deflate":
        return zlib.compress(raw), "deflate"
    if how == "latin1":
        return json.dumps(body).encode("unicode_escape"), None
    return raw, None


encodings = st.sampled_from(["json"] * 12 + ["truncate", "gzip", "bad_gzip", "deflate", "latin1"])


# ---------------------------------------------------------------- the client and the oracle
def _send(srv, path, data: bytes, headers: dict, q: dict) -> tuple[int, dict, bytes]:
    url = path + ("?" + urllib.parse.urlencode(q) if q else "")
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        c.putrequest("POST", url, skip_accept_encoding=True)
        for k, v in headers.items():
            c.putheader(k, v)
        c.putheader("Content-Length", str(len(data)))
        c.endheaders(data)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def _check(path: str, body, status: int, headers: dict, raw: bytes, json_ct: bool = True) -> None:
    assert status < 500, f"{status} for a client request: {raw[:500]!r}"
    # a body that is not declared application/json is a 415 before it is read, and only then
    assert (status == 415) == (not json_ct), (status, raw[:300])
    assert status in (200, 400, 413, 415), (status, raw[:300])
    if status != 200:
        err = json.loads(raw)["error"]
        assert isinstance(err["message"], str) and err["message"].strip()
        assert isinstance(err["type"], str) and "param" in err
        if status == 400:
            p = err["param"]
            assert isinstance(p, str) and p, err
            if p != "body":
                assert isinstance(body, dict), err
                key = "" if p == '""' else p  # the empty key is named '""'
                sp = body.get("sampling_params")
                sp = sp if isinstance(sp, dict) else {}
                assert (
                    key in IMPLIED[path]
                    or key.split(".")[0] in body
                    or key in sp
                    or key.removeprefix("sampling_params.") in sp
                ), (p, body)
        return
    if headers.get("content-type", "").startswith("text/event-stream"):
        events = [ln[6:] for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
        assert events and events[-1] == b"[DONE]", raw[-300:]
        objs = [json.loads(e) for e in events[:-1]]
        assert objs and not any("error" in o for o in objs), objs[-1:]
        if path == "/generate":
            n = sum(len(o["output_ids"]) for o in objs)
            assert objs[-1]["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        else:
            n = sum(o["choices"][0]["num_tokens"] for o in objs)
            assert objs[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        assert 1 <= n <= CAP
        return
    out = json.loads(raw)
    if path == "/generate":
        assert 1 <= len(out["output_ids"]) <= CAP
        fr = out["meta_info"]["finish_reason"]
        assert fr["type"] in ("length", "stop")
        sp = body.get("sampling_params") or {}
        if isinstance(fr.get("matched"), str):  # a stop string: it ends the text (trimmed)
            assert fr["matched"] in (sp["stop"] if isinstance(sp["stop"], list) else [sp["stop"]])
            full = "".join(f" w{i}" for i in out["output_ids"])
            assert fr["matched"] in full
            if not sp.get("no_stop_trim"):
                assert out["text"] == full[: full.find(fr["matched"])]
        elif fr["type"] == "stop":  # a token: EOS or one of stop_token_ids, never under ignore_eos
            assert not sp.get("ignore_eos") and out["output_ids"][-1] == fr["matched"]
    else:
        assert 1 <= out["usage"]["completion_tokens"] <= CAP
        assert out["choices"][0]["finish_reason"] in ("length", "stop")


def _fuzz_one(srv, path, body, how, ctype, extra, q):
    data, enc = _encode(body, how)
    headers = {k: v for k, v in extra.items()}
    if ctype is not None:
        headers["Content-Type"] = ctype
    if enc:
        headers["Content-Encoding"] = enc
    status, rh, raw = _send(srv, path, data, headers, q)
    json_ct = (ctype or "").split(";", 1)[0].strip().lower() == "application/json"
    event(
        f"HTTP {status}"
        + (" stream" if rh.get("content-type", "").startswith("text/event-stream") else "")
    )
    if how in ("truncate", "bad_gzip") and status not in (413, 415):
        assert status == 400 and json.loads(raw)["error"]["param"] == "body", raw[:300]
    if how == "latin1":
        # unicode_escape doubles the backslashes of json.dumps' \uXXXX escapes: the server
        # receives (and names) keys such as '\\u001f' where the body had '\x1f'
        try:
            body = json.loads(data)
        except ValueError:
            pass
    _check(path, body, status, rh, raw, json_ct)


@FUZZ
@given(
    body=generate_body,
    how=encodings,
    ctype=content_type,
    extra=st.dictionaries(header_name, header_value, max_size=3),
    q=query,
)
def test_fuzz_generate(server, body, how, ctype, extra, q):
    _fuzz_one(server, "/generate", body, how, ctype, extra, q)


@FUZZ
@given(
    body=openai_body,
    how=encodings,
    ctype=content_type,
    extra=st.dictionaries(header_name, header_value, max_size=3),
    q=query,
)
def test_fuzz_completions(server, body, how, ctype, extra, q):
    _fuzz_one(server, "/v1/completions", body, how, ctype, extra, q)


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=200),
        st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.recursive(
            st.sampled_from([b"[", b"{", b"1", b'"a"', b"null"]),
            lambda c: st.tuples(c, c).map(b"".join),
            max_leaves=20,
        ),
    ),
    path=st.sampled_from(["/generate", "/v1/completions"]),
)
def test_fuzz_raw_bytes(server, data, path):
    status, _, raw = _send(server, path, data, {"Content-Type": "application/json"}, {})
    assert status == 400, (status, raw[:300])  # no raw byte string here is a valid request
    err = json.loads(raw)["error"]
    assert err["message"] and err["param"] == "body"


# pinned cases the fuzzer found or that must never regress
PINNED = [
    (b"[" * 100_000 + b"]" * 100_000, "body"),  # RecursionError in json.loads
    (b'{"input_ids": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "body"),
    (b'{"text": "\\ud800 w1"}', "text"),  # lone surrogate: UnicodeEncodeError in the tokenizer
    (b'{"input_ids": [' + b"9" * 5000 + b"]}", "body"),  # int literal over the digit limit
    (b'{"": 1, "input_ids": [1]}', '""'),
    ('{"input_ids": [1]}'.encode("utf-16"), "body"),
    (
        b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "stop": "\\ud800"}}',
        "sampling_params.stop",
    ),  # a lone surrogate in a stop string
]
PINNED_COMPLETIONS = [  # an unknown key inside stream_options is named with its path
    (b'{"prompt": [0], "max_tokens": 1, "stream_options": {"": null}}', 'stream_options.""'),
]


@pytest.mark.parametrize("data, param", PINNED, ids=range(len(PINNED)))
def test_pinned_bad_bodies(server, data, param):
    status, _, raw = _send(server, "/generate", data, {"Content-Type": "application/json"}, {})
    assert status == 400, raw[:300]
    assert json.loads(raw)["error"]["param"] == param


@pytest.mark.parametrize("data, param", PINNED_COMPLETIONS, ids=range(len(PINNED_COMPLETIONS)))
def test_pinned_bad_completions_bodies(server, data, param):
    status, _, raw = _send(
        server, "/v1/completions", data, {"Content-Type": "application/json"}, {}
    )
    assert status == 400, raw[:300]
    assert json.loads(raw)["error"]["param"] == param


def test_bad_content_encoding_is_a_400_naming_the_body(server):
    for enc in ("gzip", "deflate"):
        status, _, raw = _send(
            server,
            "/generate",
            b'{"input_ids": [1]}',
            {"Content-Encoding": enc, "Content-Type": "application/json"},
            {},
        )
        assert status == 400
        err = json.loads(raw)["error"]
        assert err["param"] == "body" and "content-encoding" in err["message"]


def test_charset_parameter_is_not_honoured(server):
    body = b'{"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}'
    for ct in ("application/json; charset=bogus", "application/json; charset=utf-32"):
        status, _, raw = _send(server, "/generate", body, {"Content-Type": ct}, {})
        assert status == 200, raw[:300]
