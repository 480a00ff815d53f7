"""Metric functions, SSE parsers and record writers on hand-made inputs."""

from __future__ import annotations

import json
import math
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import metrics as M
from harness.loadgen import GenerateStreamParser, OpenAIStreamParser, first_wave, parse_schedule
from harness.records import JsonlWriter, RequestRecord, atomic_write_json, load_records, read_jsonl


def rec(index, send, chunks, *, ok=True, ct=None, timing=None, phase=0, status=200, error=None):
    return RequestRecord(
        rid=f"r{index}",
        index=index,
        phase=phase,
        concurrency=4,
        send_mono=send,
        send_epoch=1000.0 + send,
        chunks=[list(c) for c in chunks],
        prompt_tokens=10,
        completion_tokens=ct,
        timing=timing,
        status=status,
        error=error if not ok else None,
        success=ok,
        done_mono=(chunks[-1][0] if chunks else send) + 0.0001,
    )


# ---------------------------------------------------------------------------
# per-request quantities
# ---------------------------------------------------------------------------


def test_basic_single_token_per_chunk():
    r = rec(0, 10.0, [(10.1, 1), (10.12, 1), (10.14, 1), (10.16, 1)], ct=4)
    assert M.ttft_s(r) == pytest.approx(0.1)
    assert M.e2e_s(r) == pytest.approx(0.16)
    assert M.tpot_s(r) == pytest.approx(0.02)
    assert M.itl_s(r) == pytest.approx([0.02, 0.02, 0.02])
    assert M.itl_per_token_s(r) == pytest.approx([0.02, 0.02, 0.02])
    assert M.output_tokens(r) == 4


def test_single_token_output_has_no_tpot_and_no_itl():
    r = rec(0, 0.0, [(0.05, 1)], ct=1)
    assert M.ttft_s(r) == pytest.approx(0.05)
    assert M.tpot_s(r) is None
    assert M.itl_s(r) == []
    s = M.summarize([r])
    assert s["completed"] == 1
    assert s["tpot_ms_mean"] is None and s["tpot_ms_p99"] is None
    assert s["itl_ms_mean"] is None
    assert s["ttft_ms_mean"] == pytest.approx(50.0)


def test_empty_chunks_skipped_for_ttft_and_itl_but_count_for_e2e():
    # a leading 0-token chunk (e.g. a role/header chunk), one in the middle, a trailing usage chunk
    r = rec(0, 0.0, [(0.01, 0), (0.1, 1), (0.15, 0), (0.2, 1), (0.3, 1), (0.31, 0)], ct=3)
    assert M.ttft_s(r) == pytest.approx(0.1)
    assert M.itl_s(r) == pytest.approx([0.1, 0.1])
    assert M.e2e_s(r) == pytest.approx(0.31)  # last chunk of any kind
    assert M.tpot_s(r) == pytest.approx((0.31 - 0.1) / 2)


def test_multi_token_chunks():
    # speculative decoding style: 3 tokens per chunk every 30 ms
    r = rec(0, 0.0, [(0.1, 3), (0.13, 3), (0.16, 3)], ct=9)
    assert M.ttft_s(r) == pytest.approx(0.1)
    assert M.itl_s(r) == pytest.approx([0.03, 0.03])
    assert M.itl_per_token_s(r) == pytest.approx([0.01] * 6)  # once per token
    assert M.tpot_s(r) == pytest.approx(0.06 / 8)
    s = M.summarize([r])
    assert s["itl_ms_mean"] == pytest.approx(30.0)
    assert s["itl_per_token_ms_mean"] == pytest.approx(10.0)
    assert s["total_output_tokens"] == 9
    # SGLang's input and total throughput over the same duration as the output's
    assert s["input_tok_s"] == pytest.approx(10 / s["duration_s"])
    assert s["total_tok_s"] == pytest.approx(19 / s["duration_s"])


def test_itl_per_token_is_weighted_by_tokens_as_sglang_generate():
    """Accept lengths 4, 1, 4, 1 at 10 ms steps: one value per token (SGLang's /generate
    client), so the 4-token chunks' 2.5 ms count four times: mean 4 ms, median 2.5 ms; the
    per-chunk ITL (its completions client) is 10 ms."""
    chunks = [(0.01 * (i + 1), n) for i, n in enumerate([1, 4, 1, 4, 1, 4, 1, 4, 1])]
    r = rec(0, 0.0, chunks, ct=21)
    s = M.summarize([r])
    assert s["itl_ms_mean"] == pytest.approx(10.0)
    # (16 tokens x 2.5 ms + 4 tokens x 10 ms) / 20 tokens
    assert s["itl_per_token_ms_mean"] == pytest.approx(4.0)
    assert s["itl_per_token_ms_median"] == pytest.approx(2.5)


def test_the_first_wave_post_wave_statistics_leave_out():
    assert first_wave("closed", 8, []) == 8
    assert first_wave("schedule", None, [(4, 10.0), (64, 5.0)]) == 4
    assert first_wave("schedule", None, [(0, 3.0), (16, 5.0)]) == 16  # an idle lead-in
    assert first_wave("open", 4, []) is None


def test_output_tokens_fallback_to_chunk_sum():
    r = rec(0, 0.0, [(0.1, 2), (0.2, 3)], ct=None)
    assert M.output_tokens(r) == 5
    r.completion_tokens = 7  # server usage wins when present
    assert M.output_tokens(r) == 7


def test_no_token_chunks():
    r = rec(0, 0.0, [(0.1, 0)], ct=0)
    assert M.ttft_s(r) is None and M.tpot_s(r) is None and M.itl_s(r) == []


# ---------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------


def _mk_run():
    recs = []
    # 6 ok requests, 2 errors; index = submission order
    for i in range(6):
        s = 0.1 * i
        recs.append(
            rec(
                i,
                s,
                [(s + 0.05 + 0.001 * i, 1), (s + 0.07 + 0.001 * i, 1), (s + 0.09 + 0.001 * i, 2)],
                ct=4,
                timing={"alloc_wait_s": 0.01, "handoff_s": 0.005, "prefill_s": 0.03},
            )
        )
    recs.append(rec(6, 0.65, [], ok=False, status=503, error="HTTP 503: queue full"))
    recs.append(rec(7, 0.7, [(0.75, 1)], ok=False, status=200, error="aborted by server"))
    return recs


def test_summary_errors_excluded_and_counted():
    recs = _mk_run()
    s = M.summarize(recs, num_gpus=2, post_wave_exclude=2)
    assert s["completed"] == 6
    assert s["errors"] == 2
    assert s["errors_by_status"] == {"503": 1, "200": 1}
    ok = [r for r in recs if r.success]
    ttfts = np.array([M.ttft_s(r) for r in ok]) * 1e3
    assert s["ttft_ms_mean"] == pytest.approx(ttfts.mean())
    assert s["ttft_ms_median"] == pytest.approx(np.percentile(ttfts, 50))
    assert s["ttft_ms_p90"] == pytest.approx(np.percentile(ttfts, 90))
    assert s["ttft_ms_p99"] == pytest.approx(np.percentile(ttfts, 99))
    # duration: first send (0.0) -> last completion (the failed request's response ended
    # 0.1 ms after its last chunk at 0.75)
    d = 0.75 + 0.0001
    assert s["duration_s"] == pytest.approx(d)
    assert s["total_output_tokens"] == 24
    assert s["output_tok_s"] == pytest.approx(24 / d)
    assert s["output_tok_s_per_gpu"] == pytest.approx(12 / d)
    assert s["request_throughput"] == pytest.approx(6 / d)
    # SGLang's Concurrency: the successful requests' E2E summed over the duration
    assert s["mean_concurrency"] == pytest.approx(sum(M.e2e_s(r) for r in ok) / d)
    tpots = [M.tpot_s(r) for r in ok]
    assert s["tpot_ms_mean"] == pytest.approx(np.mean(tpots) * 1e3)
    itl = [g for r in ok for g in M.itl_s(r)]
    itl_tok = [g for r in ok for g in M.itl_per_token_s(r)]
    assert s["itl_ms_mean"] == pytest.approx(np.mean(itl) * 1e3)
    assert s["itl_per_token_ms_mean"] == pytest.approx(np.mean(itl_tok) * 1e3)
    assert s["itl_per_token_ms_mean"] < s["itl_ms_mean"]  # the 2-token chunks halve their gap
    assert s["e2e_ms_mean"] == pytest.approx(np.mean([M.e2e_s(r) for r in ok]) * 1e3)
    # server timing decomposition
    assert s["alloc_wait_s_mean"] == pytest.approx(0.01)
    assert s["handoff_s_mean"] == pytest.approx(0.005)
    assert s["ttft_other_s_mean"] == pytest.approx(ttfts.mean() / 1e3 - 0.015)
    json.dumps(s)  # serialisable


def test_a_failed_stream_ends_when_its_response_ended():
    """A request that streamed and then timed out ends the run's duration when its response
    ended (done_mono), not at its last chunk; a successful one ends at its last chunk."""
    good = rec(0, 0.0, [(0.1, 1), (0.2, 1)], ct=2)
    stuck = rec(1, 0.0, [(0.15, 1)], ok=False, status=None, error="timeout")
    stuck.done_mono = 5.0
    assert M.summarize([good, stuck])["duration_s"] == pytest.approx(5.0)
    assert M.summarize([good])["duration_s"] == pytest.approx(0.2)


def test_ttft_parts_average_over_the_requests_that_have_all_of_them():
    """alloc_wait, handoff and the rest of TTFT: means over one set of requests, so that
    they add up to that set's mean TTFT, whatever requests lack a part."""
    a = rec(0, 0.0, [(0.1, 1), (0.2, 1)], ct=2, timing={"alloc_wait_s": 0.02, "handoff_s": 0.03})
    b = rec(1, 0.0, [(0.3, 1), (0.4, 1)], ct=2, timing={"alloc_wait_s": 0.2})  # no handoff_s
    s = M.summarize([a, b])
    assert s["alloc_wait_s_mean"] == pytest.approx(0.02)  # b left out of every part
    assert s["handoff_s_mean"] == pytest.approx(0.03)
    total = s["alloc_wait_s_mean"] + s["handoff_s_mean"] + s["ttft_other_s_mean"]
    assert total == pytest.approx(M.ttft_s(a))


def test_post_wave_excludes_first_c_by_submission_order():
    recs = _mk_run()
    # shuffle completion order: post-wave must use `index`, not list order
    recs = list(reversed(recs))
    s = M.summarize(recs, post_wave_exclude=2)
    keep = [r for r in recs if r.success and r.index >= 2]
    assert s["post_wave_exclude"] == 2
    assert s["post_wave_completed"] == len(keep) == 4
    assert s["post_wave_ttft_ms_mean"] == pytest.approx(np.mean([M.ttft_s(r) for r in keep]) * 1e3)
    assert s["post_wave_tpot_ms_mean"] == pytest.approx(np.mean([M.tpot_s(r) for r in keep]) * 1e3)
    assert s["post_wave_ttft_ms_p99"] == pytest.approx(
        np.percentile([M.ttft_s(r) for r in keep], 99) * 1e3
    )
    s2 = M.summarize(recs, post_wave_exclude=None)
    assert s2["post_wave_ttft_ms_mean"] is None


def test_summary_empty_and_all_errors():
    s = M.summarize([])
    assert s["completed"] == 0 and s["errors"] == 0 and s["output_tok_s"] is None
    s = M.summarize([rec(0, 0.0, [], ok=False, status=500, error="x")])
    assert s["completed"] == 0 and s["errors"] == 1 and s["ttft_ms_mean"] is None
    json.dumps(s)


def test_summary_accepts_dicts_from_jsonl(tmp_path):
    recs = _mk_run()
    p = tmp_path / "r.jsonl"
    with JsonlWriter(p) as w:
        for r in recs:
            w.write(r)
    loaded = list(read_jsonl(p))
    assert M.summarize(loaded, post_wave_exclude=2) == M.summarize(recs, post_wave_exclude=2)


# ---------------------------------------------------------------------------
# Prometheus parsing, active mean, phases
# ---------------------------------------------------------------------------

PROM = """# HELP dhs_num_running_reqs running
# TYPE dhs_num_running_reqs gauge
dhs_num_running_reqs{gpu="0"} 3
dhs_num_running_reqs{gpu="1"} 4
sglang:num_running_reqs{model_name="m",engine_type="unified"} 7.0
plain_counter_total 12 1700000000000
weird{path="/a b}c",x="q\\"z"} 1.5e3
nan_metric NaN
inf_metric +Inf
bad_line_without_value
"""


def test_parse_prometheus():
    v = M.parse_prometheus(PROM)
    assert v['dhs_num_running_reqs{gpu="0"}'] == 3.0
    assert v['dhs_num_running_reqs{gpu="1"}'] == 4.0
    assert v['sglang:num_running_reqs{model_name="m",engine_type="unified"}'] == 7.0
    assert v["plain_counter_total"] == 12.0  # timestamp ignored
    assert v['weird{path="/a b}c",x="q\\"z"}'] == 1500.0
    assert math.isnan(v["nan_metric"]) and v["inf_metric"] == math.inf
    assert "bad_line_without_value" not in v
    assert M.metric_total(v, "dhs_num_running_reqs") == 7.0
    assert M.metric_total(v, "missing") is None


def test_active_mean_uses_central_half():
    # run from t0=100 for D=8 s -> window [102, 106]
    samples = [
        {"ts": 100.0 + t, "values": {"dhs_num_running_reqs": float(v)}}
        for t, v in [
            (0, 0),
            (1, 100),
            (2, 10),
            (3, 20),
            (4, 30),
            (5, 40),
            (6, 50),
            (7, 100),
            (8, 0),
        ]
    ]
    assert M.active_mean(samples, 100.0, 8.0) == pytest.approx(30.0)
    assert M.active_mean(samples, 100.0, 8.0, name="nope") is None
    assert M.active_mean(
        samples, 100.0, 8.0, name=["nope", "dhs_num_running_reqs"]
    ) == pytest.approx(30.0)
    s = M.summarize([rec(0, 0.0, [(8.0, 1)], ct=1)], samples=samples, epoch_offset=100.0)
    assert s["active_mean"] == pytest.approx(30.0)


def test_phase_stats_and_host_share():
    # two phases of 1 s: [0,1) and [1,2); epoch = mono + 1000
    recs = [
        rec(
            0,
            0.1,
            [(0.2, 1), (0.3, 1)],
            ct=2,
            phase=0,
            timing={"alloc_wait_s": 0.01, "handoff_s": 0},
        ),
        rec(
            1,
            0.2,
            [(0.4, 1), (0.6, 1)],
            ct=2,
            phase=0,
            timing={"alloc_wait_s": 0.03, "handoff_s": 0},
        ),
        rec(2, 0.9, [(1.0, 1), (1.2, 1)], ct=2, phase=0),  # finishes in phase 1 -> counted nowhere
        rec(3, 1.1, [(1.2, 1), (1.25, 1)], ct=2, phase=1),
    ]
    samples = [
        {
            "ts": 1000.0,
            "values": {"dhs_selected_rows_total": 0, "dhs_selected_rows_from_host_total": 0},
        },
        {
            "ts": 1001.0,
            "values": {"dhs_selected_rows_total": 100, "dhs_selected_rows_from_host_total": 10},
        },
        {
            "ts": 1002.0,
            "values": {"dhs_selected_rows_total": 300, "dhs_selected_rows_from_host_total": 110},
        },
    ]
    phases = [
        {"phase": 0, "concurrency": 2, "start_mono": 0.0, "end_mono": 1.0},
        {"phase": 1, "concurrency": 8, "start_mono": 1.0, "end_mono": 2.0},
    ]
    ps = M.phase_stats(recs, phases, samples, epoch_offset=1000.0)
    assert [p["requests"] for p in ps] == [2, 1]
    assert ps[0]["tpot_ms_mean"] == pytest.approx((100 + 200) / 2)
    assert ps[0]["tok_s_per_session"] == pytest.approx(1000 / 150)
    assert ps[0]["ttft_ms_mean"] == pytest.approx(150.0)
    assert ps[0]["alloc_wait_s_mean"] == pytest.approx(0.02)
    assert ps[0]["host_fetched_share"] == pytest.approx(0.1)
    assert ps[1]["host_fetched_share"] == pytest.approx(0.5)
    assert ps[1]["alloc_wait_s_mean"] is None
    assert ps[0]["output_tok_s"] == pytest.approx(4.0)  # tokens arriving in [0,1)
    assert ps[1]["output_tok_s"] == pytest.approx(4.0)  # 2 from request 2, 2 from request 3
    # no counters -> share None
    ps2 = M.phase_stats(recs, phases, [{"ts": 1000.0, "values": {"x": 1}}], epoch_offset=1000.0)
    assert ps2[0]["host_fetched_share"] is None

    # scrapes every 0.1 s that failed from 999 s to 1003 s: the windows' edges are 1 s and more
    # from any scrape, whose counters would count other windows' selections: no share
    def scrape(ts):
        n = 100.0 * (ts - 998.0)
        return {"ts": ts, "values": {"dhs_selected_rows_total": n,
                                     "dhs_selected_rows_from_host_total": n / 10}}  # fmt: skip

    holed = [scrape(998.0 + k / 10) for k in range(11)] + [
        scrape(1003.0 + k / 10) for k in range(11)
    ]
    ps3 = M.phase_stats(recs, phases, holed, epoch_offset=1000.0)
    assert [p["host_fetched_share"] for p in ps3] == [None, None]  # else phase 1's: 0.1


def test_window_after_a_step_down_starts_when_the_higher_load_drained():
    """Table A1's last row: a step down (C4 -> C1) counts the final phase from the moment the
    client's in-flight count returned to 1, so a request sent while the C4 leftovers drained
    is left out; without a step down there is no such window."""
    leftovers = [rec(i, 1.0 + i, [(5.0, 1), (t, 1)], ct=2) for i, t in enumerate((12, 13, 14, 15))]
    early = rec(4, 10.5, [(11.0, 1), (16.0, 1)], ct=2, phase=1)  # sent before the drain ended
    late = [rec(5, 16.0, [(17.0, 1), (20.0, 1)], ct=2, phase=1)]
    late.append(rec(6, 20.5, [(21.0, 1), (25.0, 1)], ct=2, phase=1))
    failed = rec(7, 26.0, [], ok=False, phase=1, status=500, error="boom")
    recs = [*leftovers, early, *late, failed]
    phases = [
        {"phase": 0, "concurrency": 4, "start_mono": 0.0, "end_mono": 10.0},
        {"phase": 1, "concurrency": 1, "start_mono": 10.0, "end_mono": 30.0},
    ]
    # in flight at 10 s: the 4 leftovers and, from 10.5 s, the early one; 1 left at 15 s
    assert M.recovery_time(recs, phases[1]) == pytest.approx(15.0, abs=1e-3)
    s = M.summarize(recs, phases=phases, epoch_offset=1000.0)
    assert s["phases"][1]["requests"] == 3
    rec_ = s["phase_after_recovery"]
    assert rec_["requests"] == 2 and rec_["recovered_after_s"] == pytest.approx(5.0, abs=1e-3)
    assert rec_["duration_s"] == pytest.approx(15.0, abs=1e-3)
    assert rec_["tpot_ms_mean"] == pytest.approx((3000 + 4000) / 2)
    # a step up, or a load that never drains inside the phase: no window
    up = [dict(phases[0], concurrency=1), dict(phases[1], concurrency=4)]
    assert "phase_after_recovery" not in M.summarize(recs, phases=up, epoch_offset=1000.0)
    short = [phases[0], dict(phases[1], end_mono=14.0)]
    assert M.recovery_time(recs, short[1]) is None
    # the last phase must step down from the one before it (4 -> 64 -> 4 -> 16 ends stepping up)
    up_again = [*phases, {"phase": 2, "concurrency": 2, "start_mono": 30.0, "end_mono": 40.0}]
    assert "phase_after_recovery" not in M.summarize(recs, phases=up_again, epoch_offset=1000.0)


def test_recovery_counts_what_the_client_counts_in_flight():
    """A failure leaves the count when the client is done with it (done_mono), not at once; a
    request ending exactly at the phase start was never in flight in the phase."""
    ph = {"phase": 1, "concurrency": 1, "start_mono": 10.0, "end_mono": 30.0}
    two = [rec(0, 1.0, [(2.0, 1), (20.0, 1)], ct=2), rec(1, 1.0, [(2.0, 1), (25.0, 1)], ct=2)]
    failed_fast = rec(2, 12.0, [], ok=False, phase=1, status=500, error="boom")
    assert M.recovery_time([*two, failed_fast], ph) == pytest.approx(20.0, abs=1e-3)
    timed_out = rec(3, 5.0, [], ok=False, status=504, error="timeout")
    timed_out.done_mono = 28.0
    assert M.recovery_time([*two, timed_out], ph) == pytest.approx(25.0, abs=1e-3)
    at_start = rec(4, 1.0, [(2.0, 1), (10.0, 1)], ct=2)
    at_start.done_mono = 10.0
    assert M.recovery_time([*two, at_start], ph) == pytest.approx(20.0, abs=1e-3)


def test_parse_schedule():
    assert parse_schedule("16:300,256:300, 16:300") == [(16, 300.0), (256, 300.0), (16, 300.0)]
    assert parse_schedule([[2, 0.5], (4, 1)]) == [(2, 0.5), (4, 1.0)]
    with pytest.raises(ValueError):
        parse_schedule("16")
    with pytest.raises(ValueError):
        parse_schedule("16:0")


# ---------------------------------------------------------------------------
# SSE parsers
# ---------------------------------------------------------------------------


def gen_stream(n_tokens, per_chunk=1, empty_every=0, spaces=False, text='x"\\y'):
    """A /generate stream as SGLang writes it (cumulative text, meta_info)."""
    sep = (", ", ": ") if spaces else (",", ":")
    out, ct, i = [], 0, 0
    while ct < n_tokens:
        k = min(per_chunk, n_tokens - ct)
        ct += k
        i += 1
        fin = ct == n_tokens
        mi = {
            "id": "a",
            "prompt_tokens": 5,
            "completion_tokens": ct,
            "finish_reason": {"type": "length", "length": ct} if fin else None,
        }
        if fin:
            mi["timing"] = {
                "arrival_ts": 1.0,
                "alloc_wait_s": 0.25,
                "handoff_s": 0.0,
                "prefill_s": 0.1,
                "first_token_ts": 2.0,
                "finish_ts": 3.0,
            }
        # text contains quote/backslash and the key names, which must not fool the fast path
        obj = {
            "text": (text + '"completion_tokens":999,"finish_reason":null') * ct,
            "output_ids": list(range(ct - k, ct)),
            "meta_info": mi,
        }
        out.append(b"data: " + json.dumps(obj, separators=sep).encode() + b"\n\n")
        if empty_every and i % empty_every == 0 and not fin:
            obj = dict(obj, output_ids=[])
            out.append(b"data: " + json.dumps(obj, separators=sep).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def oai_stream(n_tokens, per_chunk=1, num_tokens_field=True):
    out, ct = [], 0
    while ct < n_tokens:
        k = min(per_chunk, n_tokens - ct)
        ct += k
        ch = {
            "index": 0,
            "text": "ab" * k,
            "logprobs": None,
            "finish_reason": "length" if ct == n_tokens else None,
        }
        if num_tokens_field:
            ch["num_tokens"] = k
        out.append(
            b"data: "
            + json.dumps(
                {"id": "c", "object": "text_completion", "choices": [ch], "usage": None}
            ).encode()
            + b"\n\n"
        )
    usage = {"prompt_tokens": 5, "completion_tokens": n_tokens, "total_tokens": 5 + n_tokens}
    out.append(
        b"data: "
        + json.dumps(
            {"id": "c", "choices": [], "usage": usage, "timing": {"alloc_wait_s": 0.5}}
        ).encode()
        + b"\n\n"
    )
    out.append(b"data: [DONE]\n\n")
    return out


def run_parser(cls, events, splits=None):
    p = cls()
    data = b"".join(events)
    if splits is None:
        for i, e in enumerate(events):
            p.feed(e, float(i))
    else:
        cuts = sorted(set(min(max(c, 0), len(data)) for c in splits))
        prev = 0
        for j, c in enumerate(cuts + [len(data)]):
            p.feed(data[prev:c], float(j))
            prev = c
    p.finish(99.0)
    return p


@pytest.mark.parametrize("spaces", [False, True])
@pytest.mark.parametrize("per_chunk,empty_every", [(1, 0), (3, 0), (1, 2), (4, 1)])
def test_generate_parser(per_chunk, empty_every, spaces):
    ev = gen_stream(10, per_chunk, empty_every, spaces)
    p = run_parser(GenerateStreamParser, ev)
    toks = [n for _, n in p.chunks]
    assert sum(toks) == 10
    assert all(n in (0, per_chunk) or n == 10 % per_chunk for n in toks)
    if empty_every:
        assert 0 in toks
    assert p.done and p.complete and p.error is None
    assert p.prompt_tokens == 5 and p.completion_tokens == 10
    assert p.timing["alloc_wait_s"] == 0.25
    assert p.finish_reason["type"] == "length"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4000), max_size=12), st.integers(1, 4), st.booleans())
def test_parsers_invariant_to_read_boundaries(splits, per_chunk, spaces):
    ev = gen_stream(9, per_chunk, 2, spaces)
    a, b = run_parser(GenerateStreamParser, ev), run_parser(GenerateStreamParser, ev, splits)
    assert [n for _, n in a.chunks] == [n for _, n in b.chunks]
    assert (b.prompt_tokens, b.completion_tokens, b.timing, b.error, b.done) == (
        a.prompt_tokens,
        a.completion_tokens,
        a.timing,
        a.error,
        a.done,
    )
    ev = oai_stream(9, per_chunk)
    a, b = run_parser(OpenAIStreamParser, ev), run_parser(OpenAIStreamParser, ev, splits)
    assert [n for _, n in a.chunks] == [n for _, n in b.chunks]
    assert b.completion_tokens == 9 and b.done


@pytest.mark.parametrize("cls", [GenerateStreamParser, OpenAIStreamParser])
def test_a_stream_without_a_token_or_an_end_is_an_error(cls):
    """A stream of [DONE] alone is no completed request (no TTFT, no E2E); one that stops
    mid-way without [DONE] or a finish reason is a truncated one."""
    p = run_parser(cls, [b"data: [DONE]\n\n"])
    assert p.error == "stream ended without a token"
    ev = gen_stream(3) if cls is GenerateStreamParser else oai_stream(3, 1)
    p = run_parser(cls, ev[:2])
    assert p.error == "stream ended without [DONE] or finish_reason"


def test_generate_parser_crlf_comments_and_no_final_newline():
    ev = gen_stream(3)
    data = b"".join(ev).replace(b"\n", b"\r\n")
    data = b": keep-alive comment\r\n\r\nevent: message\r\n" + data
    p = GenerateStreamParser()
    p.feed(data[:-4], 1.0)  # trailing "\r\n\r\n" missing -> [DONE] still buffered
    assert not p.done
    p.finish(2.0)
    assert p.done and [n for _, n in p.chunks] == [1, 1, 1]


def test_generate_parser_fallback_to_output_ids():
    ev = [
        b'data: {"text":"a","output_ids":[1,2]}\n\n',
        b'data: {"text":"ab","output_ids":[3],"meta_info":{"finish_reason":{"type":"stop"}}}\n\n',
        b"data: [DONE]\n\n",
    ]
    p = run_parser(GenerateStreamParser, ev)
    assert [n for _, n in p.chunks] == [2, 1]
    assert p.completion_tokens is None and p.error is None


def test_generate_parser_abort_and_error_events():
    ev = [
        b'data: {"text":"a","output_ids":[1],"meta_info":{"prompt_tokens":3,"completion_tokens":1,'
        b'"finish_reason":{"type":"abort","message":"kv cache full"}}}\n\n',
        b"data: [DONE]\n\n",
    ]
    p = run_parser(GenerateStreamParser, ev)
    assert p.error and "kv cache full" in p.error
    p = run_parser(GenerateStreamParser, [b'data: {"error": {"message": "boom", "type": "x"}}\n\n'])
    assert p.error == "boom"
    p = run_parser(GenerateStreamParser, [b"data: {not json\n\n"])
    assert p.error and "unparsable" in p.error


@pytest.mark.parametrize("num_tokens_field", [True, False])
@pytest.mark.parametrize("per_chunk", [1, 3])
def test_openai_parser(per_chunk, num_tokens_field):
    ev = oai_stream(7, per_chunk, num_tokens_field)
    p = run_parser(OpenAIStreamParser, ev)
    toks = [n for _, n in p.chunks]
    if num_tokens_field:
        assert toks[:-1] == [per_chunk] * (7 // per_chunk) + (
            [7 % per_chunk] if 7 % per_chunk else []
        )
    else:
        assert all(n == 1 for n in toks[:-1])  # 1 per non-empty chunk
    assert toks[-1] == 0  # the usage chunk
    assert p.completion_tokens == 7 and p.prompt_tokens == 5
    assert p.timing == {"alloc_wait_s": 0.5}
    assert p.finish_reason == "length" and p.done and p.error is None


def test_openai_parser_multiple_choices_use_slow_path():
    e = {
        "id": "c",
        "choices": [
            {"index": 0, "text": "a", "finish_reason": None, "num_tokens": 2},
            {"index": 1, "text": "b", "finish_reason": None, "num_tokens": 3},
        ],
        "usage": None,
    }
    p = run_parser(
        OpenAIStreamParser, [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"]
    )
    assert [n for _, n in p.chunks] == [5]


# ---------------------------------------------------------------------------
# writers
# ---------------------------------------------------------------------------


def test_jsonl_writer_flushes_each_record(tmp_path):
    p = tmp_path / "sub" / "r.jsonl"
    w = JsonlWriter(p)
    r = rec(0, 0.0, [(0.1, 1)], ct=1)
    w.write(r)
    # readable by another reader before close
    with open(p) as f:
        lines = f.readlines()
    assert len(lines) == 1 and json.loads(lines[0])["rid"] == "r0"
    w.write(rec(1, 0.0, [(0.2, 2)], ct=2).to_dict())  # plain dicts are accepted too
    assert len(open(p).readlines()) == 2
    w.close()
    # a torn last line (crash mid-write) is skipped on load
    with open(p, "a") as f:
        f.write('{"rid": "torn", "ind')
    got = load_records(p)
    assert [g.rid for g in got] == ["r0", "r1"] and got[0].chunks == [[0.1, 1]]


def test_atomic_write_json(tmp_path):
    p = tmp_path / "s.json"
    atomic_write_json(p, {"a": 1, "nan": float("nan"), "arr": np.arange(3), "f": np.float64(2.5)})
    assert json.loads(p.read_text()) == {"a": 1, "nan": None, "arr": [0, 1, 2], "f": 2.5}
    atomic_write_json(p, {"b": 2})
    assert json.loads(p.read_text()) == {"b": 2}
    assert os.listdir(tmp_path) == ["s.json"]  # no temp files left
    with pytest.raises(TypeError):
        atomic_write_json(p, {"bad": object()})
    assert json.loads(p.read_text()) == {"b": 2}  # old content intact
    assert os.listdir(tmp_path) == ["s.json"]


def test_atomic_write_json_readers_never_see_partial(tmp_path):
    p = tmp_path / "s.json"
    atomic_write_json(p, {"v": 0, "pad": "x" * 100000})
    stop = threading.Event()
    bad = []

    def reader():
        while not stop.is_set():
            try:
                json.loads(p.read_text())
            except json.JSONDecodeError as e:  # pragma: no cover - failure path
                bad.append(e)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(50):
        atomic_write_json(p, {"v": i, "pad": "x" * 100000})
    stop.set()
    t.join()
    assert not bad
