"""Every number of the paper that the figure scripts compare against, in one place.

Each leaf is a :class:`PV`: a ``float`` that also carries where it comes from (``source``:
"Table 2", "Fig. 9 text (sec. 4.3.4)", ...), its ``unit`` and an optional ``note``. Because a PV
is a float, ``PAPER["table2"]["C128"]["adaptive_dhisparse"]["output_tok_s_per_gpu"] == 793`` and
arithmetic work as usual.

Conventions
-----------
* Percentages are stored as percent (``14.21`` means 14.21 %), ratios as plain factors
  (``1.45`` means 1.45x), times in the unit named by the key suffix (``_ms``, ``_s``, ``_us``).
* Values that the paper states as a range ("1.7 to 1.9x") are stored as ``{"lo": .., "hi": ..}``.
* System keys: ``resident``, ``hisparse``, ``adaptive_hisparse``, ``resident_dflash2`` /
  ``resident_dspark``, ``adaptive_dhisparse``.
* Only what the paper prints is recorded. Where a value is *derived* from printed numbers
  (e.g. the block-6 output at C128 from "6 % less than block 4"), the source says ``derived`` and
  the note gives the arithmetic; figure scripts label such values as derived.
* Curves of Figs. 1, 4, 5, 7, 9 are not available as numbers in the text of the paper; for those
  figures only the values stated in the prose (and the tables) are recorded.

Ambiguities of the flattened PDF text are stated in the ``note`` of the value concerned
(Fig. 10b category order, Fig. 10a DeepSeek bar order, Fig. 11a segment-to-category mapping,
Fig. 11b bar order); see also ``AMBIGUITIES`` at the end of this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class PV(float):
    """A paper value: a float with provenance."""

    source: str
    unit: str
    note: str

    def __new__(cls, value: float, source: str, unit: str = "", note: str = "") -> PV:
        obj = super().__new__(cls, value)
        obj.source = source
        obj.unit = unit
        obj.note = note
        return obj

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        u = f" {self.unit}" if self.unit else ""
        return f"PV({float(self):g}{u}, {self.source!r})"

    def __reduce__(self):  # keep pickling / deepcopy working
        return (PV, (float(self), self.source, self.unit, self.note))


def _src(source: str):
    def mk(value: float, unit: str = "", note: str = "") -> PV:
        return PV(value, source, unit, note)

    return mk


def _rng(mk, lo: float, hi: float, unit: str = "", note: str = "") -> dict:
    return {"lo": mk(lo, unit, note), "hi": mk(hi, unit, note)}


SYSTEM_LABELS = {
    "resident": "Resident",
    "hisparse": "HiSparse",
    "adaptive_hisparse": "Adaptive HiSparse",
    "resident_dflash2": "Resident + DFlash2",
    "resident_dspark": "Resident + DSpark",
    "adaptive_dhisparse": "Adaptive DHiSparse",
}

# ---------------------------------------------------------------------------------------------
# Setup (sec. 4.1) and model facts
# ---------------------------------------------------------------------------------------------
_s41 = _src("sec. 4.1")
SETUP = {
    "hbm_gib_per_gpu": _s41(269, "GiB", "B300"),
    "host_tb_per_node": _s41(4.3, "TB"),
    "glm": {
        "decode_gpus": _s41(4, "GPU"),
        "prefill_gpus": _s41(4, "GPU"),
        "input_tokens": _s41(
            100_000,
            "tokens",
            "'100K'; the index-pool arithmetic of sec. 4.1 "
            "(52 / 36 histories) requires 100,000, not 102,400",
        ),
        "output_cap": _s41(2048, "tokens"),
        "index_topk": _s41(2048, "rows"),
        "hot_cache_rows": _s41(4096, "rows"),
        "prepared_prefixes": _s41(1, ""),
    },
    "deepseek": {
        "decode_gpus": _s41(2, "GPU"),
        "prefill_gpus": _s41(2, "GPU"),
        "input_tokens": _s41(500_000, "tokens"),
        "output_cap": _s41(2048, "tokens"),
        "index_topk": _s41(512, "rows"),
        "hot_cache_rows_5layer_source": _s41(8192, "rows"),
        "hot_cache_rows_1layer_sources": _s41(4096, "rows", "each of the three sources"),
        "prepared_prefixes": _s41(16, ""),
    },
    "fig1_workload": {
        "input_tokens": _s41(32_768, "tokens", "'32K', HiSparse's evaluation"),
        "output_cap": _s41(8192, "tokens"),
    },
}

# ---------------------------------------------------------------------------------------------
# Table 1 - memory per session, GLM-5.3, GiB
# ---------------------------------------------------------------------------------------------
_t1 = _src("Table 1")
_DAG = "excludes optional residency (dagger in Table 1)"
TABLE1 = {
    "resident": {"gpu_32k": _t1(1.456, "GiB"), "gpu_100k": _t1(4.444, "GiB")},
    "hisparse": {
        "gpu_32k": _t1(0.259, "GiB"),
        "gpu_100k": _t1(0.432, "GiB"),
        "host_100k": _t1(4.186, "GiB"),
    },
    "adaptive_hisparse": {
        "gpu_32k": _t1(0.259, "GiB", _DAG),
        "gpu_100k": _t1(0.432, "GiB", _DAG),
        "host_100k": _t1(4.186, "GiB"),
    },
    "resident_dflash2": {"gpu_32k": _t1(1.481, "GiB"), "gpu_100k": _t1(4.469, "GiB")},
    "adaptive_dhisparse": {
        "gpu_32k": _t1(0.319, "GiB", _DAG),
        "gpu_100k": _t1(0.492, "GiB", _DAG),
        "host_100k": _t1(4.186, "GiB"),
    },
    "text": {
        "resident_over_adaptive_100k": PV(10.3, "sec. 3.4 text", "x", "4.444 / 0.432"),
        "ring_gib_per_session": PV(0.025, "sec. 5 text", "GiB", "at 32K and 100K alike"),
    },
}

# ---------------------------------------------------------------------------------------------
# Sec. 3.4 / 4.1 capacity numbers (draft ring, staging, fixed allocations, pools)
# ---------------------------------------------------------------------------------------------
_s34 = _src("sec. 3.4")
SEC34 = {
    "draft_window_W": _s34(2048, "positions"),
    "page_size_p": _s34(64, "rows"),
    "k_max": _s34(8, "queries"),
    "ring_rows_R_d": _s34(2176, "rows", "eq. 9"),
    "draft_layers": _s34(6, "layers"),
    "draft_kv_allocations": _s34(12, "allocations"),
    "draft_bytes_per_ring_row": _s34(12_288, "B", "summed over the 12 K/V allocations"),
    "ring_gib_per_gpu_35_slots": _s34(0.87, "GiB"),
    "live_payload_layers_chi": _s34(4, "layers"),
    "payload_layers": _s34(78, "layers"),
    "staging_gib_dedicated_78": _s34(24.0, "GiB", "one arena per payload layer, 35 slots"),
    "staging_gib_reused_4": _s34(1.23, "GiB", "four reused arenas, 35 slots"),
    "staging_reduction": _s34(19.5, "x", "78 / 4"),
    "spec_state_gib_per_session": _s34(0.060, "GiB", "ring + staging share"),
    "slots_configured": PV(35, "sec. 4.1", "slots per GPU"),
    "fixed_drafter_gib": PV(4.9, "sec. 4.1", "GiB"),
    "fixed_target_extra_gib": PV(1.3, "sec. 4.1", "GiB"),
    "fixed_verify_metadata_gib": PV(0.4, "sec. 4.1", "GiB"),
    "fixed_total_gib": PV(6.6, "sec. 5 text", "GiB"),
    "index_pool_rows_with_drafter": PV(3.72e6, "sec. 4.1", "rows per GPU"),
    "index_pool_rows_without": PV(5.37e6, "sec. 4.1", "rows per GPU"),
    "histories_with_drafter": PV(36, "sec. 4.1", "histories of 100K + 2,048 tokens"),
    "histories_without": PV(52, "sec. 4.1", "histories of 100K + 2,048 tokens"),
    "sessions_4gpu_with_drafter": PV(140, "sec. 4.1", "sessions"),
    "sessions_4gpu_without": PV(208, "sec. 4.1", "sessions"),
    "resident_sessions_in_52_offloaded": PV(5, "sec. 4.2.1 text", "sessions per GPU"),
    "resident_sessions_in_35_offloaded_dflash2": PV(3, "sec. 4.2.1 text", "sessions per GPU"),
    "host_tb_208_sessions": PV(0.93, "sec. 5 text", "TB"),
    "host_sessions_fit": PV(950, "sec. 5 text", "sessions", "'about 950' in a 4.3 TB host"),
}

CENSUS = {  # sec. 3.2, GLM-5.3 at C8, no speculation
    "direct_pct": PV(69.7, "sec. 3.2 census", "%", "optional-history map or tail"),
    "hot_cache_pct": PV(30.3, "sec. 3.2 census", "%"),
    "host_pct": PV(0.05, "sec. 3.2 census", "%"),
}

# ---------------------------------------------------------------------------------------------
# Table 2 - GLM-5.3 at 100K, C128 / C256
# ---------------------------------------------------------------------------------------------
_t2 = _src("Table 2")


def _t2row(out, vs, ttft, pw, pw99, tpot, active, slots):
    d = {
        "output_tok_s_per_gpu": _t2(out, "tok/s/GPU"),
        "ttft_s_mean": _t2(ttft, "s"),
        "post_wave_ttft_s_mean": _t2(pw, "s"),
        "post_wave_ttft_s_p99": _t2(pw99, "s"),
        "tpot_ms_mean": _t2(tpot, "ms"),
        "active_mean": _t2(active, "requests"),
        "slots": _t2(slots, "slots"),
    }
    if vs is not None:
        d["vs_hisparse"] = _t2(vs, "x")
    return d


TABLE2 = {
    "C128": {
        "hisparse": _t2row(548, None, 10.68, 5.11, 26.97, 50.3, 121.1, 208),
        "adaptive_hisparse": _t2row(622, 1.14, 6.13, 2.48, 11.85, 46.6, 125.6, 208),
        "adaptive_dhisparse": _t2row(793, 1.45, 5.13, 2.25, 9.67, 35.9, 124.7, 140),
    },
    "C256": {
        "hisparse": _t2row(730, None, 47.61, 42.54, 102.89, 58.0, 190.5, 208),
        "adaptive_hisparse": _t2row(823, 1.13, 34.36, 31.01, 81.99, 54.4, 201.5, 208),
        "adaptive_dhisparse": _t2row(826, 1.13, 64.62, 67.79, 87.60, 38.9, 138.2, 140),
    },
}

# ---------------------------------------------------------------------------------------------
# Table A1 - load step, optional residency on / off (GLM-5.3 100K, no speculation)
# ---------------------------------------------------------------------------------------------
_a1 = _src("Table A1")


def _a1row(req, host, tpot, toks, gain, ttft, aw):
    return {
        "on": {
            "requests": _a1(req[0]),
            "host_pct": _a1(host[0], "%"),
            "tpot_ms": _a1(tpot[0], "ms"),
            "tok_s_per_session": _a1(toks[0], "tok/s"),
            "ttft_s": _a1(ttft[0], "s"),
            "alloc_wait_s": _a1(aw[0], "s"),
        },
        "off": {
            "requests": _a1(req[1]),
            "host_pct": _a1(host[1], "%"),
            "tpot_ms": _a1(tpot[1], "ms"),
            "tok_s_per_session": _a1(toks[1], "tok/s"),
            "ttft_s": _a1(ttft[1], "s"),
            "alloc_wait_s": _a1(aw[1], "s"),
        },
        "gain_pct": _a1(gain, "%", "per-session speed, on vs off"),
    }


TABLEA1 = {
    "C16_before": _a1row(
        (80, 80), (1.38, 14.21), (25.18, 26.07), (39.83, 38.38), 3.8, (1.65, 3.22), (0.03, 0.00)
    ),
    "C256": _a1row(
        (417, 375),
        (13.79, 13.79),
        (53.77, 52.24),
        (18.61, 19.18),
        -3.0,
        (36.89, 46.63),
        (28.19, 19.74),
    ),
    "C16_after_recovery": _a1row(
        (62, 52), (2.43, 13.98), (24.44, 28.10), (40.92, 36.19), 13.1, (0.84, 0.87), (0.02, 0.01)
    ),
}
TABLEA1_PHASES = ("C16_before", "C256", "C16_after_recovery")

# ---------------------------------------------------------------------------------------------
# Table A2 - TTFT split, seconds
# ---------------------------------------------------------------------------------------------
_a2 = _src("Table A2")


def _a2row(alloc, handoff, other, ttft, pw_alloc, pw_handoff, pw_ttft):
    return {
        "alloc_wait_s": _a2(alloc, "s"),
        "handoff_s": _a2(handoff, "s"),
        "other_s": _a2(other, "s"),
        "ttft_s": _a2(ttft, "s"),
        "post_wave_alloc_wait_s": _a2(pw_alloc, "s"),
        "post_wave_handoff_s": _a2(pw_handoff, "s"),
        "post_wave_ttft_s": _a2(pw_ttft, "s"),
    }


TABLEA2 = {
    "C128": {
        "hisparse": _a2row(0.00, 10.36, 0.31, 10.68, 0.00, 4.98, 5.11),
        "adaptive_hisparse": _a2row(1.75, 4.03, 0.34, 6.13, 0.09, 2.24, 2.48),
        "adaptive_dhisparse": _a2row(2.51, 2.23, 0.39, 5.13, 0.25, 1.77, 2.25),
    },
    "C256": {
        "hisparse": _a2row(32.10, 14.97, 0.53, 47.61, 33.70, 8.71, 42.54),
        "adaptive_hisparse": _a2row(29.15, 4.70, 0.51, 34.36, 27.09, 3.77, 31.01),
        "adaptive_dhisparse": _a2row(62.50, 1.50, 0.61, 64.62, 66.46, 1.09, 67.79),
    },
    "text": {
        "handoff_share_hisparse_c128_pct": PV(97, "sec. 4.2.1 text", "%"),
        "handoff_share_adaptive_c128_pct": PV(66, "sec. 4.2.1 text", "%"),
        "handoff_share_adhs_c128_pct": PV(43, "sec. 4.2.1 text", "%"),
        "handoff_shortening_adaptive": PV(2.6, "sec. 4.2.1 text", "x"),
        "handoff_shortening_adhs": PV(4.6, "sec. 4.2.1 text", "x"),
        "alloc_share_adhs_c128_pct": PV(49, "sec. 4.2.1 text", "%"),
        "alloc_share_adaptive_c256_pct": _rng(
            _src("sec. 4.2.1 text"), 85, 97, "%", "both adaptive configurations"
        ),
        "alloc_share_hisparse_c256_pct": PV(67, "sec. 4.2.1 text", "%"),
    },
}

# ---------------------------------------------------------------------------------------------
# Table A3 - latency at every load, GLM-5.3 100K
# ---------------------------------------------------------------------------------------------
_a3 = _src("Table A3")
A3_CONCURRENCY = (4, 8, 16, 32, 64, 128, 256)
_A3_RAW = {
    "hisparse": {
        "ttft_s_mean": (0.79, 1.05, 1.85, 3.82, 5.09, 10.68, 47.61),
        "ttft_s_p99": (1.50, 2.81, 5.49, 10.81, 21.35, 43.53, 158.86),
        "post_wave_ttft_s_mean": (0.70, 0.75, 1.20, 2.49, 2.68, 5.11, 42.54),
        "post_wave_ttft_s_p99": (0.95, 1.82, 3.49, 7.40, 9.63, 26.97, 102.89),
        "tpot_ms_mean": (19.4, 23.4, 28.4, 34.8, 42.2, 50.3, 58.0),
        "tpot_ms_p99": (19.5, 23.6, 28.7, 36.4, 43.4, 51.8, 59.1),
    },
    "adaptive_hisparse": {
        "ttft_s_mean": (0.54, 0.76, 1.24, 1.59, 3.47, 6.13, 34.36),
        "ttft_s_p99": (0.79, 1.07, 3.14, 5.70, 16.74, 36.16, 131.61),
        "post_wave_ttft_s_mean": (0.48, 0.69, 0.90, 1.25, 2.05, 2.48, 31.01),
        "post_wave_ttft_s_p99": (0.71, 0.97, 1.23, 3.09, 6.66, 11.85, 81.99),
        "tpot_ms_mean": (16.0, 19.1, 24.1, 30.8, 38.1, 46.6, 54.4),
        "tpot_ms_p99": (16.1, 19.2, 24.7, 31.7, 39.9, 48.3, 55.4),
    },
    "adaptive_dhisparse": {
        "ttft_s_mean": (0.53, 0.65, 0.86, 1.47, 2.76, 5.13, 64.62),
        "ttft_s_p99": (0.79, 1.35, 2.55, 6.88, 15.45, 32.42, 111.89),
        "post_wave_ttft_s_mean": (0.47, 0.49, 0.64, 0.74, 1.12, 2.25, 67.79),
        "post_wave_ttft_s_p99": (0.70, 0.72, 1.03, 1.40, 3.02, 9.67, 87.60),
        "tpot_ms_mean": (11.4, 13.3, 16.2, 19.4, 26.2, 35.9, 38.9),
        "tpot_ms_p99": (13.2, 16.4, 18.8, 24.4, 31.8, 42.1, 48.3),
    },
}
TABLEA3 = {
    sys_: {
        f"C{c}": {
            k: _a3(vals[i], "s" if k.endswith("_s_mean") or k.endswith("_s_p99") else "ms")
            for k, vals in cols.items()
        }
        for i, c in enumerate(A3_CONCURRENCY)
    }
    for sys_, cols in _A3_RAW.items()
}
_lb = _src("sec. 4.2.1 text (capacity under fixed latency bounds)")
LATENCY_BOUNDS = {
    "bound_a": {
        "post_wave_ttft_p99_s": _lb(10, "s"),
        "tpot_mean_ms": _lb(40, "ms"),
        "max_C": {
            "hisparse": _lb(32),
            "adaptive_hisparse": _lb(64),
            "adaptive_dhisparse": _lb(128),
        },
        "output": {
            "hisparse": _lb(212, "tok/s/GPU"),
            "adaptive_hisparse": _lb(393, "tok/s/GPU"),
            "adaptive_dhisparse": _lb(793, "tok/s/GPU"),
        },
        "concurrency_ratio": _lb(4, "x"),
        "output_ratio": _lb(3.7, "x"),
    },
    "bound_b": {
        "post_wave_ttft_p99_s": _lb(10, "s"),
        "tpot_mean_ms": _lb(50, "ms"),
        "max_C": {"hisparse": _lb(64)},
        "output": {"hisparse": _lb(348, "tok/s/GPU")},
        "output_ratio": _lb(2.3, "x"),
    },
    "bound_c": {
        "post_wave_ttft_p99_s": _lb(8, "s"),
        "tpot_mean_ms": _lb(40, "ms"),
        "max_C": {"adaptive_dhisparse": _lb(64)},
        "concurrency_ratio": _lb(2, "x"),
        "output_ratio": _lb(2.6, "x"),
    },
}

# ---------------------------------------------------------------------------------------------
# Fig. 1 - GLM-5.3 at 32K input / 8K output (aggregate output over 4 decode GPUs)
# ---------------------------------------------------------------------------------------------
_f1 = _src("Fig. 1 text (sec. 1)")
FIG1 = {
    "concurrency": (8, 32, 64, 128),
    "adhs_vs_hisparse_C8_C64": _rng(_f1, 1.7, 1.9, "x", "output, C8 to C64"),
    "adhs_vs_hisparse_C128": _f1(1.45, "x", "output"),
    "ttft_hisparse_over_adhs_C128": _f1(2.3, "x", "mean TTFT 2.3x lower"),
    "resident_dflash2_ahead_upto_C32_pct": _rng(_f1, 5, 9, "%", "Resident + DFlash2 over ADHS"),
    "resident_dflash2_stops_scaling_at_C": _f1(64, "C"),
}

# ---------------------------------------------------------------------------------------------
# Fig. 4 - GLM-5.3 at 100K (text numbers; points from Tables 2 / A3 where stated)
# ---------------------------------------------------------------------------------------------
_f4 = _src("Fig. 4 text (sec. 4.2.1)")
FIG4 = {
    "concurrency": A3_CONCURRENCY,
    "block_schedule": {
        "C4": _f4(8),
        "C8": _f4(8),
        "C16": _f4(8),
        "C32": _f4(8),
        "C64": _f4(6),
        "C128": _f4(4),
        "C256": _f4(4),
    },
    "adhs_vs_hisparse_C128": _f4(1.45, "x"),
    "adhs_vs_adaptive_C128": _f4(1.27, "x"),
    "adaptive_vs_hisparse_C128": _f4(1.14, "x"),
    "adaptive_tpot_lower_C128_pct": _f4(7, "%", "mean time per token, adaptive vs HiSparse"),
    "handoff_hisparse_s": _f4(10.4, "s"),
    "handoff_adaptive_s": _f4(4.0, "s"),
    "added_alloc_wait_s": _f4(1.8, "s"),
    "active_adaptive_C128": _f4(126, "requests"),
    "active_hisparse_C128": _f4(121, "requests"),
    "tokens_per_round_block4_C128": _f4(2.88, "tokens"),
    "round_time_over_step": _f4(2.2, "x", "block-4 round vs non-speculative step"),
    "session_speedup_spec": _f4(1.30, "x"),
    "sessions_kept_spec_C128_pct": _f4(99, "%"),
    "alt_run_tokens_per_round": _f4(2.67, "tokens", "a run with lower acceptance"),
    "alt_run_vs_adaptive": _rng(_f4, 1.13, 1.16, "x"),
    "alt_run_vs_hisparse": _rng(_f4, 1.29, 1.31, "x"),
    "adhs_ttft_lower_than_hisparse_C128": _f4(2.1, "x"),
    "adhs_tpot_lower_than_hisparse_C128_pct": _f4(29, "%"),
    "resident_plateau_tok_s": _f4(178, "tok/s/GPU", "C32 to C256"),
    "resident_dflash2_plateau_tok_s": _f4(220, "tok/s/GPU", "from C16"),
    "resident_ttft_C16_s": _f4(0.6, "s"),
    "resident_ttft_C32_s": _f4(30, "s"),
    "adhs_vs_resident_C256": _f4(4.6, "x"),
    "adhs_vs_resident_dflash2_C256": _f4(3.7, "x"),
    "adaptive_below_resident_C4_C16_pct": _rng(_f4, 5, 7, "%"),
    "adaptive_above_hisparse_C4_C16_pct": _rng(_f4, 19, 23, "%"),
    "step_ms_C8_adaptive": _f4(16.6, "ms", "kernel profile at C8"),
    "step_ms_C8_hisparse": _f4(20.9, "ms"),
    "cache_kernel_saving_C8_ms": _f4(1.4, "ms"),
    "optional_residency_alone_speedup_pct": _f4(3.8, "%"),
    "adaptive_and_adhs_above_hisparse_C256_pct": _f4(13, "%", "'about 13%'"),
    "adhs_ttft_higher_C256": _f4(1.9, "x", "vs Adaptive HiSparse"),
    # output points stated in the text (tok/s per decode GPU)
    "output_points": {
        "hisparse": {
            "C32": _f4(212, "tok/s/GPU"),
            "C64": _f4(348, "tok/s/GPU"),
            "C128": _t2(548, "tok/s/GPU"),
            "C256": _t2(730, "tok/s/GPU"),
        },
        "adaptive_hisparse": {
            "C64": _f4(393, "tok/s/GPU"),
            "C128": _t2(622, "tok/s/GPU"),
            "C256": _t2(823, "tok/s/GPU"),
        },
        "adaptive_dhisparse": {"C128": _t2(793, "tok/s/GPU"), "C256": _t2(826, "tok/s/GPU")},
    },
}
_e13 = _src("eq. 13 (sec. 4.2.1)")
EQ13 = {
    "C128": {
        "session_share": _e13(0.99),
        "tpot_ratio": _e13(0.77),
        "predicted": _e13(1.29, "x"),
        "measured": _e13(1.27, "x"),
    },
    "C256": {
        "session_share": _e13(0.69),
        "tpot_ratio": _e13(0.71),
        "predicted": _e13(0.96, "x"),
        "measured": _e13(1.00, "x"),
        "slot_ratio": _e13(140 / 208, "", "140 / 208 = 0.67 (sec. 5)"),
    },
}

# ---------------------------------------------------------------------------------------------
# Fig. 5 - DeepSeek-V4.1-Flash at 500K
# ---------------------------------------------------------------------------------------------
_f5 = _src("Fig. 5 text (sec. 4.2.2)")
FIG5 = {
    "concurrency": (64, 128, 256, 512),
    "adhs_vs_resident_dspark_C512": _f5(1.85, "x"),
    "adhs_output_C512": _f5(5054, "tok/s/GPU"),
    "adhs_ttft_lower_vs_resident_dspark_C512": _f5(3.2, "x"),
    "adhs_tpot_higher_vs_resident_dspark_C512": _f5(1.9, "x"),
    "spec_return_C128": _f5(1.54, "x", "ADHS over Adaptive HiSparse"),
    "spec_return_C512": _f5(1.20, "x"),
    "resident_plateau_tok_s": _f5(1800, "tok/s/GPU", "C128 to C512, 'near 1,800'"),
    "resident_ttft_C128_s": _f5(
        11,
        "s",
        "'from 11 to 115 seconds' (C128 -> C512); the same pair "
        "of numbers appears for GLM in Fig. 9 text",
    ),
    "resident_ttft_C512_s": _f5(115, "s"),
    "adaptive_vs_resident_C128": _f5(1.16, "x"),
    "adaptive_vs_resident_C512": _f5(2.3, "x"),
    "adaptive_output_C512": _f5(4217, "tok/s/GPU"),
    "adaptive_ttft_lower_vs_resident_C512": _f5(5.6, "x"),
    "adaptive_vs_hisparse_upto_C256_within_pct": _f5(4, "%"),
    "adaptive_vs_hisparse_C512_pct": _f5(9.4, "%"),
    "context_crossover_C512": {
        "32736": _f5(-2.6, "%", "adaptive vs resident at 32,736 tokens"),
        "200000": _f5(1.57, "x", "'200K'"),
        "500000": _f5(2.3, "x"),
    },
}

# ---------------------------------------------------------------------------------------------
# Fig. 6 - load step, residency on/off (text; Table A1 has the per-phase statistics)
# ---------------------------------------------------------------------------------------------
_f6 = _src("Fig. 6 text (sec. 4.3.1)")
FIG6 = {
    "host_share_low_off_pct": _f6(14.2, "%", "Table A1: 14.21"),
    "host_share_low_on_pct": _f6(1.4, "%", "Table A1: 1.38"),
    "host_share_low_reduction": _f6(10.3, "x"),
    "coverage_low_on_pct": _rng(_f6, 75, 100, "%", "ready optional coverage at C16"),
    "seconds_to_coverage_below_1pct": _f6(16, "s", "'within 16 seconds' of the step up"),
    "seconds_to_fill_slots_on": _f6(53, "s", "208 slots"),
    "seconds_to_fill_slots_off": _f6(3, "s"),
    "alloc_wait_longer_C256": _f6(1.4, "x"),
    "speed_lower_C256_pct": _f6(3, "%"),
    "handoff_C256_on_s": _f6(8.5, "s"),
    "handoff_C256_off_s": _f6(26.8, "s"),
    "ttft_lower_C256_pct": _f6(21, "%"),
    "more_requests_C256_pct": _f6(11, "%"),
    "seconds_to_coverage_above_50pct_after_drop": _f6(142, "s"),
    "host_share_recovery_reduction": _f6(5.8, "x"),
    "speed_higher_recovery_pct": _f6(13.1, "%"),
    "host_fetch_removed_pct": _rng(_f6, 83, 90, "%", "while memory is spare"),
    "phase_minutes": _f6(5, "min"),
}

# ---------------------------------------------------------------------------------------------
# Fig. 7 - DFlash2 block size (4, 6, 8) at C64 / C128 / C256
# ---------------------------------------------------------------------------------------------
_f7 = _src("Fig. 7 text (sec. 4.3.2)")
_f7d = _src("Fig. 7, derived from text ratios")
FIG7 = {
    "blocks": (4, 6, 8),
    "concurrency": (64, 128, 256),
    "C64": {
        "tokens_b6_over_b4_pct": _f7(18, "%"),
        "round_b6_over_b4_pct": _f7(17, "%"),
        "output_spread_within_pct": _f7(3, "%", "all three blocks"),
    },
    "C128": {
        "tokens_b6_over_b4_pct": _f7(17, "%"),
        "tokens_b8_over_b4_pct": _f7(25, "%"),
        "output_b6_vs_b4_pct": _f7(-6, "%"),
        "output_b8_vs_b4_pct": _f7(-9, "%"),
    },
    "C256": {"output_b6_vs_b4_pct": _f7(-1, "%"), "output_b8_vs_b4_pct": _f7(-8, "%")},
    "best_block": {"C64": _f7(6), "C128": _f7(4), "C256": _f7(4)},
    "tokens_per_round_b4_C128": PV(2.88, "sec. 4.2.1 text", "tokens"),
    "missing_selections_per_distinct_host_row": _f7(1.41, "", "C128, block 4"),
    "shared_retrieval_fetch_reduction_pct": _f7(29, "%", "1 - 1/1.41"),
    "cache_alone_share_b4_pct": _f7(17, "%", "Fig. 11a"),
    "cache_alone_share_b6_pct": _f7(20, "%", "Fig. 11a"),
    "derived": {
        "tokens_per_round": {
            "C128": {
                "4": _f7d(2.88, "tokens"),
                "6": _f7d(2.88 * 1.17, "tokens", "2.88 x 1.17"),
                "8": _f7d(2.88 * 1.25, "tokens", "2.88 x 1.25"),
            }
        },
        "output_tok_s_per_gpu": {
            "C128": {
                "4": _f7d(793, "tok/s/GPU", "Table 2"),
                "6": _f7d(793 * 0.94, "tok/s/GPU", "793 x 0.94"),
                "8": _f7d(793 * 0.91, "tok/s/GPU", "793 x 0.91"),
            },
            "C256": {
                "4": _f7d(826, "tok/s/GPU", "Table 2"),
                "6": _f7d(826 * 0.99, "tok/s/GPU", "826 x 0.99"),
                "8": _f7d(826 * 0.92, "tok/s/GPU", "826 x 0.92"),
            },
        },
    },
}

# ---------------------------------------------------------------------------------------------
# Fig. 8 - resolver microbenchmarks
# ---------------------------------------------------------------------------------------------
_f8 = _src("Fig. 8 / sec. 4.3.3")
FIG8 = {
    "host_path_gbps": _f8(49.4, "GB/s", "least-squares fit, panel a"),
    "fit_r2": _f8(0.9992, ""),
    "cases": _f8(6, "cases"),
    "nomiss_ms": _f8(0.031, "ms", "panel a, no miss"),
    "max_ms": _f8(6.23, "ms", "panel a, 302 MB"),
    "max_unique_miss_mb": _f8(302, "MB"),
    "one_query_topk_mb": _f8(
        37.75, "MB", "one query's top-k over the 32 requests of a call (2,048 x 32 x 576 B)"
    ),
    "disjoint_over_shared": _f8(7.9, "x", "eight disjoint vs eight identical selections"),
    "nomiss_b4096_batch8_us": _f8(18.7, "us", "panel c"),
    "nomiss_b4096_batch160_us": _f8(36.9, "us", "panel c"),
    "miss77_b4096_batch8_us": _f8(29.3, "us", "panel c"),
    "miss77_b4096_batch160_us": _f8(243.3, "us", "panel c"),
    "miss_slowdown_batch8": _f8(1.6, "x"),
    "miss_slowdown_batch160": _f8(6.6, "x"),
    "miss_cost_us_per_request": _f8(1.3, "us", "median, both batch sizes"),
    "scan_4x_B_slowdown_batch8": _f8(1.9, "x", "B 2,048 -> 8,192, no miss"),
    "scan_4x_B_slowdown_batch160": _f8(2.2, "x"),
    "direct_over_scan_B4096": _f8(2.5, "x", "direct path faster than the scan, batch 8"),
    "misses_per_request": _f8(77, "rows"),
    "width": _f8(8, "queries"),
    "batch": _f8(32, "requests"),
    "B": _f8(4096, "rows"),
    "shared_retrieval_fewer_fetches_pct": _f8(29, "%"),
}

# ---------------------------------------------------------------------------------------------
# Fig. 9 - hot-cache budget sweep (text numbers)
# ---------------------------------------------------------------------------------------------
_f9 = _src("Fig. 9 text (sec. 4.3.4)")
FIG9 = {
    "glm_budgets": (1, 2, 4, 8),
    "deepseek_budgets": (2, 4, 8, 16),
    "glm_C128": {
        "hisparse_miss_pct_Bk": _f9(33, "%"),
        "hisparse_miss_pct_B8k": _f9(3.9, "%"),
        "hisparse_tpot_ms_Bk": _f9(57, "ms"),
        "hisparse_tpot_ms_B8k": _f9(38, "ms"),
        "best_budget": _f9(2, "B/k", "both systems"),
        "output_loss_2k_to_8k_pct": _f9(44, "%"),
        "ttft_s_2k": _f9(11, "s"),
        "ttft_s_8k": _f9(115, "s"),
        "adaptive_over_hisparse_at_peak_pct": _f9(14, "%"),
        "adaptive_step_ms_2k": _f9(44.7, "ms"),
        "adaptive_step_ms_8k": _f9(35.3, "ms"),
        "sessions_per_gpu_2k": _f9(28, "sessions"),
        "sessions_per_gpu_8k": _f9(13, "sessions"),
    },
    "glm_C8": {
        "adaptive_miss_pct": _f9(0.05, "%", "every budget"),
        "adaptive_output_spread_within_pct": _f9(3, "%"),
        "resolver_ms_per_step_Bk": _f9(0.35, "ms"),
        "resolver_ms_per_step_B8k": _f9(0.85, "ms"),
        "tpot_ms_Bk": _f9(18.9, "ms"),
        "tpot_ms_B8k": _f9(19.4, "ms"),
        "adaptive_over_hisparse_best_pct": _f9(21, "%", "best against best"),
    },
    "deepseek_C128": {
        "output_spread_within_pct": _f9(2, "%", "both systems, 8x range of B"),
        "hisparse_miss_pct_lo_B": _f9(36, "%"),
        "hisparse_miss_pct_hi_B": _f9(9.5, "%"),
        "adaptive_miss_pct_lo_B": _f9(18, "%"),
        "adaptive_miss_pct_hi_B": _f9(5.9, "%"),
        "ttft_s": _rng(_f9, 2.5, 2.8, "s"),
    },
    "deepseek_C8": {"adaptive_miss_pct": _f9(0.0, "%", "'fetches nothing from host'")},
}

# ---------------------------------------------------------------------------------------------
# Table 3 - retrieval volume
# ---------------------------------------------------------------------------------------------
_t3 = _src("Table 3")
TABLE3 = {
    "glm": {
        "selecting_layers": _t3(21),
        "k": _t3(2048),
        "selections_per_token": _t3(43_008),
        "kv_sources": _t3(78, "", "one per layer"),
        "bytes_per_missed_selection": _rng(_t3, 2400, 2500, "B", "'2.4 to 2.5 KB'"),
        "host_mb_per_token": {"smallest_B": _t3(34, "MB"), "largest_B": _t3(4.2, "MB")},
        "hot_cache_mb_per_session": _t3(184, "MB"),
        "resolver_calls_per_step": _t3(21),
        "follower_copies_per_step": _t3(57),
        "payload_layers_per_selection": PV(3.7, "sec. 5 text", "layers", "78 / 21"),
    },
    "deepseek": {
        "selecting_layers": _t3(8),
        "k": _t3(512),
        "selections_per_token": _t3(4096),
        "kv_sources": _t3(4, "", "shared"),
        "bytes_per_missed_selection": _t3(288, "B"),
        "host_mb_per_token": {"smallest_B": _t3(0.42, "MB"), "largest_B": _t3(0.11, "MB")},
        "hot_cache_mb_per_session": _t3(6, "MB"),
        "resolver_calls_per_step": _t3(8),
        "follower_copies_per_step": _t3(0, "", "none"),
    },
    "host_bytes_ratio": PV(80, "sec. 5 text", "x", "'about 80x' fewer on DeepSeek"),
}

# ---------------------------------------------------------------------------------------------
# Fig. 10 - cache work and step partition, Adaptive HiSparse at C128
# ---------------------------------------------------------------------------------------------
_f10 = _src("Fig. 10")
_f10t = _src("Fig. 10 text (sec. 4.3.4)")
FIG10_FAMILIES = (
    "expert matrix products",
    "dense projections",
    "indexing and attention",
    "other model kernels",
    "several families at once",
    "cache kernels alone",
    "no kernel running",
)
FIG10 = {
    "cache_ms_per_step": {
        "glm": {
            "1": _f10(25.4, "ms"),
            "2": _f10(15.1, "ms"),
            "4": _f10(7.1, "ms"),
            "8": _f10(3.4, "ms"),
        },
        "deepseek": {
            "2": _f10(
                0.7,
                "ms",
                "flattened text gives 0.7, 0.5, 0.5, 0.5 for the four bars; "
                "assigned in x order B/k = 2, 4, 8, 16 (the text says '0.5 to 0.7 ms')",
            ),
            "4": _f10(0.5, "ms"),
            "8": _f10(0.5, "ms"),
            "16": _f10(0.5, "ms"),
        },
    },
    "glm_follower_copy_share": _f10t(0.75, "", "'three quarters' of the 15.1 ms at B = 2k"),
    "glm_overlapped_ms_2k": _f10t(11.0, "ms", "of 15.1 ms"),
    "glm_cache_ms_per_session": {
        "2": _f10t(0.55, "ms"),
        "4": _f10t(0.29, "ms"),
        "8": _f10t(0.27, "ms"),
    },
    "glm_sessions_per_step": {"upto_4": _rng(_f10, 24, 28, "sessions"), "8": _f10(13, "sessions")},
    "deepseek_sessions_per_step": _rng(_f10, 62, 63, "sessions"),
    "glm_resolver_calls": _f10t(21),
    "glm_follower_copies": _f10t(57),
    "deepseek_resolver_calls": _f10t(8),
    "deepseek_residency_machinery_ms": _f10t(0.05, "ms"),
    "step_ms": {"glm": _f10(44.7, "ms", "B/k = 2"), "deepseek": _f10(25.1, "ms", "B/k = 16")},
    "partition_pct": {
        "glm": {
            "expert matrix products": _f10(38, "%", "text: 38%"),
            "dense projections": _f10(7, "%", "category order taken from the legend order"),
            "indexing and attention": _f10(6, "%", "category order taken from the legend order"),
            "other model kernels": _f10(8, "%", "category order taken from the legend order"),
            "several families at once": _f10(30, "%", "category order taken from the legend order"),
            "cache kernels alone": _f10(9, "%", "text: 'the cache runs alone for 9%'"),
            "no kernel running": _f10(1.5, "%", "caption: 1.5% and 1.9%, read as GLM, DeepSeek"),
        },
        "deepseek": {
            "expert matrix products": _f10(53, "%", "text: 53%"),
            "dense projections": _f10(10, "%", "category order taken from the legend order"),
            "indexing and attention": _f10(8, "%", "category order taken from the legend order"),
            "other model kernels": _f10(17, "%", "category order taken from the legend order"),
            "several families at once": _f10(8, "%", "category order taken from the legend order"),
            # "cache kernels alone" is unlabelled in the flattened text (the remainder is ~2%)
            "no kernel running": _f10(1.9, "%", "caption: 1.5% and 1.9%, read as GLM, DeepSeek"),
        },
    },
}

# ---------------------------------------------------------------------------------------------
# Fig. 11 - round partition (a) and resolver share (b)
# ---------------------------------------------------------------------------------------------
_f11 = _src("Fig. 11")
FIG11_FAMILIES = (
    "cache kernels alone",
    "expert matrix products",
    "other model kernels",
    "several families at once",
    "no kernel coverage",
)
_F11_NOTE = (
    "segment-to-category mapping inferred: the flattened numbers alternate between the "
    "two bars; block 4 = 13.9+21.3+16.2+15.6+13.1 = 80.1 and block 6 = "
    "18.7+23.1+21.0+18.3+12.9 = 94.0 sum exactly, the first segments (13.9, 18.7) are "
    "17% / 20% of the round (= 'cache kernels alone', text), the rest follow the legend"
)
FIG11 = {
    "round_ms": {
        "4": {
            "total": _f11(80.1, "ms", "block 4 total; 94.0/80.1 = 1.17 ('17% longer')"),
            "cache kernels alone": _f11(13.9, "ms", _F11_NOTE),
            "expert matrix products": _f11(21.3, "ms", _F11_NOTE),
            "other model kernels": _f11(16.2, "ms", _F11_NOTE),
            "several families at once": _f11(15.6, "ms", _F11_NOTE),
            "no kernel coverage": _f11(13.1, "ms", _F11_NOTE),
        },
        "6": {
            "total": _f11(94.0, "ms", "block 6 total"),
            "cache kernels alone": _f11(18.7, "ms", _F11_NOTE),
            "expert matrix products": _f11(23.1, "ms", _F11_NOTE),
            "other model kernels": _f11(21.0, "ms", _F11_NOTE),
            "several families at once": _f11(18.3, "ms", _F11_NOTE),
            "no kernel coverage": _f11(12.9, "ms", _F11_NOTE),
        },
    },
    "resolver_share_pct": {
        "C16 fill": _f11(1.36, "%", "bar order of the flattened text read as fill, middle, drain"),
        "C16 middle": _f11(
            1.33, "%", "bar order of the flattened text read as fill, middle, drain"
        ),
        "C16 drain": _f11(0.41, "%", "bar order of the flattened text read as fill, middle, drain"),
        "C512 pressure": _f11(4.75, "%"),
    },
}

# ---------------------------------------------------------------------------------------------
# Headline claims (abstract / conclusion): the basis of results/claims.json
# ---------------------------------------------------------------------------------------------
_ab = _src("abstract")
HEADLINE = {
    "glm_c128_adhs_output": _ab(793, "tok/s/GPU"),
    "glm_c128_adhs_vs_hisparse": _ab(1.45, "x"),
    "glm_c128_adhs_vs_adaptive": _ab(1.27, "x"),
    "glm_latency_bound_concurrency": _ab(4, "x"),
    "glm_latency_bound_output": _rng(_ab, 2.3, 3.7, "x"),
    "dsv_c512_adhs_vs_resident_dspark": _ab(1.85, "x"),
    "loadstep_host_share_off_pct": _ab(14.2, "%"),
    "loadstep_host_share_on_pct": _ab(1.4, "%"),
    "spec_state_gib_per_session": PV(0.060, "sec. 1 contributions", "GiB"),
    "glm_c128_ttft_vs_hisparse": PV(2.1, "sec. 1 contributions", "x"),
}

PAPER: dict[str, Any] = {
    "setup": SETUP,
    "table1": TABLE1,
    "sec34": SEC34,
    "census": CENSUS,
    "table2": TABLE2,
    "tableA1": TABLEA1,
    "tableA2": TABLEA2,
    "tableA3": TABLEA3,
    "latency_bounds": LATENCY_BOUNDS,
    "fig1": FIG1,
    "fig4": FIG4,
    "eq13": EQ13,
    "fig5": FIG5,
    "fig6": FIG6,
    "fig7": FIG7,
    "fig8": FIG8,
    "fig9": FIG9,
    "table3": TABLE3,
    "fig10": FIG10,
    "fig11": FIG11,
    "headline": HEADLINE,
}

AMBIGUITIES = {
    "fig10.partition_pct": "Fig. 10b labels are flattened as '38 7 6 8 30 9' (GLM) and "
    "'53 10 8 17 8' (DeepSeek); only 38/53 (expert) and 9 (GLM cache alone) "
    "are confirmed by the text. The rest are mapped in legend order. The "
    "DeepSeek 'cache kernels alone' segment carries no label.",
    "fig10.cache_ms_per_step.deepseek": "four labels 0.7, 0.5, 0.5, 0.5; which bar is 0.7 is not "
    "recoverable with certainty (taken as B/k = 2).",
    "fig11.round_ms": "segment-to-category mapping inferred from the sums and the 17%/20% text.",
    "fig11.resolver_share_pct": "1.36 / 1.33 / 0.41 read as C16 fill / middle / drain.",
    "fig5 vs fig9 TTFT 11 -> 115 s": "the same pair appears for DeepSeek resident (C128 -> C512) "
    "and for GLM HiSparse (B = 2k -> 8k); both recorded as printed.",
    "row bytes": "capacity arithmetic (Table 1, eq. 11, Table 3 hot cache, Fig. 8a 37.75 MB) uses "
    "576 B per KV row; Table 3's 2.4-2.5 KB per missed selection matches 3.71 x 656 B "
    "(the FP8 row with scales and bf16 rope). See figures/capacity.py.",
}


# ---------------------------------------------------------------------------------------------
# access helpers
# ---------------------------------------------------------------------------------------------
def get(path: str, default: Any = None) -> Any:
    """``get("table2.C128.adaptive_dhisparse.output_tok_s_per_gpu")`` -> PV (or ``default``)."""
    node: Any = PAPER
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return default
    return node


def flatten(node: Any = None, prefix: str = "") -> Iterator[tuple[str, PV]]:
    """Every PV under ``node`` (default: the whole paper) as ``(dotted.path, value)``."""
    node = PAPER if node is None else node
    if isinstance(node, PV):
        yield prefix, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))


def label(system: str) -> str:
    return SYSTEM_LABELS.get(system, system)
