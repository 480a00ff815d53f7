"""Draft KV ring (paper sec. 3.4, eq. 9-10): the drafter's memory is bounded by its window.

A drafter that reads at most W prior positions, with blocks of at most K_max positions and pages
of p rows, needs R_d = ceil((W + p - 1 + K_max) / p) * p rows per request slot. Position t of
slot i lives at physical row phi(i, t) = i * R_d + (t mod R_d): two live positions of one request
differ by less than R_d, so they never share a row, and slots own disjoint ranges.
"""

from __future__ import annotations

import math

import torch


def ring_rows(window: int, page: int, k_max: int) -> int:
    """Eq. 9."""
    if window < 1 or page < 1 or k_max < 1:
        raise ValueError("window, page and k_max must be >= 1")
    return math.ceil((window + page - 1 + k_max) / page) * page


def ring_address(slot: torch.Tensor | int, pos: torch.Tensor | int, r_d: int):
    """Eq. 10: phi(i, t) = i * R_d + (t mod R_d)."""
    return slot * r_d + pos % r_d


class DraftRing:
    """KV storage of a drafter: (layers, 2, (slots + 1) * R_d, dim), addressed by eq. 10; the
    last slot's rows are the padding slot's (KVBackend.pad_slot is at most ``num_slots``), past
    what the drafter's fixed allocation counts."""

    def __init__(
        self,
        num_layers: int,
        dim: int,
        num_slots: int,
        window: int,
        page: int,
        k_max: int,
        device,
        dtype,
    ):
        self.window = window
        self.r_d = ring_rows(window, page, k_max)
        self.num_slots = num_slots
        rows = (num_slots + 1) * self.r_d
        self.kv = torch.zeros(num_layers, 2, rows, dim, device=device, dtype=dtype)

    @property
    def nbytes(self) -> int:
        """The slots' rows (the padding slot's are not counted, as a backend's are not)."""
        return self.kv[:, :, : self.num_slots * self.r_d].numel() * self.kv.element_size()

    def write(self, rows: torch.Tensor, kv: torch.Tensor) -> None:
        """kv (layers, 2, N, dim) into physical rows (N,) (``rows``), every layer in one
        scatter."""
        self.kv[:, :, rows] = kv

    def rows(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """slots (B,), positions (B, L) -> physical rows (B, L)."""
        return ring_address(slots.long().unsqueeze(-1), positions.long(), self.r_d)
