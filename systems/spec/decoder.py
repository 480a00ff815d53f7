"""Decoders: how the engine turns a running batch into new tokens.

``PlainDecoder``: one query per request per step. ``SpeculativeDecoder``: a drafter proposes,
the target verifies K_r queries per request in one pass over the same KV backend (query j at
position n + j sees committed history plus block positions 0..j, eq. 5; the backend resolves
the union of the K_r selections, eq. 6), the acceptance rule decides, and the backend commits
the anchor and accepted drafts (eq. 7). The engine calls ``decode(batch)`` on either one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from systems.engine.sampler import sample
from systems.host_sync import UniformValues, start_readback, to_device
from systems.models.drafters import redraw
from systems.spec.acceptance import (
    accept_calibrated,
    accept_exact,
    accept_greedy,
    calibrated_alpha,
)
from systems.spec.config import SpeculationConfig
from systems.spec.ring import ring_address

# names of the profiler ranges a PhaseTimer with ``ranges`` opens: PHASE_RANGE + phase
PHASE_RANGE = "spec_phase:"


class PhaseTimer:
    """Per-round time of the phases of a speculative round (off unless a benchmark turns it on):
    CUDA events on a GPU (read after the caller synchronizes), wall clock on CPU. With
    ``ranges``, each phase is also a profiler range (``PHASE_RANGE`` + its name), so a trace can
    say which kernels each phase launched (benchmarks/bench_decode_step.py)."""

    # accept: acceptance and the one readback queued; catch_up: the drafter's catch-up (the host
    # reads the readback meanwhile). The commit's backups run when the round is read, which under
    # overlap scheduling is after the next round was queued: they are not a phase of this one.
    PHASES = ("propose", "verify", "accept", "catch_up")

    def __init__(self, device: torch.device, ranges: bool = False):
        self.cuda = device.type == "cuda"
        self.rounds: list[list] = []
        self.ranges = ranges
        self._open = None  # the phase range entered and not yet exited

    def mark(self, round_marks: list) -> None:
        """A phase boundary: the i-th mark of a round ends phase i - 1 and starts phase i."""
        if self.ranges:
            if self._open is not None:
                self._open.__exit__(None, None, None)
                self._open = None
            i = len(round_marks)
            if i < len(self.PHASES):
                self._open = torch.profiler.record_function(PHASE_RANGE + self.PHASES[i])
                self._open.__enter__()
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            round_marks.append(ev)
        else:
            round_marks.append(time.perf_counter())

    def ms(self) -> dict[str, list[float]]:
        """Phase -> per-round milliseconds (call after a synchronize)."""
        out = {p: [] for p in self.PHASES}
        for marks in self.rounds:
            for p, a, b in zip(self.PHASES, marks, marks[1:]):
                out[p].append(a.elapsed_time(b) if self.cuda else (b - a) * 1e3)
        return out


@dataclass
class InflightStep:
    """A plain decode step launched but not yet read back (overlap scheduling): its batch, the
    sampled tokens on the device and their pinned host copy in flight, and the requests whose
    slots are released once this step has completed (they finished while it was queued)."""

    batch: list
    tokens: torch.Tensor  # (B,) int64 on the device: the next step's inputs
    host: torch.Tensor  # (B,) int64, pinned on a GPU: filled by start_readback
    done: object  # CUDA event after the copy, or None on CPU (the copy was synchronous)
    index: dict = field(default_factory=dict)  # id(request) -> row in this step
    release_after: list = field(default_factory=list)

    def read(self) -> list[list[int]]:
        """Each request's new tokens (one per request), after the copy has landed."""
        if self.done is not None:
            self.done.synchronize()
        return [[t] for t in self.host.tolist()]


@dataclass
class InflightRound(InflightStep):
    """A speculative round launched but not yet read back: ``tokens`` are its next tokens (the
    following round's anchors) and ``n_next`` the next anchor positions (the following round's inputs, on the device);
    ``host`` receives (accepted, next, K_r verified, K_r wanted, drafts) per request. Reading
    it commits it."""

    n_next: torch.Tensor | None = None
    decoder: object = None
    width: int = 0
    t0: float = 0.0

    def read(self) -> list[list[int]]:
        return self.decoder._finish_round(self)


class PlainDecoder:
    """One query per request per step. ``decode`` runs a step and reads its tokens; ``launch``
    (overlap scheduling) runs a step whose inputs may be the previous step's tokens still on
    the device, and leaves its own tokens to be read later (``InflightStep.read``)."""

    max_queries = 1
    max_emit = 1  # tokens a step can emit per request
    supports_overlap = True
    commit_lag = 0  # launch commits its step's rows at once (the lengths are known)
    verify_queries = 1  # a step's queries per request (warm-up graphs)
    verify_widths = False  # whether its passes name the queries each request verifies

    def __init__(self, engine):
        self.e = engine

    def on_admit(self, arrivals) -> None:
        pass

    def warm_up_graphs(self, batch_sizes) -> int:
        return 0  # no drafter

    def launch(self, batch, prev: InflightStep | None) -> InflightStep:
        """Launch one step of ``batch``. A request of ``prev``'s batch takes prev's sampled token
        (on the device, one position further than its host state says); the others their last
        output token. Commits the step's rows (one token per request) without reading them."""
        e = self.e
        dev = e.device
        B = len(batch)
        src = [prev.index.get(id(r), -1) if prev is not None else -1 for r in batch]
        pos = [r.seq_len + (i >= 0) for r, i in zip(batch, src)]
        host_tok = [0 if i >= 0 else r.output_ids[-1] for r, i in zip(batch, src)]
        # one host->device copy for the step's metadata (pinned, non-blocking)
        slots = [r.slot for r in batch]
        meta = to_device([*pos, *host_tok, *src, *slots], dev, torch.int64)
        positions = meta[:B].unsqueeze(1)
        tokens = meta[B : 2 * B]
        if prev is not None and any(i >= 0 for i in src):
            idx = meta[2 * B : 3 * B]
            tokens = torch.where(idx >= 0, prev.tokens[idx.clamp_min(0)], tokens)
        logits, _ = e.run_target(meta[3 * B :], tokens.unsqueeze(1), positions, max(pos) + 1)
        sampled = any(r.params.temperature > 0 for r in batch)
        # sample reads the temperatures only when sampling: copy them to the device only then
        t = e._temperatures(batch) if sampled else torch.zeros(B)
        new = sample(logits[:, -1], t, e.gen, sampled)
        e.backend.commit(slots, [p + 1 for p in pos])
        host, done = start_readback(new.long())
        return InflightStep(batch, new, host, done, {id(r): i for i, r in enumerate(batch)})

    def decode(self, batch) -> list[list[int]]:
        """One step, read back before it returns (synchronous scheduling)."""
        return self.launch(batch, None).read()

    def on_delivered(self, tokens: int) -> None:
        """The engine appended ``tokens`` of a step's output to its requests (no count here)."""


class SpeculativeDecoder:
    """Draft, verify K_r queries in one target pass, accept, commit."""

    def __init__(self, engine, spec: SpeculationConfig, num_slots: int):
        from systems.models.drafters import DRAFTERS

        self.e = engine
        self.cfg = spec
        self.kind = spec.drafter
        self.block = int(spec.block_size)
        self.k_max = int(spec.k_max)
        self.max_queries = self.k_max
        # overlap scheduling: a round is launched before the previous one is read back and
        # committed (``launch``), so a slot has up to two blocks beyond its last commit
        self.supports_overlap = True
        self.commit_lag = 1
        self.max_emit = self.block  # accepted drafts + the next token: at most the block
        self.mode = spec.acceptance
        emitted = spec.calibrated_emitted_per_round
        if emitted is None:  # not resolved (a test building the decoder directly)
            spec = spec.resolved(engine.cfg.model.max_context_len)
            emitted = spec.calibrated_emitted_per_round
        self.alpha = calibrated_alpha(self.block, float(emitted))
        # DSpark's prefix choice: the drafter's confidences, or the calibrated acceptance
        self.calibrated_confidence = spec.scheduler_confidence == "calibrated"
        # DSpark's scheduler: expected emitted tokens per unit of profiled engine cost
        self.cost0 = float(spec.cost_base)
        self.cost_per_query = float(spec.cost_per_query)
        self.window = int(spec.window)
        mcfg = engine.cfg.model
        self.drafter = DRAFTERS[self.kind](
            engine.model,
            num_layers=int(spec.draft_layers),
            dim=int(spec.draft_dim),
            window=self.window,
            num_slots=num_slots,
            page=mcfg.page_size,
            k_max=self.k_max,
            seed=mcfg.seed,
        )
        self._round_ms: dict[int, float] = {}  # verification width -> EMA of round time
        # K_r on the device: one width for the batch (DFlash2's block, calibrated DSpark) is a
        # cached tensor; mixed widths a queued pinned copy (a pageable one would wait for the
        # verification pass)
        self._widths = UniformValues(self.e.device, torch.int64)
        # a verification pass's usual width, which the warm-up captures (target and catch-up):
        # the whole block, except where DSpark's choice is known before any round (calibrated
        # confidence is the same for every request and round, and the cost model stays the
        # configured one until a second width is measured): warmed at the block, every round's
        # narrower pass would be captured while serving, at each batch size it meets
        self.verify_queries = self.block
        if self.kind == "dspark" and self.calibrated_confidence:
            self.verify_queries = int(self._k_r(None, torch.zeros(1, self.block - 1)).max())
        # DSpark on the drafter's confidences chooses K_r on the device (no read of the
        # proposal pass); the pass's width, which the host must know to launch it, is then the
        # widest choice of the last round read back (one round late, two under overlap
        # scheduling), each K_r clamped to it; the first round reads its own choice
        self.device_widths = self.kind == "dspark" and not self.calibrated_confidence
        # then requests verify prefixes of their own within the pass, which the KV path is told
        # (a query past a request's K_r adds nothing to the union it resolves, eq. 6)
        self.verify_widths = self.device_widths
        self._width: int | None = None
        self.phase_timer: PhaseTimer | None = None  # set by benchmarks (bench_decode_step --phases)
        self.stats = {
            "spec_rounds_total": 0,
            "spec_queries_total": 0,
            "spec_accepted_total": 0,
            "spec_emitted_total": 0,
        }

    # ------------------------------------------------------------------ admission
    def on_admit(self, arrivals) -> None:
        """Write each arrival's prompt tail, (request, prefill entry), into its slot's ring:
        the drafter's KV of the last W prompt positions, which a prompt's prefill entry keeps
        (``_prompt_ring``) as a prefill node would hand it over with the target's KV, so an
        arrival costs one scatter for the whole wave, not a catch-up on the engine thread.
        The slot's other ring rows are a previous request's: the window mask of the request's
        first round excludes them."""
        if not arrivals:
            return
        r_d = self.drafter.ring.r_d
        chunks, rows = [], []
        for req, entry in arrivals:
            kv = self._prompt_ring(req, entry)
            T, L = req.num_prompt_tokens, kv.shape[2]
            chunks.append(kv)
            rows.append(ring_address(req.slot, torch.arange(T - L, T), r_d))
        self.drafter.ring.write(to_device(torch.cat(rows), self.e.device), torch.cat(chunks, 2))

    def _prompt_ring(self, req, entry) -> torch.Tensor:
        """The drafter's ring KV of the prompt's tail (``prompt_kv``), computed at the prompt's
        first admission and kept in its prefill entry (evicted with it)."""
        kv = entry.derived.get("draft_ring")
        if kv is None:
            h = entry.tail_hidden  # (L, D): the last L = min(W, T) positions
            T = req.num_prompt_tokens
            tokens = to_device(list(req.prompt_ids[T - h.shape[0] :]), self.e.device)
            kv = entry.derived["draft_ring"] = self.drafter.prompt_kv(tokens, h)
        return kv

    # ------------------------------------------------------------------ drafter graphs
    def _drafter_graphs(self, B: int, sampled: bool):
        """The engine's drafter graph cache when this round can use it: graphs on, the batch
        within the captured sizes, no sampling inside the pass (``sampled``: a sequential
        drafter's sampled drafting draws from a generator, which stays eager), and a drafter
        whose proposal is pure device work."""
        r = self.e.graph_runner
        if (
            r is None
            or sampled
            or not r.can_run(B)
            or r.drafter.broken
            or not getattr(self.drafter, "graph_capturable", False)
        ):
            return None
        return r.drafter

    def _pad_rows(self, slots, *rest):
        """Makers of n padding rows for a drafter graph's inputs (slots, then tensors whose
        first dimension is the batch): the backend's padding slot, whose ring rows are the
        drafter's own too (DraftRing), and zeros elsewhere: anchor token and position 0,
        temperature 0, no valid catch-up row (nothing is written). None without one."""
        pad = self.e.backend.pad_slot
        if pad is None:
            return None

        def zeros(x):
            return lambda n: x.new_zeros((n, *x.shape[1:]))

        return (lambda n: slots.new_full((n,), pad), *(zeros(x) for x in rest))

    def warm_up_graphs(self, batch_sizes) -> int:
        """The drafter's graphs (proposal over the block, catch-up over ``verify_queries``) for
        ``batch_sizes``, captured on padding rows only (``_pad_rows``) before any request
        arrives (CudaGraphRunner.warm_up); the catch-up's rows are all invalid, so nothing is
        written. Returns the graphs captured."""
        K, W, dev, n = self.block, self.verify_queries, self.e.device, 0
        graphs = self._drafter_graphs(max(batch_sizes, default=0), sampled=False)
        # empty inputs of each region's dtypes and shapes: _pad_rows makes b rows of each;
        # the catch-up runs over the verified prefix (W), the proposal over the whole block
        idx, block = torch.zeros(0, dtype=torch.long, device=dev), (0, W)
        hidden = torch.zeros(
            *block, self.e.model.cfg.hidden_size, dtype=self.e.model.dtype, device=dev
        )
        propose = self._pad_rows(idx, idx, idx, torch.zeros(0, device=dev))
        catch_up = self._pad_rows(
            idx,
            idx.new_zeros(block),
            idx.new_zeros(block),
            hidden,
            torch.zeros(block, dtype=torch.bool, device=dev),
        )
        if graphs is None or propose is None:
            return 0
        for b in batch_sizes:
            rows = [make(b) for make in propose]
            n += graphs.capture(("propose", b, K), self._propose_region(K), *rows)
            rows = [make(b) for make in catch_up]
            n += graphs.capture(("catch_up", b, W), self._catch_up_region, *rows)
        return n

    def _propose_region(self, K: int):
        d = self.drafter

        def region(slots, anchors, n, temps):
            props, q = d.propose(slots, anchors, n, K, temps, None, sampled=False)
            conf = getattr(d, "last_confidence", None)  # set by this call (DSpark) or absent
            return (props, q) if conf is None else (props, q, conf)

        return region

    def _catch_up_region(self, slots, tokens, positions, hidden, valid):
        self.drafter.catch_up(slots, tokens, positions, hidden, valid)
        return ()

    # ------------------------------------------------------------------ a round
    def _k_r(self, q: torch.Tensor, proposals: torch.Tensor) -> torch.Tensor:
        """Verification prefix per request: DFlash2 uses its fixed block; DSpark maximizes
        expected emitted tokens per unit of engine cost from the drafter's confidences. Under
        calibrated acceptance (``scheduler_confidence: auto``) the confidence of every draft
        position is the calibrated per-position acceptance ``alpha``: acceptance no longer
        follows the drafter, and the mini models' random-weight drafter is unconfident enough
        that the scheduler would verify no draft at all (K_r = 1 in every round of the first
        Fig. 5 runs). On the host, except from the drafter's confidences (``device_widths``):
        on the device, where the proposal pass left them."""
        B = proposals.shape[0]
        if self.kind != "dspark":
            return torch.full((B,), self.block, dtype=torch.long)
        if self.calibrated_confidence:  # every request has the same confidences: one row
            return self._choose(torch.full((1, self.block - 1), self.alpha)).expand(B)
        return self._choose(self.drafter.last_confidence.float())  # (B, K-1), even when greedy

    def _choose(self, conf: torch.Tensor) -> torch.Tensor:
        """DSpark's scheduler: conf (R, K-1), the draft positions' confidences -> K_r (R,) in
        1..block, on conf's device."""
        surv = torch.cumprod(conf, dim=1)
        ks = torch.arange(1, self.block + 1, dtype=torch.float32, device=conf.device)
        none = torch.zeros(len(conf), 1, device=conf.device)
        exp_tokens = 1 + torch.cat([none, surv.cumsum(1)], dim=1)  # (R, K)
        a, b = self._cost_model()
        return (exp_tokens / (a + b * ks)).argmax(1) + 1

    def _cost_model(self) -> tuple[float, float]:
        """Engine cost of a verification pass of K queries, cost(K) = a + b K, profiled online:
        a least-squares line through the mean measured round time per K (EMA), once two widths
        have been seen; the configured (cost_base, cost_per_query) before that."""
        pts = sorted(self._round_ms.items())
        if len(pts) < 2:
            return self.cost0, self.cost_per_query
        ks = torch.tensor([k for k, _ in pts], dtype=torch.float64)
        ts = torch.tensor([t for _, t in pts], dtype=torch.float64)
        b = float(((ks - ks.mean()) * (ts - ts.mean())).sum() / ((ks - ks.mean()) ** 2).sum())
        a = float(ts.mean() - b * ks.mean())
        if a <= 0:
            return self.cost0, self.cost_per_query
        return 1.0, max(b, 0.0) / a  # only the ratio matters for the argmax

    def decode(self, batch) -> list[list[int]]:
        """One round, read back and committed before it returns (synchronous scheduling)."""
        return self.launch(batch, None).read()

    def launch(self, batch, prev: InflightRound | None) -> InflightRound:
        """Launch one round of ``batch`` without reading it back (overlap scheduling). A
        request of ``prev``'s batch takes its anchor position and token from ``prev`` on the
        device (its host state is one round behind); ``prev`` is committed when it is read,
        after this round was queued, so the tail ring keeps room for two blocks in flight."""
        e = self.e
        B = len(batch)
        src = [prev.index.get(id(r), -1) if prev is not None else -1 for r in batch]
        meta = to_device(
            [
                *(r.slot for r in batch),
                *(r.seq_len for r in batch),
                *(r.output_ids[-1] for r in batch),
                *src,
            ],
            e.device,
            torch.int64,
        )
        slots, n, anchors = meta[:B], meta[B : 2 * B], meta[2 * B : 3 * B]
        if prev is not None and any(i >= 0 for i in src):
            idx = meta[3 * B :]
            j = idx.clamp_min(0)
            n = torch.where(idx >= 0, prev.n_next[j], n)
            anchors = torch.where(idx >= 0, prev.tokens[j], anchors)
        # the scan's bound from the host: a request of prev is at most a block further
        hi = max(r.seq_len + (self.max_emit if i >= 0 else 0) for r, i in zip(batch, src))
        return self._round(batch, slots, n, anchors, hi)

    def _round(self, batch, slots, n, anchors, max_pos: int):
        """Propose, verify, accept on the device; queue the one readback (accepted lengths,
        next tokens, drafts) before the drafter's catch-up, which the host's reading then
        overlaps. ``max_pos``: the largest anchor position (or a bound), known on the host.
        Returns the round in flight (``InflightRound``); its ``read`` commits it."""
        e = self.e
        dev = e.device
        K = self.block
        B = len(batch)
        temps = e._temperatures(batch)
        sampled = any(r.params.temperature > 0 for r in batch)
        pt, marks = self.phase_timer, []
        if pt is not None:
            pt.rounds.append(marks)

        def mark():  # a phase boundary (PhaseTimer.PHASES), when a benchmark times the round
            if pt is not None:
                pt.mark(marks)

        mark()
        # sampled requests draw their drafts from q: exact acceptance needs it, and under
        # calibrated acceptance the accepted drafts are output (greedy drafts of random weights
        # cycle). A parallel drafter draws after its greedy pass, which stays in the graph; a
        # sequential one (DSpark) drafts eagerly to sample, so under calibrated acceptance,
        # which does not read q, it keeps greedy drafts and its graph.
        after = getattr(self.drafter, "draws_after_pass", False)
        draft_sampled = sampled and (after or self.mode == "exact")
        graphs = self._drafter_graphs(B, draft_sampled and not after)
        if graphs is not None:
            outs = graphs.run_padded(
                ("propose", B, K),
                1,
                self._propose_region(K),
                (slots, anchors, n, temps),
                self._pad_rows(slots, anchors, n, temps),
            )
            proposals, q = outs[:2]
            if len(outs) > 2:  # DSpark: the head's confidences, read by _k_r below
                self.drafter.last_confidence = outs[2]
            if draft_sampled:
                proposals = redraw(proposals, q, temps, e.gen)
        else:
            proposals, q = self.drafter.propose(slots, anchors, n, K, temps, e.gen, draft_sampled)
        mark()
        want = self._k_r(q, proposals)
        # the pass verifies the widest prefix any request asked for (DSpark saves work here)
        if self.device_widths:
            if self._width is None:
                self._width = int(want.max())
            Kv = self._width
            k_dev = want.clamp_max(Kv)
        else:
            Kv = int(want.max())
            k_dev = self._widths(want.tolist())
        proposals, q = proposals[:, : Kv - 1], q[:, : Kv - 1]
        t0 = time.perf_counter()
        # verification: queries [anchor, x_1 .. x_{K-1}] at positions n .. n + K - 1
        tokens = torch.cat([anchors.unsqueeze(1), proposals], dim=1)
        positions = n.unsqueeze(1) + torch.arange(Kv, device=dev)
        widths = k_dev if self.verify_widths else None
        logits, hidden = e.run_target(slots, tokens, positions, max_pos + Kv, widths)
        mark()
        if self.mode == "exact" and sampled:  # rejection sampling: a host loop (rare)
            A_l, nxt_l = accept_exact(logits, proposals, q, k_dev.cpu(), temps, e.gen)
            A = to_device(A_l, dev, torch.int64)
            nxt = to_device(nxt_l, dev, torch.int64)
        else:
            if self.mode == "exact":
                A, nxt = accept_greedy(logits, proposals, k_dev)
            else:
                A, nxt = accept_calibrated(logits, k_dev, self.alpha, e.gen, temps, sampled)
        # one readback (A, next, K_r verified, K_r wanted, drafts), queued before the catch-up
        # reuses the drafter's buffers
        cols = (A, nxt, k_dev, want if self.device_widths else k_dev)
        back = torch.cat([*(c.unsqueeze(1) for c in cols), proposals.long()], dim=1)
        host, read = start_readback(back)
        mark()
        # the drafter advances with the same prefix: anchor + accepted, with target features;
        # over the whole block (one graph per batch size), rows past 1 + A masked
        valid = torch.arange(Kv, device=dev).unsqueeze(0) < (1 + A).unsqueeze(1)
        if graphs is not None:
            inputs = (slots, tokens, positions, hidden[:, :Kv], valid)
            graphs.run_padded(
                ("catch_up", B, Kv),
                1,
                self._catch_up_region,
                inputs,
                self._pad_rows(*inputs),
            )
        else:
            self.drafter.catch_up(slots, tokens, positions, hidden[:, :Kv], valid)
        mark()
        return InflightRound(
            batch,
            nxt,
            host,
            read,
            {id(r): i for i, r in enumerate(batch)},
            n_next=n + 1 + A,
            decoder=self,
            width=Kv,
            t0=t0,
        )

    def _finish_round(self, rnd: InflightRound) -> list[list[int]]:
        """Read a round back, commit what it accepted and return each request's new tokens.
        Requests that finished meanwhile (their slot waits for release) are not committed."""
        if rnd.done is not None:
            rnd.done.synchronize()
        ms = (time.perf_counter() - rnd.t0) * 1e3  # verification and acceptance are done
        prev = self._round_ms.get(rnd.width)
        self._round_ms[rnd.width] = ms if prev is None else 0.9 * prev + 0.1 * ms
        rows = rnd.host.tolist()
        # commit the anchor and accepted drafts (eq. 7); rejected rows are never published
        live = [(r, row) for r, row in zip(rnd.batch, rows) if r.finish_reason is None]
        self.e.backend.commit(
            [r.slot for r, _ in live], [r.seq_len + 1 + row[0] for r, row in live]
        )
        out = [row[4 : 4 + row[0]] + [row[1]] for row in rows]
        if self.device_widths and rows:  # the next launched round's width
            self._width = max(row[3] for row in rows)
        # the counters describe the rounds whose tokens reach a request, not the round a request
        # that finished meanwhile still ran (overlap); the tokens they emitted are counted as
        # delivered (on_delivered: not those past a length cap, an EOS or a stop match)
        self.stats["spec_rounds_total"] += len(live)
        self.stats["spec_queries_total"] += sum(row[2] for _, row in live)
        self.stats["spec_accepted_total"] += sum(row[0] for _, row in live)
        return out

    def on_delivered(self, tokens: int) -> None:
        """The engine appended ``tokens`` of a round's output to its requests."""
        self.stats["spec_emitted_total"] += tokens
