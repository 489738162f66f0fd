"""busbw factors and buffer counts of every collective, as nccl-tests' *GetBw / *GetCollByteCount."""

from __future__ import annotations

import pytest

from ringtree.perf.bw import COLLECTIVES, Counts, get_bw, spec

# nccl-tests doc/PERFORMANCE.md and src/<coll>.cu: (algbw bytes multiplier, busbw factor)
FACTORS = {
    "all_reduce": (lambda n: 1, lambda n: 2 * (n - 1) / n),
    "all_gather": (lambda n: n, lambda n: (n - 1) / n),
    "reduce_scatter": (lambda n: n, lambda n: (n - 1) / n),
    "broadcast": (lambda n: 1, lambda n: 1.0),
    "reduce": (lambda n: 1, lambda n: 1.0),
    "alltoall": (lambda n: n, lambda n: (n - 1) / n),
    "gather": (lambda n: n, lambda n: (n - 1) / n),
    "scatter": (lambda n: n, lambda n: (n - 1) / n),
    "sendrecv": (lambda n: 1, lambda n: 1.0),
}


def test_every_collective_has_a_factor():
    assert set(FACTORS) == set(COLLECTIVES)


@pytest.mark.parametrize("coll", sorted(FACTORS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 64])
def test_busbw_factor(coll, n):
    count, typesize, sec = 1000, 4, 2e-3
    algbw, busbw = get_bw(coll, count, typesize, sec, n)
    vol, factor = FACTORS[coll]
    assert algbw == pytest.approx(count * typesize * vol(n) / 1e9 / sec)  # GB = 1e9
    assert busbw == pytest.approx(algbw * factor(n))


def test_all_reduce_example_from_performance_md():
    # 1 GiB of float in 9306.7 us on 8 ranks -> algbw 115.37, busbw 201.9 (x 2·7/8)
    algbw, busbw = get_bw("all_reduce", 268435456, 4, 9306.7e-6, 8)
    assert round(algbw, 2) == 115.37
    assert busbw == pytest.approx(algbw * 1.75)


def test_zero_time_and_zero_count():
    assert get_bw("all_reduce", 0, 4, 0.0, 4) == (0.0, 0.0)
    assert get_bw("broadcast", 0, 4, 1e-3, 4) == (0.0, 0.0)


@pytest.mark.parametrize("coll,size,elt,n,want", [
    # AllReduce/Bcast/Reduce/SendRecv: paramcount = size/eltSize
    ("all_reduce", 1024, 4, 4, Counts(256, 256, 256, 0, 0)),
    ("broadcast", 10, 4, 3, Counts(2, 2, 2, 0, 0)),
    ("sendrecv", 8, 8, 2, Counts(1, 1, 1, 0, 0)),
    # AllGather/ReduceScatter/AlltoAll/Gather/Scatter: (size/elt/n) & -(16/elt)
    ("all_gather", 1024, 4, 4, Counts(64, 256, 64, 64, 0)),
    ("all_gather", 8, 4, 4, Counts(0, 0, 0, 0, 0)),
    ("reduce_scatter", 128, 1, 3, Counts(96, 32, 32, 0, 32)),
    ("reduce_scatter", 100, 4, 3, Counts(24, 8, 8, 0, 8)),
    ("alltoall", 2048, 8, 3, Counts(252, 252, 84, 0, 0)),
    ("gather", 2048, 2, 4, Counts(256, 1024, 256, 256, 0)),
    ("scatter", 4096, 4, 3, Counts(1020, 340, 340, 0, 340)),
])
def test_counts(coll, size, elt, n, want):
    assert spec(coll).counts(size, elt, n) == want


def test_size_column_is_max_of_send_and_recv():
    assert spec("reduce_scatter").counts(128, 1, 3).nbytes(1) == 96
    assert spec("all_gather").counts(1024, 4, 4).nbytes(4) == 1024


def test_flags_of_each_test():
    rooted = {c for c, s in COLLECTIVES.items() if s.rooted}
    reduces = {c for c, s in COLLECTIVES.items() if s.reduces}
    assert rooted == {"broadcast", "reduce", "gather", "scatter"}
    assert reduces == {"all_reduce", "reduce_scatter", "reduce"}
    assert COLLECTIVES["sendrecv"].op_loop


@pytest.mark.parametrize("name,canon", [("all_reduce_perf", "all_reduce"),
                                        ("allreduce", "all_reduce"),
                                        ("all_to_all", "alltoall"),
                                        ("Reduce-Scatter", "reduce_scatter")])
def test_names(name, canon):
    assert spec(name).name == canon


def test_unknown_collective():
    with pytest.raises(ValueError, match="unknown collective"):
        spec("allfoo")
