"""SGLang's own bench_serving, run from .venv-sglang against the bundled server, counts what our
load generator and the server count.

Offline: the tokenizer is a Hugging Face directory equivalent to the server's word tokenizer
(make_word_tokenizer.py, built with .venv-sglang's tokenizers), and bench_serving's "random"
dataset, which samples prompt text from ShareGPT, reads a small ShareGPT-format file written
here instead of downloading one. HF_HUB_OFFLINE=1 keeps anything from reaching for the hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.metrics import parse_prometheus
from tests.sglang.common import REPO, SGLANG_PYTHON, repo_env

pytestmark = pytest.mark.skipif(
    not SGLANG_PYTHON.exists(),
    reason=".venv-sglang is absent: `bash scripts/sglang_env.sh` (make test-sglang) builds it; "
    "sglang 0.5.23 pins torch 2.14.1 and cannot share the main environment",
)

N, INPUT_LEN, OUTPUT_LEN, VOCAB = 8, 32, 8, 512
COUNTERS = ("dhs_finished_total", "dhs_prompt_tokens_total", "dhs_generated_tokens_total")


def offline_env(home: Path) -> dict[str, str]:
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(home),
        PYTHONWARNINGS="ignore",
    )


@pytest.fixture(scope="module")
def bench_inputs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bench_inputs")
    tok = d / "tokenizer"
    subprocess.run(
        [
            str(SGLANG_PYTHON),
            str(Path(__file__).with_name("make_word_tokenizer.py")),
            str(tok),
            str(VOCAB),
        ],
        check=True,
        timeout=120,
        env=offline_env(d / "hf"),
    )
    # ShareGPT-shaped conversations in the server's words (ids 2.., clear of the special 0/1)
    convs = [
        {
            "conversations": [
                {
                    "from": "human",
                    "value": " ".join(
                        f"w{2 + (7 * i + 3 * j) % (VOCAB - 2)}" for j in range(INPUT_LEN + 5)
                    ),
                },
                {"from": "gpt", "value": "w2 w3"},
            ]
        }
        for i in range(4 * N)
    ]
    sharegpt = d / "sharegpt.json"
    sharegpt.write_text(json.dumps(convs))
    return {"tokenizer": tok, "sharegpt": sharegpt, "home": d / "hf"}


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        m = parse_prometheus(r.read().decode())
    missing = [c for c in COUNTERS if c not in m]
    assert not missing, f"the bundled server's /metrics lacks {missing}"
    return {c: m[c] for c in COUNTERS}


def run_bench(backend: str, url: str, inputs: dict[str, Path], out: Path) -> dict:
    cmd = [
        str(SGLANG_PYTHON),
        "-m",
        "sglang.bench_serving",
        "--backend",
        backend,
        "--base-url",
        url,
        "--dataset-name",
        "random",
        "--dataset-path",
        str(inputs["sharegpt"]),
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--random-range-ratio",
        "1",
        "--num-prompts",
        str(N),
        "--tokenizer",
        str(inputs["tokenizer"]),
        "--model",
        str(inputs["tokenizer"]),
        "--output-file",
        str(out),
        "--output-details",
        "--warmup-requests",
        "0",
        "--disable-tqdm",
        "--seed",
        "0",
    ]
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=240,
        env=offline_env(inputs["home"]),
        cwd=str(out.parent),
    )
    if p.returncode != 0 or not out.exists():
        pytest.fail(f"bench_serving exited with {p.returncode}:\n{(p.stdout + p.stderr)[-4000:]}")
    return json.loads(out.read_text().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def our_records(bundled_server, tmp_path_factory) -> dict:
    """The same shape through harness.loadgen (8 requests in flight, 32 in, 8 out)."""
    d = tmp_path_factory.mktemp("loadgen")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.loadgen",
            "--url",
            bundled_server,
            "--api",
            "generate",
            "--concurrency",
            str(N),
            "--num-requests",
            str(N),
            "--input-len",
            str(INPUT_LEN),
            "--output-len",
            str(OUTPUT_LEN),
            "--vocab-size",
            str(VOCAB),
            "--out",
            str(d / "records.jsonl"),
            "--summary-out",
            str(d / "summary.json"),
            "--metrics-interval",
            "0",
            "--disable-progress",
            "--quiet",
        ],
        check=True,
        env=repo_env(),
        cwd=str(REPO),
        timeout=120,
    )
    records = [json.loads(line) for line in (d / "records.jsonl").read_text().splitlines()]
    return {"summary": json.loads((d / "summary.json").read_text()), "records": records}


def generate_rejects_bench_fields(url: str) -> str | None:
    """bench_serving's /generate body (sglang 0.5.23) on the bundled server; the error, if any."""
    body = {
        "text": "w5 w6",
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True},
        "stream": False,
        "lora_path": None,
        "return_logprob": False,
        "return_routed_experts": False,
        "logprob_start_len": -1,
    }
    req = urllib.request.Request(
        url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30):
            return None
    except urllib.error.HTTPError as e:
        return e.read().decode()[:500]


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai"])
def test_bench_serving_counts_match_ours(
    backend, bundled_server, bench_inputs, our_records, tmp_path
):
    if backend == "sglang":
        # every field bench_serving sends to /generate must be accepted (_GENERATE_IGNORED)
        assert generate_rejects_bench_fields(bundled_server) is None
    before = counters(bundled_server)
    res = run_bench(backend, bundled_server, bench_inputs, tmp_path / "bench.jsonl")
    after = counters(bundled_server)
    delta = {c: after[c] - before[c] for c in COUNTERS}

    # bench_serving against the server's own counters
    assert res["completed"] == N == delta["dhs_finished_total"]
    assert res["total_input_tokens"] == N * INPUT_LEN == delta["dhs_prompt_tokens_total"]
    assert res["total_output_tokens"] == N * OUTPUT_LEN == delta["dhs_generated_tokens_total"]
    # the stand-in tokenizer round-trips the server's text exactly
    assert res["total_output_tokens_retokenized"] == res["total_output_tokens"]

    # bench_serving against our load generator's records of the same shape
    ours, recs = our_records["summary"], our_records["records"]
    assert (ours["completed"], ours["errors"]) == (res["completed"], 0)
    assert ours["total_input_tokens"] == res["total_input_tokens"]
    assert ours["total_output_tokens"] == res["total_output_tokens"]
    assert sorted(r["prompt_tokens"] for r in recs) == sorted(res["input_lens"])
    assert sorted(r["completion_tokens"] for r in recs) == sorted(res["output_lens"])
