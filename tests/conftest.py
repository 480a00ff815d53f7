import os
import sys
from pathlib import Path

# Triton kernels run on CPU tensors through the interpreter in the test suite.
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _share_the_cores_among_xdist_workers() -> None:
    """In a pytest-xdist worker (``make test``'s parallel pass), torch's OpenMP pool gets this
    worker's share of the cores, not all of them: with two workers on two cores, each worker's
    two OpenMP threads spin against the other worker's (and against the event loop of a served
    test), and a CPU step gets several to tens of times slower (see tests/reliability/conftest.py).
    Set before torch is imported, so the subprocesses a test starts (servers, benchmark scripts)
    inherit it. A value the user set wins; the solo pass (no worker) keeps every core."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    n = max(1, cores // max(1, int(workers)))
    os.environ["OMP_NUM_THREADS"] = str(n)
    if "torch" in sys.modules:  # imported already (a plugin): set its pool directly
        sys.modules["torch"].set_num_threads(n)


_share_the_cores_among_xdist_workers()


def pytest_addoption(parser):
    # `make test` runs the suite in two passes: everything but the ``solo`` tests in
    # parallel workers, then the ``solo`` tests alone (their timing tolerances assume
    # the machine's cores are theirs). Options rather than ``-m`` so that a user's
    # own ``-m`` in ARGS still combines with them.
    g = parser.getgroup("dhs")
    g.addoption("--no-solo", action="store_true", help="deselect tests marked solo")
    g.addoption("--solo-only", action="store_true", help="select only tests marked solo")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped where no CUDA device is visible; --no-solo /
    --solo-only split off the tests marked ``solo``."""
    import pytest
    import torch

    no_solo, solo_only = config.getoption("--no-solo"), config.getoption("--solo-only")
    if no_solo and solo_only:
        raise pytest.UsageError("--no-solo and --solo-only exclude each other")
    if no_solo or solo_only:
        keep, drop = [], []
        for item in items:
            (keep if (item.get_closest_marker("solo") is not None) == solo_only else drop).append(
                item
            )
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    # either pass selects nothing when ARGS narrows the run to the other's tests: not a failure
    opt = session.config.getoption
    if (opt("--solo-only") or opt("--no-solo")) and exitstatus == 5:
        session.exitstatus = 0
