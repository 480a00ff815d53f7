"""The exclusive partition of a step window (pure function), on interval sets with known
answers and against a brute-force count on an integer grid."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiling.kernel_timeline import IDLE, SEVERAL, partition


def close(a, b):
    return a == pytest.approx(b, abs=1e-9)


def test_empty_window_is_idle():
    p = partition([], (0, 10))
    assert p.idle == 10 and p.several == 0 and p.alone == {}
    assert p.shares() == {SEVERAL: 0.0, IDLE: 1.0}


def test_disjoint_kernels_and_gaps():
    p = partition([(0, 2, "a"), (3, 5, "b"), (7, 10, "a")], (0, 10))
    assert p.alone == {"a": 5, "b": 2}
    assert p.several == 0 and p.idle == 3
    assert p.work == {"a": 5, "b": 2}
    assert p.count == {"a": 2, "b": 1}


def test_overlap_of_two_families_is_several():
    p = partition([(0, 6, "a"), (4, 10, "b")], (0, 10))
    assert p.alone == {"a": 4, "b": 4}
    assert p.several == 2 and p.idle == 0
    assert p.busy == {"a": 6, "b": 6}
    assert p.overlapped == {"a": 2, "b": 2}


def test_same_family_overlap_is_alone_but_work_counts_twice():
    p = partition([(0, 6, "a"), (2, 8, "a")], (0, 10))
    assert p.alone == {"a": 8} and p.several == 0 and p.idle == 2
    assert p.work == {"a": 12}  # summed kernel durations
    assert p.busy == {"a": 8}


def test_nesting_inside_another_family():
    # a short cache kernel entirely under a long model kernel
    p = partition([(0, 10, "dense_projection"), (3, 4, "resolver")], (0, 10))
    assert p.alone == {"dense_projection": 9, "resolver": 0}
    assert p.several == 1
    assert p.cache_under_model == 1
    assert p.overlapped["resolver"] == 1


def test_three_families_at_once_and_back_to_back_boundaries():
    p = partition([(0, 4, "a"), (1, 3, "b"), (2, 5, "c"), (5, 6, "a")], (0, 8))
    # 0-1 a | 1-2 a,b | 2-3 a,b,c | 3-4 a,c | 4-5 c | 5-6 a | 6-8 idle
    assert p.alone == {"a": 2, "b": 0, "c": 1}
    assert p.several == 3 and p.idle == 2
    assert p.busy == {"a": 5, "b": 2, "c": 3}


def test_kernels_crossing_the_window_are_clipped():
    p = partition([(-5, 2, "a"), (8, 20, "b"), (-3, -1, "c"), (12, 15, "c")], (0, 10))
    assert p.alone == {"a": 2, "b": 2}
    assert "c" not in p.alone and "c" not in p.count  # outside the window: ignored
    assert p.idle == 6
    assert p.work == {"a": 2, "b": 2}


def test_window_inside_one_kernel():
    p = partition([(0, 100, "a")], (10, 20))
    assert p.alone == {"a": 10} and p.idle == 0 and p.length == 10


def test_zero_length_and_touching_intervals():
    p = partition([(2, 2, "a"), (0, 5, "b"), (5, 10, "c")], (0, 10))
    assert "a" not in p.alone  # zero length: no kernel time
    assert p.alone == {"b": 5, "c": 5} and p.several == 0 and p.idle == 0


def test_invalid_inputs():
    with pytest.raises(ValueError):
        partition([(5, 1, "a")], (0, 10))
    with pytest.raises(ValueError):
        partition([], (10, 0))


def test_cache_work_sums_cache_families_only():
    p = partition(
        [(0, 2, "resolver"), (1, 4, "follower_copy"), (0, 10, "expert_mlp_matmul")], (0, 10)
    )
    assert p.cache_work() == 5
    assert p.cache_under_model == 4
    assert close(sum(p.shares().values()), 1.0)


def brute(intervals, window):
    t0, t1 = window
    alone, several, idle = {}, 0, 0
    for t in range(t0, t1):  # unit cells [t, t+1)
        fams = {f for s, e, f in intervals if s <= t and t + 1 <= e}
        if not fams:
            idle += 1
        elif len(fams) == 1:
            (f,) = fams
            alone[f] = alone.get(f, 0) + 1
        else:
            several += 1
    return alone, several, idle


interval = st.tuples(st.integers(-5, 40), st.integers(0, 15), st.sampled_from("abcd")).map(
    lambda x: (x[0], x[0] + x[1], x[2])
)


@settings(max_examples=150, deadline=None)
@given(st.lists(interval, max_size=12), st.integers(-3, 10), st.integers(0, 30))
def test_matches_brute_force(intervals, t0, length):
    window = (t0, t0 + length)
    p = partition(intervals, window)
    alone, several, idle = brute(intervals, window)
    assert close(p.several, several) and close(p.idle, idle)
    for f in set(alone) | set(p.alone):
        assert close(p.alone.get(f, 0), alone.get(f, 0))
    # the partition is exclusive and complete
    assert close(sum(p.alone.values()) + p.several + p.idle, length)
    for f in p.busy:
        assert p.alone[f] <= p.busy[f] + 1e-9 and p.busy[f] <= p.work[f] + 1e-9
        assert close(p.busy[f], p.alone[f] + p.overlapped[f])
