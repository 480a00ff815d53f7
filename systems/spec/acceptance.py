"""Acceptance rules of a speculative round (Leviathan et al., 2023), left untouched.

exact: accept proposal j with probability min(1, p_j(x_j) / q_j(x_j)); on the first rejection
       sample the correction from norm(max(0, p_j - q_j)); if every proposal is accepted, draw a
       bonus token from p_K. Greedy (temperature 0) is its limit: accept while x_j equals the
       target's argmax; the correction or bonus is the argmax.
calibrated: the accepted length is drawn from a distribution matched to the paper's emitted
       tokens per round (Fig. 7a); the verification forward, resolution, staging and commit still
       run in full. Output tokens then do not follow the target distribution: reports say so.
"""

from __future__ import annotations

import torch

from systems.engine.sampler import sample

# Emitted tokens per round (accepted + bonus) the paper reports for static DFlash2 blocks at
# C128 (Fig. 7a, Sec. 4.2.1: 2.88 at block 4; +17% at block 6; +25% at block 8).
PAPER_EMITTED_PER_ROUND = {4: 2.88, 6: 2.88 * 1.17, 8: 2.88 * 1.25}


def accept_exact(
    target_logits: torch.Tensor,
    proposals: torch.Tensor,
    q: torch.Tensor,
    k_r: torch.Tensor,
    temperatures: torch.Tensor,
    gen: torch.Generator | None,
) -> tuple[list[int], list[int]]:
    """target_logits (B, K, V): query j's logits predict the token after block position j.
    proposals (B, K-1), q (B, K-1, V), k_r (B,) queries actually verified per request.
    Returns (accepted counts A_r, next tokens b_r)."""
    B, K, V = target_logits.shape
    greedy = target_logits.argmax(-1)  # (B, K)
    t = temperatures.view(-1, 1, 1).clamp_min(1e-5)
    p = torch.softmax(target_logits / t, dim=-1)
    A, nxt = [], []
    k_l, temp_l = k_r.tolist(), temperatures.tolist()
    prop_l, greedy_l = proposals.tolist(), greedy.tolist()
    for b in range(B):
        kr = k_l[b]
        if temp_l[b] <= 0:
            a = 0
            while a < kr - 1 and prop_l[b][a] == greedy_l[b][a]:
                a += 1
            A.append(a)
            nxt.append(greedy_l[b][a])
            continue
        a, token = 0, None
        while a < kr - 1:
            x = prop_l[b][a]
            pj, qj = p[b, a], q[b, a]
            ratio = (pj[x] / qj[x].clamp_min(1e-20)).clamp(max=1.0)
            if torch.rand((), generator=gen, device=p.device) < ratio:
                a += 1
                continue
            resid = (pj - qj).clamp_min(0)
            resid = resid / resid.sum() if float(resid.sum()) > 0 else pj
            token = int(torch.multinomial(resid, 1, generator=gen))
            break
        if token is None:  # all accepted: bonus from p at the last verified query
            token = int(torch.multinomial(p[b, a], 1, generator=gen))
        A.append(a)
        nxt.append(token)
    return A, nxt


def calibrated_alpha(block: int, emitted: float) -> float:
    """Per-position acceptance alpha with E[emitted] = (1 - alpha^K) / (1 - alpha) (bisection)."""
    lo, hi = 0.0, 0.999999
    for _ in range(60):
        mid = (lo + hi) / 2
        e = (1 - mid**block) / (1 - mid)
        lo, hi = (mid, hi) if e < emitted else (lo, mid)
    return (lo + hi) / 2


def accepted_prefix(match: torch.Tensor, k_r: torch.Tensor) -> torch.Tensor:
    """match (B, K-1) bool: whether draft position j is accepted on its own; k_r (B,) queries
    verified per request. Returns A (B,) int64: the leading accepted positions, at most
    k_r - 1 (acceptance stops at the first rejection). On the device, no host round trip."""
    j = torch.arange(match.shape[1], device=match.device)
    ok = match & (j < (k_r.to(match.device) - 1).unsqueeze(1))
    return ok.long().cumprod(1).sum(1)


def accept_greedy(
    target_logits: torch.Tensor, proposals: torch.Tensor, k_r: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact acceptance at temperature 0 on the device: accept while a draft equals the
    target's argmax; the next token is the argmax after the accepted prefix. Returns device
    tensors (A (B,), next (B,)), equal to ``accept_exact``'s greedy branch."""
    greedy = target_logits.argmax(-1)  # (B, K)
    K1 = proposals.shape[1]
    A = accepted_prefix(proposals == greedy[:, :K1], k_r)
    return A, greedy.gather(1, A.unsqueeze(1)).squeeze(1)


def accept_calibrated(
    target_logits: torch.Tensor,
    k_r: torch.Tensor,
    alpha: float,
    gen: torch.Generator | None,
    temperatures: torch.Tensor | None = None,
    sampled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a geometric prefix with per-position probability alpha; the next token is the
    target's at the first unaccepted position: its argmax, or drawn at the request's temperature
    when any request samples (``temperatures`` then required), as a sampled request's accepted
    drafts are drawn from the drafter's q where the drafter allows (SpeculativeDecoder._round).
    On the device: returns tensors (A (B,), next (B,))."""
    if sampled and temperatures is None:
        raise ValueError("accept_calibrated: sampled=True needs the requests' temperatures")
    B, K, _ = target_logits.shape
    u = torch.rand(B, K, generator=gen, device=target_logits.device)
    A = accepted_prefix(u[:, : K - 1] < alpha, k_r)
    at = target_logits[torch.arange(B, device=target_logits.device), A]  # (B, V)
    if not sampled:
        return A, at.argmax(-1)
    return A, sample(at.float(), temperatures, gen, True)
