"""The host store's page-locked allocation (systems/kv/host_memory.py), with fake page-locking
calls: exact size, zeroed, and unlocked exactly once, only after the last view is gone."""

import gc

import pytest
import torch

from systems.kv import host_memory


class FakeLock:
    def __init__(self, fail=False):
        self.locked, self.unlocked, self.fail = [], [], fail

    def register(self, ptr, nbytes):
        if self.fail:
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
        self.locked.append((ptr, nbytes))

    def unregister(self, ptr):
        self.unlocked.append(ptr)


def test_exact_size_zeroed_and_unlocked_after_last_view():
    lock = FakeLock()
    t = host_memory.pinned_empty(
        (3, 5, 7), torch.int32, register=lock.register, unregister=lock.unregister
    )
    assert t.shape == (3, 5, 7) and t.dtype == torch.int32 and t.is_contiguous()
    assert lock.locked == [(t.data_ptr(), 3 * 5 * 7 * 4)]  # exact bytes, no power-of-two rounding
    assert int(t.abs().sum()) == 0
    view = t[1]
    view.fill_(7)
    del t
    gc.collect()
    assert lock.unlocked == []  # a view still reads the memory
    assert int(view.sum()) == 7 * 35
    ptr = lock.locked[0][0]
    del view
    gc.collect()
    assert lock.unlocked == [ptr]


def test_failed_lock_falls_back_to_torch(monkeypatch):
    calls = []
    real_empty = torch.empty

    def fake_empty(*a, **kw):  # CPU-only torch cannot pin: record the fallback instead
        calls.append(kw.get("pin_memory"))
        kw.pop("pin_memory", None)
        return real_empty(*a, **kw)

    monkeypatch.setattr(host_memory.torch, "empty", fake_empty)
    lock = FakeLock(fail=True)
    with pytest.warns(RuntimeWarning, match="falling back"):
        t = host_memory.pinned_empty(
            (4, 9), torch.uint8, register=lock.register, unregister=lock.unregister
        )
    assert t.shape == (4, 9) and calls[-1] is True and lock.unlocked == []


def test_plain_host_memory_without_a_gpu():
    t = host_memory.host_empty((2, 3), torch.uint8, pin=False)
    assert t.shape == (2, 3) and not t.is_pinned()
