"""Decode step of the bundled engine against its byte floor, with the GPU's busy share.

    python benchmarks/bench_decode_step.py --models glm53_mini,glm53_probe \
        --systems hisparse,adaptive_hisparse,adaptive_dhisparse --batches 1,8,32 --context 16384
    python benchmarks/bench_decode_step.py --experiment fig4_h200 --context 49152

With ``--experiment`` every row is composed on that experiment's config (model, KV pool, slots,
host pool, drafter width, sampling temperature): the state its served runs decode in. Without
it the rows run on a 24 GiB pool, greedy, with each system's default drafter: adaptive
residency then holds most of the history, and a glm53_h200 block-4 round fetched 27x fewer host
rows than fig4_h200's served rounds.

To compare settings of one build (a kernel knob, a copy width), pass them as ``--variants``
with ``--repeats``; the sets run interleaved on one machine, which is the only comparison that
holds (one config's numbers move by up to 40% between machines):

    python benchmarks/bench_decode_step.py --experiment fig4_h200 --batches 32 --repeats 2 \
        --variants "system.kv.copy_programs_per_request=1;system.kv.copy_programs_per_request=2"

Their rows carry ``overrides`` and ``repeat`` and stay apart from the build's own rows in the
summary (Fig. 4's served-against-benchmark note reads only those), as do the rows of any run
given positional overrides: a row measured with other settings is another row.

Per (model, system, batch) row:
- ``step_ms``: median wall time of an engine step (schedule + forward + sample + postprocess;
  for a speculative system one round), synchronized before and after, after warm-up.
- ``step_ms_pipelined``: the same steps run back to back with one synchronization at the end,
  total over count: what a served step costs when overlap scheduling hides the host's part of a
  step behind the GPU's (``engine.overlap_schedule``); equal to ``step_ms`` when nothing overlaps.
- ``replay_ms``: the target forward's CUDA graph replayed alone, back to back (no host work at
  all): the device time of a step's forward, what ``step_ms_pipelined`` would be if the host
  kept ahead of the GPU (null when the step does not run under a graph).
- ``host_profile`` (with ``--host-profile N``): the N functions with the most own host time over
  the pipelined steps (cProfile), to show what the host does when it is the step's bound.
- ``handoff_step_ms``: the same step while four more requests of the same context arrive
  (asynchronous handoffs: their history copied on a side stream), median over the steps with
  copies in flight, in waves of four until at least 8 such steps ran (``handoff_steps``,
  ``handoff_waves``); ``handoff_admit_step_ms`` is the median step that admits a wave
  (reservations, copies queued),
  ``handoff_arrival_step_ms`` the median step in which requests landed; with ``--host-profile``
  ``handoff_arrival_host_profile`` is a further wave's landing step under cProfile.
  ``handoff_host_rows_per_step`` and ``handoff_backup_rows_per_step``: host-fetched and
  backed-up rows per step of the waves (an adaptive admission into a full pool reclaims running
  requests' optional pages, which the next steps fetch from host).
  With ``--handoff-trace``, ``handoff_wave_trace`` is one more wave under torch.profiler, from
  its admitting step to the step it lands in: each step's wall time, and per CUDA stream its
  kernel, copy and memset time, its top kernels and its time by the engine ranges that queued
  the work (``range_ms``: an admission's ``dhs::handoff``, a reclaim's backup inside it,
  population; ``wave_activity``), with the backend's counters over that wave (``counters``),
  to tell a step slowed by the copies' blocks (kernels on the handoff stream beside the decode
  stream's) from one that waits for them, runs copies itself or fetches more from host.
  With ``--handoff-pipelined``, ``handoff_pipelined_step_ms`` is one more wave's mean step run
  back to back as served (admission's host work beside the step in flight), against
  ``handoff_pipelined_plain_step_ms``, the plain steps just before it: issue 22's bound on the
  step's growth while handoffs arrive, as a served step sees it. Both lengthen the output caps
  by their steps, as ``--fill-steps`` does.
- ``floor_ms``: bytes the step must read once at the device's measured copy rate (4.22 TB/s,
  docs/design.md): the weights in bf16 (of the embedding table only the rows gathered) + the
  selected KV rows (B x queries x layers x k x row bytes) + the indexer's scan of every visible
  index key (B x selecting layers x L x index row bytes: once per call, whatever the queries)
  + in a speculative round its drafting (``drafter_bytes``: per proposal pass the drafter's
  weights, the target's LM head and the ring windows, plus the catch-up). ``host_rows_per_step``:
  the rows the timed steps copied from pinned host memory (HiSparse's misses; a row several
  queries select is copied once: ``host_selections_per_step`` counts selections), and
  ``host_floor_ms`` that traffic at the bulk pinned-copy rate (55.4 GB/s): the PCIe floor,
  apart from the HBM one (a layer's misses must arrive before its attention runs).
- ``busy_share``: union of the GPU's kernel / copy intervals over the wall time of the profiled
  steps (torch.profiler's CUDA activity, after the timed steps), and ``kernels_per_step``; the
  profiler's own host cost lowers it. ``busy_share_events``: the served metric
  (``dhs_decode_gpu_share``: the steps' CUDA-event spans over the GPU timeline) over the
  pipelined steps, no profiler; a step's span includes the gaps between its kernels.
- ``phase_kernel_us`` (speculative systems): over the profiled rounds, each phase's kernel time
  and its top kernels in microseconds per round, each kernel attributed to the phase whose range
  launched it (the drafter's share of a round: propose + catch_up).
- ``round_over_step``: a speculative round's time over the adaptive_hisparse step
  (``round_base``; for the hierarchy's speculative systems, the same build without speculation)
  at the same model and batch (the paper's block-4 round costs 2.2x a non-speculative step);
  null for other systems. Rows without ``round_base`` were measured against the hisparse step,
  when both systems copied on the same grid.
Speculative systems verify with calibrated acceptance (random-weight drafters accept nothing).
Rows go to results/engine_step/summary.json: {"gpu", "commit", "rows": [...]} (merged by
(model, system, batch, context, experiment) with the rows already there).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from figures.presets import HBM_BPS  # noqa: E402  (the H200's measured copy rate)
from profiling.ranges import PREFIX as RANGE_PREFIX  # noqa: E402  (the engine's ranges)

PCIE_BPS = 55.4e9  # bulk host-to-device copy from pinned memory (docs/design.md)
PAPER_ROUND_OVER_STEP = 2.2  # a block-4 round against a plain step (paper sec. 4.2.1)
# the plain step a round is compared with: the same build without speculation (the HiSparse
# baseline may copy its misses on another grid, conf/system/hisparse.yaml)
ROUND_BASE = "adaptive_hisparse"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
STEP_RANGE = "bench_decode_step"


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds in, milliseconds out)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total / 1e3


def chrome_trace(prof) -> dict:
    """A finished torch.profiler run's chrome trace, as a dict."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        return json.loads(Path(path).read_text())


def trace_activity(trace: dict) -> dict:
    """Busy share and kernel count of the step ranges in a chrome trace (torch.profiler)."""
    ev = trace.get("traceEvents", [])
    steps = [
        e
        for e in ev
        if e.get("name") == STEP_RANGE
        and e.get("ph") == "X"
        and e.get("cat") in ("user_annotation", "cpu_op")
    ]
    if not steps:
        return {"busy_share": None, "kernels_per_step": None}
    t0 = min(e["ts"] for e in steps)
    gpu = [
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in ev
        if e.get("cat") in GPU_CATS and e.get("ph") == "X" and e["ts"] >= t0
    ]
    if not gpu:
        return {"busy_share": None, "kernels_per_step": None}
    # the window: the first step's launch to the GPU's last interval (the last step's end)
    t1 = max(max(e["ts"] + e["dur"] for e in steps), max(b for _, b in gpu))
    kern = [e for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X" and e["ts"] >= t0]
    # names cut to 80 characters, counted after the cut: templated kernels that share a prefix
    # are one entry, not one overwriting the other
    names = collections.Counter(e["name"][:80] for e in kern)
    us = collections.Counter()
    for e in kern:
        us[e["name"][:80]] += e.get("dur", 0)
    return {
        **phase_kernels(ev, kern, len(steps)),
        "busy_share": union_ms(gpu) / ((t1 - t0) / 1e3),
        "kernels_per_step": sum(names.values()) / len(steps),
        # where the launches go (what fusion should target next): name -> launches per step
        "top_kernels": {n: c / len(steps) for n, c in names.most_common(25)},
        # where the device time goes: name -> microseconds per step (a kernel's own duration)
        "top_kernel_us": {n: t / len(steps) for n, t in us.most_common(25)},
    }


def wave_activity(trace: dict, top: int = 8) -> dict:
    """Per CUDA stream of a chrome trace (torch.profiler): kernel milliseconds, copy
    milliseconds and gigabytes, memset milliseconds, ``busy_ms`` (the union of its intervals:
    against the steps' wall time, the gaps where the stream waited or had nothing queued), the
    ``top`` kernels by time (microseconds), and ``range_ms``: its kernel and copy milliseconds
    by the engine ranges (``dhs::...``, outermost first) open where the host launched them
    (what a stream's copies are: a handoff's import, a reclaim's backup inside it, population);
    streams keyed by their id as a string, busiest first."""
    events = trace.get("traceEvents", [])
    path_of = {
        c: " > ".join(names)
        for c, names in launch_ranges(events, lambda n: n.startswith(RANGE_PREFIX)).items()
    }
    per: dict[str, dict] = {}
    spans: dict[str, list] = collections.defaultdict(list)
    by_range: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in events:
        cat = e.get("cat")
        if cat not in GPU_CATS or e.get("ph") != "X":
            continue
        a = e.get("args", {})
        st = per.setdefault(
            str(a.get("stream", "?")),
            {
                "kernel_ms": 0.0,
                "memcpy_ms": 0.0,
                "memcpy_gb": 0.0,
                "memset_ms": 0.0,
                "kernels": collections.Counter(),
            },
        )
        dur = float(e.get("dur", 0))
        spans[str(a.get("stream", "?"))].append(
            (float(e.get("ts", 0)), float(e.get("ts", 0)) + dur)
        )
        if cat != "gpu_memset":
            where = path_of.get(a.get("correlation"), "(no range)")
            by_range[str(a.get("stream", "?"))][where] += dur / 1e3
        if cat == "kernel":
            st["kernel_ms"] += dur / 1e3
            st["kernels"][str(e.get("name", ""))[:80]] += dur
        elif cat == "gpu_memcpy":
            st["memcpy_ms"] += dur / 1e3
            st["memcpy_gb"] += float(a.get("bytes", 0)) / 1e9
        else:
            st["memset_ms"] += dur / 1e3

    def busy(st: dict) -> float:
        return st["kernel_ms"] + st["memcpy_ms"] + st["memset_ms"]

    out = {}
    for sid, st in sorted(per.items(), key=lambda kv: -busy(kv[1])):
        kernels = st.pop("kernels")
        out[sid] = {
            **st,
            "busy_ms": union_ms(spans[sid]),
            "top_kernel_us": dict(kernels.most_common(top)),
            "range_ms": dict(by_range[sid].most_common()),
        }
    return out


LAUNCH_CATS = ("cuda_runtime", "cuda_driver")  # kernel and graph launches (Triton: the driver)


def launch_ranges(ev: list, wanted) -> dict:
    """The host ranges (``user_annotation`` events whose name ``wanted`` accepts) open around
    each launch call of a chrome trace, on the launching thread: correlation id -> their names,
    outermost first. A kernel or copy carries its launch's correlation id (a CUDA graph's
    kernels that of its cudaGraphLaunch), so this says which range queued it. One sweep per
    thread over its ranges and launches in time order (a thread's ranges nest), ranges
    half-open as profiling/kernel_timeline.py takes them."""
    per_thread: dict = collections.defaultdict(list)
    for e in ev:
        if e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("tid"))
        if e.get("cat") == "user_annotation" and wanted(str(e.get("name", ""))):
            # (time, 0: a range opens before a launch at its start, longer ranges first)
            per_thread[key].append((e["ts"], 0, -e.get("dur", 0), e["name"]))
        elif e.get("cat") in LAUNCH_CATS:
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                per_thread[key].append((e["ts"], 1, 0, c))
    out: dict = {}
    for items in per_thread.values():
        if not any(kind == 0 for _, kind, _, _ in items):
            continue
        items.sort(key=lambda x: x[:3])
        stack: list = []  # (end, name) of the ranges open, outermost first
        for ts, kind, neg_dur, what in items:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if kind == 0:
                stack.append((ts - neg_dur, what))
            elif stack:
                out[what] = [name for _, name in stack]
    return out


def phase_kernels(ev: list, kern: list, steps: int) -> dict:
    """A speculative round's kernel time per phase (``phase_kernel_us``: phase -> its total and
    its kernels' microseconds per round), from the phase ranges of a PhaseTimer with ranges on:
    a kernel belongs to the phase whose range launched it (the launch call's correlation id,
    which a CUDA graph's kernels share with its cudaGraphLaunch). Empty without such ranges."""
    from systems.spec.decoder import PHASE_RANGE

    paths = launch_ranges(ev, lambda n: n.startswith(PHASE_RANGE))
    if not paths:
        return {}
    phase_of = {c: names[-1][len(PHASE_RANGE) :] for c, names in paths.items()}
    per = collections.defaultdict(collections.Counter)
    for e in kern:
        phase = phase_of.get((e.get("args") or {}).get("correlation"))
        if phase is not None:
            per[phase][e["name"][:80]] += e.get("dur", 0)
    return {
        "phase_kernel_us": {
            phase: {
                "total": sum(c.values()) / steps,
                "top": {n: t / steps for n, t in c.most_common(8)},
            }
            for phase, c in per.items()
        }
    }


def floor_bytes(m, batch: int, context: int, queries: int, drafter=None) -> dict:
    """The HBM bytes a step or round must read once. The embedding table counts only the rows
    the step gathers; the indexer reads each request's keys once per call, whatever its query
    count (systems/kernels/index_scores.py), while each query reads its own selected rows. A
    round adds its drafter (``drafter_bytes``)."""
    w = m.weight_bytes(2) - m.vocab_size * m.hidden_size * 2  # the embedding table: gathered
    w += batch * queries * m.hidden_size * 2
    kv = batch * queries * m.num_layers * m.index_topk * m.row_bytes
    idx = batch * m.num_selecting_layers * context * m.index_row_bytes
    dr = drafter_bytes(m, drafter, batch, queries) if drafter is not None else 0
    return {
        "weight_bytes": w,
        "selected_kv_bytes": kv,
        "index_scan_bytes": idx,
        "drafter_bytes": dr,
        "floor_ms": (w + kv + idx + dr) / HBM_BPS * 1e3,
    }


def drafter_bytes(m, drafter, batch: int, queries: int) -> int:
    """A round's drafting reads: per proposal pass the drafter's weights and the target's LM
    head (its logits), and every request's ring window, then one catch-up pass (no LM head).
    Proposal passes per round: DFlash2 one for the block, DSpark one per drafted token (K - 1)."""
    weights = drafter.fixed_bytes - drafter.ring.nbytes
    window = batch * drafter.ring.nbytes // max(drafter.ring.num_slots, 1)
    passes = max(queries - 1, 1) if drafter.name == "dspark" else 1
    lm_head = m.hidden_size * m.vocab_size * 2
    return passes * (weights + lm_head + window) + weights + window


def steps_per_row(args) -> int:
    """Engine steps a row runs; every request's output cap covers them all, so the batch stays
    whole until the graph replays at the end (a finished request's slot is released, and a
    replay over a released slot would read freed pages)."""
    # --host-profile: its pipelined steps, and the landing wave's (_landing_profile)
    host = args.steps + HANDOFF_STEPS + 1 if args.host_profile else 0
    # --handoff-trace / --handoff-pipelined: a wave each after the timed ones (and an earlier
    # wave's landing), the plain steps before the pipelined wave, so that the batch they
    # measure is still whole; like --fill-steps, they lengthen the caps (pass --context to
    # compare with rows measured without them: the automatic context may be a bucket lower)
    extra = 2 * EXTRA_WAVE_STEPS if getattr(args, "handoff_trace", False) else 0
    if getattr(args, "handoff_pipelined", False):
        extra += 2 * EXTRA_WAVE_STEPS + PIPELINED_PLAIN_STEPS + 1
    return (
        args.warmup + 2 * args.steps + host + extra + HANDOFF_STEPS + args.profile_steps + CAP_SLACK
    )


CAP_SLACK = 4  # steps an output cap covers beyond those a row runs


def fill_allowance(max_context_len: int, context: int, rounds: int, asked: int) -> int:
    """``--fill-steps``, checked against the positions the context leaves (a round's block of
    up to 8 queries each, as ``row_configs`` fits the context)."""
    room = (max_context_len - context) // 8 - rounds - 1
    if asked > room:
        raise ValueError(
            f"--fill-steps {asked}: the context {context} leaves room for {max(room, 0)} more "
            f"steps in model.max_context_len {max_context_len}"
        )
    return asked


def fill_batch(eng, reqs, batch: int, allowance: int = 0) -> int:
    """Step the engine until ``batch`` requests run; returns the steps it took. Raises, naming
    the admission's waits, once a request has finished first (failed, or its output cap
    reached while others waited: the batch could then never fill) or the fill has taken more
    steps than the caps spare before the graph replay (``allowance``, ``--fill-steps``, plus
    the handoff waves' steps and ``CAP_SLACK``): a replay over a released slot reads freed
    pages. A fill past ``allowance + CAP_SLACK`` steps alone may shrink the batch during the
    handoff waves, which the row then says (``handoff_batch_shrank``)."""
    steps = 0
    while len(eng.scheduler.running) < batch:
        done = [r for r in reqs if r.finish_reason is not None]
        if done or steps > allowance + CAP_SLACK + HANDOFF_STEPS:
            why = f", {len(done)} requests finished ({done[0].finish_reason})" if done else ""
            raise RuntimeError(
                f"the batch of {batch} did not fill within {steps} steps: "
                f"{len(eng.scheduler.running)} running{why}; admission waits "
                f"{dict(eng.scheduler.wait_reason_counts)} (--fill-steps {allowance} lets the "
                "output caps cover that many steps of admission; raise it)"
            )
        eng.step()
        steps += 1
    return steps


def bucket_context(context: int, span: int, l_step: int) -> int:
    """A context at which a row's queries (positions ``context`` .. ``context + span``) stay in
    one CUDA graph scan bucket (``engine.cuda_graph_scan_step``): ``context`` where they do,
    else the next bucket's start. A row that crossed a bucket would capture the next bucket's
    graphs among its timed steps."""
    bucket = lambda need: -(-need // l_step)  # noqa: E731  (need = largest position + 1)
    if bucket(context + 1) == bucket(context + span + 1) or span + 1 > l_step:
        return context
    return bucket(context + 1) * l_step


def replay_ms(eng, n: int, torch) -> float | None:
    """The last replayed target graph, replayed ``n`` times back to back: device time only.
    Replaying rewrites the last step's KV rows with the same bytes and re-runs its selections,
    so the engine's state stays consistent for the steps after."""
    gr = eng.graph_runner
    if gr is None or gr.broken or not gr.graphs:
        return None
    g = next(reversed(gr.graphs.values())).graph
    if g is None:
        return None
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def host_profiler(args):
    """A running cProfile when ``--host-profile`` asks for one, else None."""
    if not args.host_profile:
        return None
    import cProfile

    pr = cProfile.Profile()
    pr.enable()
    return pr


def host_profile_rows(pr, steps: int, top: int) -> list[dict] | None:
    """Stop ``pr``; its ``top`` functions by own host time, per step."""
    if pr is None:
        return None
    import pstats

    pr.disable()
    st = pstats.Stats(pr).sort_stats("tottime")
    return [
        {
            "function": f"{Path(f).name}:{line}:{name}",
            "calls_per_step": n / steps,
            "own_ms_per_step": tt / steps * 1e3,
        }
        for (f, line, name), (_, n, tt, _, _) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[
            :top
        ]
    ]


HANDOFFS = 4  # handoffs in flight for ``handoff_step_ms`` (issue 22's target: <= +10%)
HANDOFF_STEPS = 60  # at most this many steps in all (admitting steps included)
HANDOFF_SAMPLES = 8  # waves are repeated until this many steps ran with copies in flight


def handoff_steps(eng, prompt, args, torch) -> dict:
    """Step time while ``HANDOFFS`` requests of the same context arrive (their prefill is
    cached: only the handoff runs), synchronized per step like ``step_ms``. The new requests
    ask for one token, the prefill's: they finish on arrival and never join the batch, so the
    steps timed are the batch's own (a larger batch would be a new graph, eager at first).
    Steps are told apart by what happened in them: the admitting step (reservations, the
    copies queued), steps with copies in flight beside them (``handoff_step_ms``, the
    target's subject) and steps in which requests landed (``handoff_arrival_step_ms``: their
    first token, release and, for the adaptive backend, the population that follows). A
    wave's copies often complete within a step or two of its admitting step, so waves are
    repeated until ``HANDOFF_SAMPLES`` steps ran with copies in flight; the first admitting
    step is profiled on the host. The backend's counters over the waves say what the steps
    did besides (``handoff_counters``, HANDOFF_COUNTERS: populated pages, host backups,
    host-fetched rows, the adaptive backend's reclaims and where their backups ran)."""
    # the decode stream only: torch.cuda.synchronize() would also wait for the handoff stream,
    # timing the copies instead of the steps beside them
    sync = torch.cuda.current_stream().synchronize
    inflight, landed, admits, waves, admit_profile = [], [], [], [], None
    c0 = eng.backend.metrics()
    steps = 0
    while len(inflight) < HANDOFF_SAMPLES and steps < HANDOFF_STEPS:
        _submit_wave(eng, prompt)
        sync()
        pr = host_profiler(args) if not admits else None
        t0 = t_wave = time.perf_counter()
        eng.step()  # intake and admission: reservations, the copies queued
        sync()
        admits.append((time.perf_counter() - t0) * 1e3)
        steps += 1
        if pr is not None:
            admit_profile = host_profile_rows(pr, 1, args.host_profile)
        # until the wave has arrived (its requests finish in the step they arrive in)
        while eng.scheduler.arriving and steps < HANDOFF_STEPS:
            arrived = eng.stats["handoffs_total"]  # counts requests as they land
            t0 = time.perf_counter()
            eng.step()
            sync()
            dt = time.perf_counter() - t0
            (landed if eng.stats["handoffs_total"] > arrived else inflight).append(dt)
            steps += 1
        if not eng.scheduler.arriving and pr is None:  # the whole wave landed (not profiled)
            waves.append(time.perf_counter() - t_wave)
        torch.cuda.synchronize()
    c1 = eng.backend.metrics()
    land_profile = _landing_profile(eng, prompt, args, sync) if args.host_profile else None
    wave_trace = (
        _wave_trace(eng, prompt, sync, torch) if getattr(args, "handoff_trace", False) else None
    )
    pipelined = (
        _pipelined_wave(eng, prompt, sync, torch)
        if getattr(args, "handoff_pipelined", False)
        else {}
    )

    def med_ms(v):
        return statistics.median(v) * 1e3 if v else None

    return {
        # with --host-profile the first admitting step was timed under cProfile (slower)
        **(
            {"handoff_admit_host_profile": admit_profile, "handoff_admit_profiled": True}
            if admit_profile
            else {}
        ),
        # with --host-profile, one more wave's first step in which requests landed, under
        # cProfile (not among the timed steps): what landing costs on the host
        **({"handoff_arrival_host_profile": land_profile} if land_profile else {}),
        **({"handoff_wave_trace": wave_trace} if wave_trace else {}),
        **pipelined,
        "handoff_admit_step_ms": statistics.median(admits),
        "handoff_step_ms": med_ms(inflight),
        "handoff_steps": len(inflight),
        "handoff_arrival_step_ms": med_ms(landed),
        "handoff_arrival_steps": len(landed),
        "handoff_waves": len(admits),
        # from a wave's admitting step to the end of the step its last request landed in: the
        # handoff's own time (TTFT's part), which a copy slowed to spare the steps lengthens
        "handoff_wave_ms": med_ms(waves),
        "handoff_counters": counter_changes(c0, c1),
        # per step of the waves, beside the row's own host_rows_per_step: the adaptive
        # backend's admissions reclaim running requests' optional pages, whose selections then
        # come from host (their slowdown is the policy's, not the copies')
        **{
            name: (c1[k] - c0[k]) / steps if k in c0 and k in c1 and steps else None
            for name, k in (
                ("handoff_host_rows_per_step", "dhs_host_rows_copied_total"),
                ("handoff_backup_rows_per_step", "dhs_host_backup_rows_total"),
            )
        },
    }


def _landing_profile(eng, prompt, args, sync) -> list[dict] | None:
    """The host profile of the first step in which a wave of ``HANDOFFS`` arrivals lands (their
    first token, release and the decoder's set-up: a drafter's ring fill): one more wave after
    the timed ones, each of its steps profiled until one lands."""
    _submit_wave(eng, prompt)
    eng.step()  # admission
    sync()
    for _ in range(HANDOFF_STEPS):
        if not eng.scheduler.arriving:
            return None  # landed within the admitting step: nothing apart to profile
        arrived = eng.stats["handoffs_total"]
        pr = host_profiler(args)
        eng.step()
        sync()
        rows = host_profile_rows(pr, 1, args.host_profile)
        if eng.stats["handoffs_total"] > arrived:
            return rows
    return None


def _wave_trace(eng, prompt, sync, torch) -> dict:
    """One more wave of ``HANDOFFS`` arrivals under torch.profiler, from its admitting step to
    the step it lands in (at most ``EXTRA_WAVE_STEPS``; ``landed``: whether it did): each
    step's wall time and the GPU's work per stream over the wave (``wave_activity``). Earlier
    waves land first, unprofiled (``clean_start``: all did). ``batch``: the requests running
    at its start and end (``steps_per_row`` counts its steps in the output caps)."""
    from torch.profiler import ProfilerActivity, profile

    from profiling.ranges import enable_ranges

    clean = _land_earlier_waves(eng)
    before = _submit_wave(eng, prompt)
    torch.cuda.synchronize()
    running = [len(eng.scheduler.running)]
    steps_ms = []
    c0 = eng.backend.metrics()
    ranges_were = enable_ranges(True)  # the engine's ranges say what each stream's work is
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(EXTRA_WAVE_STEPS):
                t0 = time.perf_counter()
                eng.step()
                sync()
                steps_ms.append((time.perf_counter() - t0) * 1e3)
                if _wave_landed(eng, before):
                    break
            torch.cuda.synchronize()
    finally:
        enable_ranges(ranges_were)
    running.append(len(eng.scheduler.running))
    counters = counter_changes(c0, eng.backend.metrics())
    streams = wave_activity(chrome_trace(prof))
    return {
        "steps_ms": steps_ms,
        "counters": counters,
        "landed": _wave_landed(eng, before),
        "clean_start": clean,
        "batch": running,
        "streams": streams,
    }


# the backend's counters a handoff row reports the change of, over its waves and over a traced
# wave: population, host backups and fetches, and the adaptive backend's reclaims (pages backed
# up on the decode stream or beside it, requests reclaimed for a lent slot region)
HANDOFF_COUNTERS = (
    "dhs_populated_pages_total",
    "dhs_host_backup_rows_total",
    "dhs_selected_rows_from_host_total",
    "dhs_host_rows_copied_total",
    "dhs_selected_rows_total",
    "dhs_reclaim_events_total",
    "dhs_reclaim_backup_pages_sync_total",
    "dhs_reclaim_backup_pages_async_total",
    "dhs_region_reclaims_total",
)


def counter_changes(before: dict, after: dict) -> dict:
    """HANDOFF_COUNTERS' change between two ``backend.metrics()`` (those both have)."""
    return {k: after[k] - before[k] for k in HANDOFF_COUNTERS if k in before and k in after}


PIPELINED_PLAIN_STEPS = 10  # plain steps timed beside --handoff-pipelined's wave
# at most this many steps for an earlier wave to land, then for the extra wave (a 49K-token wave
# of four lands in about 8 steps): what the extra waves add to the output caps, kept small
# enough for fig4_h200's 49K context
EXTRA_WAVE_STEPS = 20


def _land_earlier_waves(eng) -> bool:
    """Step until no handoff is arriving (at most ``EXTRA_WAVE_STEPS``); whether none is."""
    for _ in range(EXTRA_WAVE_STEPS):
        if not eng.scheduler.arriving:
            break
        eng.step()
    return not eng.scheduler.arriving


def _submit_wave(eng, prompt) -> int:
    """``HANDOFFS`` one-token arrivals of ``prompt``; the engine's landed count before them."""
    from systems.engine.request import Request, SamplingParams

    before = eng.stats["handoffs_total"]
    for _ in range(HANDOFFS):
        eng.submit(Request(eng.new_rid(), prompt, SamplingParams(max_new_tokens=1)))
    return before


def _wave_landed(eng, before: int) -> bool:
    """Every request of the wave submitted at ``before`` has landed (the engine counts each as
    it lands; an admission deferred by a bound is not a landing)."""
    return eng.stats["handoffs_total"] - before >= HANDOFFS


def _pipelined_wave(eng, prompt, sync, torch) -> dict:
    """A wave of ``HANDOFFS`` arrivals as a served engine runs it: steps back to back with no
    synchronization until the end, so that admission's host work overlaps the step in flight
    (overlap scheduling), as it does when served. Each window is timed between ``step()``
    returns, which under overlap scheduling come once the previous step has finished on the
    GPU: ``handoff_pipelined_plain_step_ms`` over ``PIPELINED_PLAIN_STEPS`` steps with no
    handoff, then ``handoff_pipelined_step_ms`` from the step that admits the wave, submitted
    at the end of the plain window, to the one it lands in (at most ``EXTRA_WAVE_STEPS``);
    their ratio is what the wave costs the steps around it when served. Earlier waves land
    first (``handoff_pipelined_clean_start``: all did); ``handoff_pipelined_batch`` gives the
    requests running at the start and end."""
    clean = _land_earlier_waves(eng)
    running = [len(eng.scheduler.running)]
    eng.step()  # the pipeline's first step: one in flight from here on
    t0 = time.perf_counter()
    for _ in range(PIPELINED_PLAIN_STEPS):
        eng.step()
    t1 = time.perf_counter()
    before = _submit_wave(eng, prompt)
    steps = 0
    while steps < EXTRA_WAVE_STEPS and not _wave_landed(eng, before):
        eng.step()
        steps += 1
    t2 = time.perf_counter()
    sync()
    running.append(len(eng.scheduler.running))
    torch.cuda.synchronize()
    return {
        "handoff_pipelined_step_ms": (t2 - t1) / max(steps, 1) * 1e3,
        "handoff_pipelined_plain_step_ms": (t1 - t0) / PIPELINED_PLAIN_STEPS * 1e3,
        "handoff_pipelined_steps": steps,
        "handoff_pipelined_landed": _wave_landed(eng, before),
        "handoff_pipelined_clean_start": clean,
        "handoff_pipelined_batch": running,
    }


def _gpu_time(eng) -> tuple[float, float]:
    return eng.stats["decode_gpu_seconds_total"], eng.stats["decode_gpu_span_seconds_total"]


def measure(eng, m, batch: int, args, torch) -> dict:
    """Fill ``batch`` requests, time steps, profile a few, let the batch finish."""
    from systems.engine.request import Request, SamplingParams
    from systems.spec.decoder import PhaseTimer

    spec = eng.cfg.speculation
    rounds = steps_per_row(args)
    # requests admitted first decode while the last ones wait for memory (an adaptive pool
    # reclaiming for them); --fill-steps lets their output cap cover that many steps more
    # (it also reserves more memory per request, so rows of different values differ)
    fill = args.fill_steps  # checked against the context by main
    new_tokens = (rounds + fill) * (spec.k_max if spec else 1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, m.vocab_size, (args.context,), generator=g).tolist()
    params = SamplingParams(max_new_tokens=new_tokens, temperature=args.temperature)
    reqs = [Request(eng.new_rid(), prompt, params) for _ in range(batch)]
    for r in reqs:
        eng.submit(r)
    fill_steps = fill_batch(eng, reqs, batch, fill)  # admission (prefill once, handoffs)
    times, timer, c0 = [], None, None
    for i in range(args.warmup + args.steps):
        if spec and i == args.warmup:
            timer = eng.decoder.phase_timer = PhaseTimer(eng.device)
        if i == args.warmup:
            c0 = eng.backend.metrics()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        eng.step()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    c1 = eng.backend.metrics()

    def per_step(key: str) -> float:
        return (c1.get(key, 0) - c0.get(key, 0)) / max(len(times), 1)

    # rows the timed steps copied from pinned host memory over PCIe (HiSparse's misses: a row
    # several of a round's queries select is copied once), and that traffic's own floor at the
    # bulk pinned-copy rate: a step cannot beat either floor
    host_rows = per_step("dhs_host_rows_copied_total")
    row = {
        "host_rows_per_step": host_rows,
        "host_selections_per_step": per_step("dhs_selected_rows_from_host_total"),
        # adaptive residency's population (host history copied back into free pages) during
        # the timed steps: work a step does besides decoding
        "populated_pages_per_step": (
            c1.get("dhs_populated_pages_total", 0) - c0.get("dhs_populated_pages_total", 0)
        )
        / max(len(times), 1),
        "host_floor_ms": host_rows * m.row_bytes / PCIE_BPS * 1e3,
        "step_ms": statistics.median(times) * 1e3,
        "fill_steps": fill_steps,  # steps the batch took to be admitted
        **({"fill_steps_allowed": fill} if fill else {}),
        "step_ms_p10": statistics.quantiles(times, n=10)[0] * 1e3,
        "step_ms_p90": statistics.quantiles(times, n=10)[-1] * 1e3,
    }
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g0 = None
    for i in range(args.steps):
        eng.step()
        if i == 3:  # past the first steps, whose spans include the sync before the loop
            g0 = _gpu_time(eng)
    g1 = _gpu_time(eng)
    torch.cuda.synchronize()
    row["step_ms_pipelined"] = (time.perf_counter() - t0) / args.steps * 1e3
    # the server's own measure (CUDA events around steps, no profiler): the steps' share of the
    # GPU timeline they ran on, over the pipelined steps (events are read a few steps late,
    # at both ends alike)
    span = g1[1] - g0[1] if g0 else 0.0
    row["busy_share_events"] = (g1[0] - g0[0]) / span if span > 0 else None
    if timer is not None:
        torch.cuda.synchronize()
        row["phases_ms"] = {p: statistics.median(v) for p, v in timer.ms().items() if v}
        # the profiled rounds open a range per phase: their kernels, per phase
        eng.decoder.phase_timer = PhaseTimer(eng.device, ranges=True)
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profile_steps):
            with record_function(STEP_RANGE):
                eng.step()
        torch.cuda.synchronize()
    if timer is not None:
        eng.decoder.phase_timer = None
    row.update(trace_activity(chrome_trace(prof)))
    if args.host_profile:
        torch.cuda.synchronize()
        pr = host_profiler(args)
        for _ in range(args.steps):
            eng.step()
        torch.cuda.synchronize()
        row["host_profile"] = host_profile_rows(pr, args.steps, args.host_profile)
    row["replay_ms"] = replay_ms(eng, args.steps, torch)
    # last: the waves' requests leave the batch's state behind them changed (adaptive
    # residency reclaims optional pages for them and repopulates after), so the profile, the
    # host profile and the replay above measure the state the timed steps ran in
    row.update(handoff_steps(eng, prompt, args, torch))
    # a request that reached its cap during the waves (a slow fill spent part of it)
    row["handoff_batch_shrank"] = any(r.finish_reason is not None for r in reqs)
    for r in reqs:
        eng.abort(r)
    eng.run_until_idle()
    row["cuda_graph"] = eng.graph_runner is not None and not eng.graph_runner.broken
    return row


def row_configs(args, batches: list[int], reach: int):
    """Fill ``args``' defaults from ``--experiment`` (its model, temperature; its pool unless
    --kv-pool-gib) and return ``row_cfg(model, system)``: a row's composed config, on the
    experiment's where one is named (its slots where they hold the batch and its handoffs), else
    on hardware=h200 with a 24 GiB pool; speculative systems verify with calibrated acceptance.
    ``reach``: the steps a request may decode (the row's and ``--fill-steps``), which its output
    cap, and so the context that leaves room for it, are sized by."""
    from systems.engine.config import compose

    base = [f"experiment={args.experiment}"] if args.experiment else ["hardware=h200"]
    exp = compose(base) if args.experiment else None
    if args.models is None:
        args.models = exp.model.name if exp else "glm53_mini"
    if args.temperature is None:
        args.temperature = float(exp.workload.temperature or 0.0) if exp else 0.0
    if args.kv_pool_gib is None and not exp:
        args.kv_pool_gib = 24.0
    if args.context is None and exp:
        # the experiment's input where the rows' positions (the output cap and a block) fit its
        # context, else a scan bucket's start below that (fig4_h200: 50,000 -> 49,152)
        fit = int(exp.model.max_context_len) - (reach * 8 + 8)
        step = int(exp.engine.cuda_graph_scan_step)
        want = int(exp.workload.input_len)
        args.context = want if want <= fit else fit // step * step
    elif args.context is None:
        args.context = 16384
    # the experiment's slots where they hold the batch and its handoffs (a pool's layout
    # follows its slots)
    slots = max(max(batches) + HANDOFFS, exp.hardware.max_running_requests if exp else 0)

    def row_cfg(model: str, system: str, variant: tuple[str, ...] = ()):
        return compose(
            [
                *base,
                "device=cuda",
                f"model={model}",
                f"system={system}",
                *([f"hardware.kv_pool_gib={args.kv_pool_gib}"] if args.kv_pool_gib else []),
                f"hardware.max_running_requests={slots}",
                f"workload.input_len={args.context}",
                f"workload.output_len={reach * 8}",
                "++reproduce.speculation.acceptance=calibrated",
                *args.overrides,
                *variant,
            ]
        )

    return row_cfg


def parse_variants(text: str | None) -> list[tuple[str, ...]]:
    """``--variants``: override sets separated by ';', each a shell-quoted list of Hydra
    overrides ('' stands for none: the build as it is). Sets must differ: a set's rows are
    keyed by its overrides."""
    if not text:
        return [()]
    sets = [tuple(shlex.split(v)) for v in text.split(";")]
    if len(set(sets)) < len(sets):
        raise ValueError(f"--variants: a set is given twice in {text!r} (use --repeats)")
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--experiment",
        default=None,
        help="compose every row on this experiment's config (e.g. fig4_h200): its model, KV pool, "
        "slots, host pool, drafter width and sampling temperature, so that the rows stand in the "
        "state its served runs decode in (adaptive residency holds what its pool holds there); "
        "without it, hardware=h200 with --kv-pool-gib",
    )
    ap.add_argument("--models", default=None, help="default: the experiment's, else glm53_mini")
    ap.add_argument("--systems", default="hisparse,adaptive_hisparse,adaptive_dhisparse")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument(
        "--context",
        type=int,
        default=None,
        help="prompt length per request (default: the experiment's input, at a scan bucket's "
        "start where the rows' positions must fit its context; else 16384)",
    )
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--fill-steps",
        type=int,
        default=0,
        help="engine steps more that the output caps cover, for a batch whose admission takes "
        "that long (its first requests decode meanwhile; default 0)",
    )
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="the batch's sampling temperature (default: the experiment's, else 0; the H200 "
        "presets' experiments sample at 1.0: greedy outputs of random weights cycle, which "
        "changes the host-fetched share)",
    )
    ap.add_argument(
        "--variants",
        default=None,
        metavar="A;B;...",
        help="override sets to compare, ';'-separated, each a space-separated list of Hydra "
        "overrides ('' for none), e.g. 'system.kv.copy_programs_per_request=1;"
        "system.kv.copy_programs_per_request=2': every row is measured once per set, the sets "
        "interleaved within each repeat (A B A B ...: one machine's drift reaches both), and "
        "each set's rows carry its overrides; a table of each set against the first follows",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="times to measure every row (with --variants: A B A B ...); rows carry `repeat`",
    )
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument(
        "--handoff-pipelined",
        action="store_true",
        help="time one more handoff wave's steps back to back, as served (admission beside the "
        "step in flight), against the plain steps just before it",
    )
    ap.add_argument(
        "--handoff-trace",
        action="store_true",
        help="profile one more handoff wave (torch.profiler): each step's time and the GPU's "
        "work per stream (rows' handoff_wave_trace)",
    )
    ap.add_argument(
        "--host-profile",
        type=int,
        default=0,
        metavar="N",
        help="record the N functions with the most own host time per step",
    )
    ap.add_argument(
        "--kv-pool-gib", type=float, default=None, help="default: the experiment's, else 24"
    )
    ap.add_argument("--out", default=str(REPO / "results" / "engine_step" / "summary.json"))
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="FILE",
        help="merge these summaries' rows (a GPU batch's output) into --out and exit",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every engine")
    args = ap.parse_args()
    if args.merge:
        try:
            n = merge_rows(Path(args.out), [Path(f) for f in args.merge])
        except ValueError as e:
            sys.exit(f"bench_decode_step --merge: {e}")
        print(f"merged {len(args.merge)} file(s) into {args.out}: {n} rows")
        return

    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        sys.exit(f"bench_decode_step: {e}")
    if args.repeats < 1:
        sys.exit("bench_decode_step: --repeats must be at least 1")

    import torch

    from harness.environment import environment
    from systems.engine.config import resolve_engine_config
    from systems.engine.engine import Engine

    if not torch.cuda.is_available():
        sys.exit("bench_decode_step: no CUDA device here; run it on the GPU machine")
    batches = [int(b) for b in args.batches.split(",")]
    env = environment()
    rows = []
    rounds = steps_per_row(args)
    # steps a request may decode: the row's, and --fill-steps more while the batch is admitted
    reach = rounds + args.fill_steps
    span = reach * 8 + 8  # positions a row's requests may reach: the output cap and a block

    row_cfg = row_configs(args, batches, reach)

    # one context for every row (rows compare at it), in one scan bucket of the first row's
    # engine config, and within its model's context
    first = row_cfg(args.models.split(",")[0], args.systems.split(",")[0])
    l_step = first.engine.cuda_graph_scan_step
    for v in variants:  # the rows of every set share the context
        got = row_cfg(args.models.split(",")[0], args.systems.split(",")[0], v)
        if (got.engine.cuda_graph_scan_step, got.model.max_context_len) != (
            l_step,
            first.model.max_context_len,
        ):
            sys.exit(
                f"bench_decode_step: --variants set {' '.join(v)!r} changes the scan bucket or "
                "the context, which every row shares; compare it in a run of its own"
            )
    context = bucket_context(args.context, span, l_step)
    if context != args.context and context + span <= first.model.max_context_len:
        print(
            f"[bench_decode_step] --context {args.context} -> {context}: the rows' positions "
            f"would cross the graph scan bucket at {context} (engine.cuda_graph_scan_step "
            f"{l_step}), capturing graphs among the timed steps"
        )
        args.context = context
    try:
        fill_allowance(first.model.max_context_len, args.context, rounds, args.fill_steps)
    except ValueError as e:
        sys.exit(f"bench_decode_step: {e}")
    builds = [
        (rep, variant, model, system)
        for rep in range(1, args.repeats + 1)
        for variant in variants
        for model in args.models.split(",")
        for system in args.systems.split(",")
    ]
    for rep, variant, model, system in builds:
        cfg = row_cfg(model, system, variant)
        ecfg = resolve_engine_config(cfg)
        m = ecfg.model
        eng = Engine(ecfg)
        queries = ecfg.speculation.block_size if ecfg.speculation else 1
        for B in batches:
            row = {
                "model": model,
                "system": system,
                "batch": B,
                "context": args.context,
                # a row measured with other settings than the experiment's is another row
                **({"overrides": [*args.overrides, *variant]} if args.overrides or variant else {}),
                **({"repeat": rep} if args.repeats > 1 else {}),
                # what sets the host-fetched share, for comparisons with served runs
                "selection_locality": m.selection_locality,
                "temperature": args.temperature,
                "experiment": args.experiment,
                "kv_pool_gib": cfg.hardware.kv_pool_gib,
                "slots": eng.backend.num_slots,
                **measure(eng, m, B, args, torch),
                **floor_bytes(m, B, args.context, queries, getattr(eng.decoder, "drafter", None)),
            }
            rows.append(row)
            write_rows(Path(args.out), rows, env, args.overrides, torch)
            print(
                (
                    f"[{rep}] {' '.join([*args.overrides, *variant]) or '(as built)'}\n"
                    if (len(variants) > 1 or args.repeats > 1) and B == batches[0]
                    else ""
                )
                + f"{model:12s} {system:20s} B={B:3d} step {row['step_ms']:7.2f} ms  "
                f"pipelined {row['step_ms_pipelined']:7.2f} ms  handoffs {row['handoff_step_ms'] or 0:6.2f} ms x{row['handoff_steps']} landing {row['handoff_arrival_step_ms'] or 0:6.2f} ms  wave {row['handoff_wave_ms'] or 0:6.1f} ms  host rows {row['host_rows_per_step'] or 0:.0f} (waves {row['handoff_host_rows_per_step'] or 0:.0f})  replay {row['replay_ms'] or 0:6.2f} ms  floor "
                f"{row['floor_ms']:6.2f} ms  busy {row['busy_share'] or 0:.2f} (events {row['busy_share_events'] or 0:.2f})  kernels "
                f"{row['kernels_per_step'] or 0:6.0f}"
                + (f"  phases {row['phases_ms']}" if "phases_ms" in row else "")
                + (
                    f"  served wave {row['handoff_pipelined_step_ms']:.2f} ms / plain "
                    f"{row['handoff_pipelined_plain_step_ms']:.2f} ms"
                    f" x{row['handoff_pipelined_steps']}"
                    if "handoff_pipelined_step_ms" in row
                    else ""
                ),
                flush=True,
            )
        del eng
        gc.collect()
        torch.cuda.empty_cache()
    for r in rows:
        if r["round_over_step"] is not None:
            print(
                f"{r['model']:12s} {r['system']:20s} B={r['batch']:3d} round / {ROUND_BASE} step "
                f"ours {r['round_over_step']:.2f}  paper {PAPER_ROUND_OVER_STEP}"
                + (f"  [{' '.join(r['overrides'])}]" if r.get("overrides") else "")
                + (f"  repeat {r['repeat']}" if "repeat" in r else ""),
                flush=True,
            )
    if len(variants) > 1 or args.repeats > 1:
        for line in variant_table(rows, [[*args.overrides, *v] for v in variants]):
            print(line, flush=True)
    print(f"wrote {args.out}")


def variant_table(rows: list[dict], variants: list[list[str]]) -> list[str]:
    """Each (model, system, batch) under each override set: the median step over the repeats,
    and against the first set the ratio of medians with the range of the repeat-by-repeat
    ratios (a set and the first measured back to back in each repeat)."""
    by: dict[tuple, dict[int, float]] = {}
    for r in rows:
        key = (r["model"], r["system"], r["batch"], tuple(r.get("overrides") or ()))
        by.setdefault(key, {})[r.get("repeat", 1)] = r["step_ms"]
    out = ["model        system               batch  step ms (median)  vs the first set  overrides"]
    for key in sorted({k[:3] for k in by}):
        base = by.get((*key, tuple(variants[0])), {})
        for v in variants:
            got = by.get((*key, tuple(v)))
            if not got:
                continue
            med = statistics.median(got.values())
            cmp = ""
            if base and v != variants[0]:
                paired = [got[i] / base[i] for i in got if i in base]
                cmp = f"{med / statistics.median(base.values()):.3f}" + (
                    f" ({min(paired):.3f}-{max(paired):.3f})" if len(paired) > 1 else ""
                )
            out.append(
                f"{key[0]:12s} {key[1]:20s} {key[2]:5d}  {med:15.2f}  {cmp:16s}  "
                + (" ".join(v) or "(as built)")
            )
    return out


def row_key(r: dict) -> tuple:
    """A row's identity in the summary: rows of another experiment's state (or of none) are
    other rows, never replaced by these."""
    return (
        r["model"],
        r["system"],
        r["batch"],
        r["context"],
        r.get("experiment"),
        tuple(r.get("overrides") or ()),
        r.get("repeat", 1),
        r.get("fill_steps_allowed", 0),  # longer caps reserve more memory per request
    )


def write_rows(path: Path, rows: list[dict], env: dict, overrides: list, torch) -> None:
    """Merge ``rows`` into the summary at ``path`` by ``row_key``, with
    each speculative row's round / plain-step ratio where the plain row of its model and batch
    is known. Called after every row, so a run cut by a time box keeps what it measured."""

    def build(r):  # the same build and repeat: a round against its own plain step
        return (
            r["model"],
            r["batch"],
            tuple(r.get("overrides") or ()),
            r.get("repeat", 1),
            r.get("fill_steps_allowed", 0),
        )

    plain = {build(r): r["step_ms"] for r in rows if r["system"] == ROUND_BASE}
    for r in rows:
        base = plain.get(build(r)) if "phases_ms" in r else None
        r["round_over_step"] = r["step_ms"] / base if base else None
        if base:  # the step it was divided by, measured in the same run (synced times both):
            # the ratio stays readable when a later run replaces that base row in the file
            r["round_base"] = ROUND_BASE
            r["round_base_step_ms"] = base
        r["commit"] = env.get("git_commit")
    head = {
        "gpu": env.get("gpu") or torch.cuda.get_device_name(),
        "commit": env.get("git_commit"),
        "hbm_bytes_per_s": HBM_BPS,
        "overrides": overrides,
    }
    _merge_into(path, [{**head, "rows": rows}])


def _merge_into(path: Path, summaries: list[dict]) -> int:
    """Merge each summary's rows into the one at ``path`` by ``row_key`` (its rows replace those
    of the same key, the rest stay), its other keys (gpu, commit, ...) over the file's; written
    whole at once. Returns the row count."""
    rec = json.loads(path.read_text()) if path.exists() else {"rows": []}
    for new in summaries:
        # one file, one kind of GPU: its rows are compared with each other (a machine asked for
        # an H200 may be an H100)
        if rec.get("rows") and rec.get("gpu") and new.get("gpu") and new["gpu"] != rec["gpu"]:
            raise ValueError(
                f"rows measured on {new['gpu']} do not go into {path}, whose rows are the "
                f"{rec['gpu']}'s: --out names a file of their own"
            )
        keys = {row_key(r) for r in new.get("rows", [])}
        rows = [r for r in rec.get("rows", []) if row_key(r) not in keys] + new.get("rows", [])
        rec = {**rec, **{k: v for k, v in new.items() if k != "rows"}, "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return len(rec["rows"])


def merge_rows(dst: Path, sources: list[Path]) -> int:
    """Merge the rows of summaries written elsewhere (a GPU batch's $OUT/bench_decode_step.json)
    into ``dst`` by ``row_key``: a source's row replaces ``dst``'s of the same key, the rest stay
    with their own commits; ``dst``'s gpu / commit become the last source's. Returns the row
    count."""
    return _merge_into(dst, [json.loads(Path(src).read_text()) for src in sources])


if __name__ == "__main__":
    main()
