"""The one load mapping between the paper's concurrency and ours.

The paper serves on four prefill and four decode GPUs, so at its concurrency C each decode GPU
carries about C/4 requests (Table 2: 121-125 active at C128, about 31 per decode GPU). One H200
here stands for one of those decode GPUs: the paper's C runs as C/4 on one GPU. Experiments are
written in the paper's C and mapped here, in one place; every figure and table labels both.

The paper serves DeepSeek-V4.1-Flash on two prefill and two decode GPUs (sec. 4.1), so for the
DeepSeek-like presets the paper's C runs as C/2 (``decode_gpus``).

Runs made before this mapping ran other loads (Fig. 4 at ours C = paper C, Fig. 7 at half):
``load_label`` says what such a run is in the paper's terms rather than what it was compared
with.
"""

from __future__ import annotations

# decode GPUs in the paper's deployment (GLM-5.3: 4 prefill + 4 decode); one H200 stands for one
PAPER_DECODE_GPUS = 4
# DeepSeek-V4.1-Flash: 2 prefill + 2 decode (sec. 4.1)
DEEPSEEK_DECODE_GPUS = 2


def decode_gpus(model_name: str | None) -> int:
    """The paper's decode GPUs for the model a preset stands for: two for the DeepSeek-like
    presets (``dsv*``, ``tiny_dsv``), four for the GLM-like ones."""
    name = str(model_name or "")
    return DEEPSEEK_DECODE_GPUS if "dsv" in name else PAPER_DECODE_GPUS


def ours_concurrency(paper_c: int, gpus: int = PAPER_DECODE_GPUS) -> int:
    """Our concurrency on one H200 for the paper's concurrency ``paper_c`` (C -> C / gpus)."""
    if paper_c <= 0 or paper_c % gpus:
        raise ValueError(
            f"paper concurrency {paper_c} is not a positive multiple of {gpus} decode GPUs"
        )
    return paper_c // gpus


def paper_concurrency(ours_c: int, gpus: int = PAPER_DECODE_GPUS) -> int:
    """The paper's concurrency whose per-decode-GPU load equals ours C on one H200."""
    return ours_c * gpus


def load_label(paper_c: int, ours_c: int, gpus: int = PAPER_DECODE_GPUS) -> str:
    """Both loads of one compared point: 'paper C128 = ours C32 on one H200' where the point
    follows the mapping; where it does not (runs made before it), what our run is in the paper's
    terms: 'paper C128: ours C128 on one H200 = paper C512 per decode GPU'."""
    if paper_c % gpus == 0 and ours_c == ours_concurrency(paper_c, gpus):
        return f"paper C{paper_c} = ours C{ours_c} on one H200"
    return (
        f"paper C{paper_c}: ours C{ours_c} on one H200 = paper C{paper_concurrency(ours_c, gpus)} "
        "per decode GPU"
    )


def loads_line(pairs: dict[int, int], gpus: int = PAPER_DECODE_GPUS) -> str:
    """One line for a figure's compared loads {paper C: ours C}: the headline load (C128 where
    compared) labelled both ways, and the factor of the per-GPU load where every point shares
    one; else every point labelled."""
    if not pairs:
        return ""
    factors = {ours / paper for paper, ours in pairs.items()}
    if len(factors) > 1:
        return "; ".join(load_label(p, o, gpus) for p, o in sorted(pairs.items()))
    p = 128 if 128 in pairs else max(pairs)
    head = load_label(p, pairs[p], gpus)
    per_gpu = factors.pop() * gpus  # ours per GPU over the paper's per decode GPU
    if abs(per_gpu - 1.0) < 1e-9:
        return f"{head} (every load as paper C / {gpus})"
    span = (
        f"paper C{min(pairs)}-C{max(pairs)} as ours C{pairs[min(pairs)]}-C{pairs[max(pairs)]}, "
        if len(pairs) > 1
        else ""
    )
    mapped = (
        f", which runs paper C{p} as ours C{ours_concurrency(p, gpus)}" if p % gpus == 0 else ""
    )
    return f"{head}; {span}{per_gpu:g}x the paper's per-GPU load (runs made before the one mapping{mapped})"
