"""Resident backend: every admitted request's full history in paged device pools.

A page holds P consecutive positions of one request, in every KV source and in the index store,
at the same page id (one allocator for both, like SGLang's token-to-KV pool). Admission reserves
pages for prompt + output cap, so a running request never needs memory it cannot get.
"""

from __future__ import annotations

import torch

from systems.kv.base import KVBackend, KVOptions, MemoryReport, PrefixKV
from systems.kv.registry import register


@register("resident", options=KVOptions)  # no knobs of its own
class ResidentBackend(KVBackend):
    def __init__(self, model_cfg, kv_cfg, device):
        super().__init__(model_cfg, kv_cfg, device)
        S = model_cfg.num_sources
        self.page_bytes = self.P * S * model_cfg.row_bytes + self.index_page_bytes
        num_pages = self.capacity // self.page_bytes
        if num_pages < self.max_pages_per_req:
            raise ValueError(
                f"kv.kv_pool_gib={kv_cfg.kv_pool_gib}: holds {num_pages} pages of "
                f"{self.page_bytes} bytes, fewer than the {self.max_pages_per_req} one request "
                f"of {self.max_total_tokens} tokens needs"
            )
        self._init_index_pool(num_pages)
        self.pages = self.index_pages  # payload and index share page ids
        # the index store's page ids, and the padding slot's pages past them (KVBackend)
        self.kv_pool = torch.zeros(
            S,
            (num_pages + self.pad_pages) * self.P,
            model_cfg.row_bytes,
            dtype=torch.uint8,
            device=self.device,
        )
        self.slot_max_tokens: dict[int, int] = {}
        self.q_extra = self.q_max - 1

    # ------------------------------------------------------------------ admission
    def can_admit(self, num_prompt_tokens, max_new_tokens):
        if not self.free_slots:
            return False, "no_free_slot"
        need = self.mcfg.pages_for(num_prompt_tokens + max_new_tokens + self.q_extra)
        if need > self.pages.num_free:
            return False, "kv_pool_full"
        return True, ""

    def reserve(self, prefix: PrefixKV, max_new_tokens: int, asynchronous: bool = False) -> int:
        slot = self._take_slot()
        total = prefix.num_tokens + max_new_tokens + self.q_extra  # room for a draft block
        try:
            self._alloc_index(slot, total)
        except BaseException:
            self._return_slot(slot)
            raise
        self.slot_max_tokens[slot] = total
        self.slot_len[slot] = prefix.num_tokens
        return slot

    def import_history(self, slot: int, prefix: PrefixKV) -> None:
        # the prompt's rows go straight into this request's device pages
        self.kv_pool[:, self._history_locs(slot, prefix.num_tokens)] = prefix.kv.to(self.device)
        self._import_index(slot, prefix)

    def release(self, slot: int) -> None:
        if slot not in self.active_slots:
            return
        self._free_index(slot)
        self.slot_max_tokens.pop(slot, None)
        self._return_slot(slot)

    # ------------------------------------------------------------------ step
    def _prepare_step(self):
        super()._prepare_step()
        self._step["write_loc"] = self._step["index_write_loc"]

    def kv_write_target(self, source):
        return self.kv_pool[source], self._step["write_loc"].reshape(-1)

    def write_kv(self, source, rows):
        self.kv_pool[source][self._step["write_loc"].reshape(-1)] = rows.reshape(-1, rows.shape[-1])

    def resolve(self, layer, selections, q0):
        return self._token_locs(self.req_to_index_page, self._step["slots"], selections)

    def kv_buffer(self, source):
        return self.kv_pool[source]

    # ------------------------------------------------------------------ reporting
    def memory_report(self) -> MemoryReport:
        used = self.pages.num_used * self.page_bytes
        return MemoryReport(
            capacity=self.capacity, required=used, components={"history_pages": used}
        )

    def check_integrity(self) -> None:
        super().check_integrity()
        assert set(self._slot_index_pages) == self.active_slots, "pages held by a released slot"
