"""The single-copy all-gather, reduce-scatter and broadcast
(``runtime/protocols/ll_direct.py``): the same bits as Simple's ``direct`` Program for
every NumPy dtype and bfloat16 torch tensors, odd sizes, in place and not, pieces folded
in rank order, 1-3 ranks; the crossovers; the probe's fallback (switched off, a refused
read on one rank); a killed peer named, a vanished one too; a failed read raised on every
rank with the inputs untouched; ranks on different paths a mismatch; the compiled and the
ctypes reads alike; the all-gather's streamed own block (compiled and NumPy) alike."""

from __future__ import annotations

import errno
import os
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest

from ringtree.errors import CommAborted, PeerError, RingtreeError
from ringtree.runtime.protocols import ll_direct, ll_direct_entry, ll_direct_fold, ll_direct_probe
from ringtree.runtime.protocols.ll_direct import MIN_BYTES, DirectOp
from ringtree.runtime.protocols.ll_direct_entry import Compiled
from ringtree.testing import RankPool, run_ranks
from ringtree.transports import shm_cma as cma

DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64"]
# one element, odd counts, and one over a fold piece (ll_direct_fold.SCATTER_PIECE) of every dtype
COUNTS = [1, 7, 1001, ll_direct_fold.SCATTER_PIECE // 2 + 3]
ALL_DIRECT = {"RINGTREE_CMA_MIN": "1"}


def _input(rank: int, count: int, dtype: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng(100 * salt + rank)
    if np.dtype(dtype).kind == "f":  # sums that round: the fold order shows
        return (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)).astype(dtype)
    return rng.integers(0, 100, count).astype(dtype)


def _direct_calls() -> int:
    """Calls run on the single-copy path so far in this process (each publishes once)."""
    if "_counted" not in vars(DirectOp):
        def counting(real):
            def counted(self, *a):
                DirectOp._counted += 1
                return real(self, *a)
            return counted
        DirectOp._counted = 0
        # every publication posts through _posted but the shared all-gather's (_shared)
        # and the C entry's, whose calls all end in Compiled.after
        DirectOp._posted, DirectOp._shared = counting(DirectOp._posted), \
            counting(DirectOp._shared)
        Compiled.after = counting(Compiled.after)
    return DirectOp._counted


def _gather(comm, x: np.ndarray, in_place: bool) -> tuple[bytes, bool]:
    n, r = comm.size, comm.rank
    out = np.zeros(x.size * n, x.dtype)
    before = _direct_calls()
    if in_place:
        out[r * x.size:(r + 1) * x.size] = x
        comm.all_gather(out[r * x.size:(r + 1) * x.size], out=out)
    else:
        comm.all_gather(x, out=out)
    return out.tobytes(), _direct_calls() > before


def _scatter(comm, x: np.ndarray, op: str, in_place: bool) -> tuple[bytes, bool]:
    r, m = comm.rank, x.size // comm.size
    before = _direct_calls()
    if in_place:
        y = x.copy()
        comm.reduce_scatter(y, op, out=y[r * m:(r + 1) * m])
        got = y[r * m:(r + 1) * m]
    else:
        got = np.zeros(m, x.dtype)
        comm.reduce_scatter(x, op, out=got)
    return got.tobytes(), _direct_calls() > before


def every_case(comm, counts: list[int], dtypes: list[str]) -> list[str]:
    """Direct against Simple's ``direct`` Program, every (collective, dtype, count, op,
    in place); what differs or did not run directly."""
    bad = []
    for salt, dtype in enumerate(dtypes):
        for count in counts:
            x = _input(comm.rank, count * comm.size, dtype, salt)
            keep = x.copy()
            want = comm.all_gather(x[:count], algo="direct").tobytes()
            for in_place in (False, True):
                got, direct = _gather(comm, x[:count], in_place)
                if got != want or not direct:
                    bad.append(f"all_gather {dtype} {count} in_place={in_place}: "
                               f"{'differs' if got != want else 'not direct'}")
            for op in ("sum", "avg", "max") if dtype != "uint64" else ("sum", "min"):
                want = comm.reduce_scatter(x, op, algo="direct").tobytes()
                for in_place in (False, True):
                    got, direct = _scatter(comm, x, op, in_place)
                    if got != want or not direct:
                        bad.append(f"reduce_scatter {dtype} {count} {op} in_place="
                                   f"{in_place}: {'differs' if got != want else 'not direct'}")
            for root in {0, comm.size - 1}:
                want = x[:count].copy()
                comm.broadcast(want, root, algo="direct")
                got, before = x[:count].copy(), _direct_calls()
                comm.broadcast(got, root)
                if got.tobytes() != want.tobytes() or _direct_calls() == before:
                    bad.append(f"broadcast {dtype} {count} root={root}")
            if not np.array_equal(x, keep):
                bad.append(f"{dtype} {count}: the input changed")
    return bad


def probed(comm) -> bool:
    return comm.ll.direct is not None


def through_ctypes(comm, counts: list[int], dtypes: list[str]) -> list[str]:
    """:func:`every_case` with the reads made through ctypes (a build without ``_cma``)."""
    compiled, cma._cma = cma._cma, None
    try:
        return every_case(comm, counts, dtypes)
    finally:
        cma._cma = compiled


def streamed(comm, counts: list[int], dtypes: list[str]) -> list[str]:
    """:func:`every_case` with the all-gather's own block streamed and the peers' blocks
    (the broadcast's buffer) read bounced at every size (``ll_direct.STREAM_MIN``,
    ``BOUNCE_BROADCAST``) through a scratch of an odd size smaller than a block, compiled
    and through NumPy."""
    least = ll_direct.STREAM_MIN, ll_direct.BOUNCE_BROADCAST, comm.ll.direct.scratch
    ll_direct.STREAM_MIN = ll_direct.BOUNCE_BROADCAST = 1
    if least[2] is not None:
        comm.ll.direct.scratch = np.empty(1000, np.uint8)
    try:
        return every_case(comm, counts, dtypes) + through_ctypes(comm, counts, dtypes)
    finally:
        ll_direct.STREAM_MIN, ll_direct.BOUNCE_BROADCAST, comm.ll.direct.scratch = least


@pytest.mark.parametrize("n,native", [(1, "1"), (2, "1"), (3, "1"), (2, "0")])
def test_direct_gives_simples_bits(n, native):
    """(``native``: the reduce-scatter's loop compiled, or in Python)"""
    with RankPool(n, env={**ALL_DIRECT, "RINGTREE_LL_NATIVE": native}) as pool:
        assert pool.run_ok(probed) == [True] * n
        for r, bad in enumerate(pool.run_ok(every_case, COUNTS if n == 2 else COUNTS[1:3],
                                            DTYPES if n == 2 else ["float32", "int8"])):
            assert bad == [], f"rank {r}: {bad}"
        for r, bad in enumerate(pool.run_ok(streamed, COUNTS[1:3], ["int8", "float32"])):
            assert bad == [], f"rank {r}, streamed: {bad}"
        if n != 2:
            return
        for r, bad in enumerate(pool.run_ok(through_ctypes, COUNTS[1:], ["float32"])):
            assert bad == [], f"rank {r}, through ctypes: {bad}"


def test_streamed_copy_is_a_copy():
    """``shm_cma.stream`` (non-temporal stores after an aligning head, a tail) against
    NumPy's copy: every length around the 16- and 64-byte steps, every alignment."""
    src = np.random.default_rng(5).integers(0, 256, 4096 + 64, dtype=np.uint8)
    for m in (0, 1, 15, 16, 17, 63, 64, 65, 127, 200, 4096):
        for a in range(0, 17, 3):
            for b in (0, 1, 8):
                want = np.zeros(m + 64, np.uint8)
                want[a:a + m] = src[b:b + m]
                for python in (False, True):
                    got = np.zeros(m + 64, np.uint8)
                    cma.stream(got[a:a + m], src[b:b + m], python=python)
                    assert np.array_equal(got, want), (m, a, b, python)
    if cma.compiled():
        with pytest.raises(ValueError, match="3 destination bytes for 4 source bytes"):
            cma.stream(np.zeros(3, np.uint8), src[:4])


def test_the_last_level_cache_from_sysfs(tmp_path):
    """``shm_cma.last_level_cache`` (the broadcast's bounce threshold): the highest level's
    size in sysfs' units, the default where sysfs has none or cannot be read."""
    for name, level, size in (("index0", 1, "48K"), ("index2", 2, "2048K"),
                              ("index3", 3, "16M"), ("index1", 1, "32K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    (tmp_path / "uevent").write_text("")
    assert cma.last_level_cache(7, str(tmp_path)) == 16 << 20
    (tmp_path / "index3" / "size").write_text("1G\n")
    assert cma.last_level_cache(7, str(tmp_path)) == 1 << 30
    (tmp_path / "index3" / "level").write_text("three\n")
    assert cma.last_level_cache(7, str(tmp_path)) == 7
    assert cma.last_level_cache(7, str(tmp_path / "absent")) == 7


def test_streamed_copy_at_every_page_distance():
    """The streamed copy where its destination lies just above its source modulo 4 KiB
    (a memcpy there up to 1 MiB, against 4 KiB aliasing) and elsewhere (loads leading
    the stores by 128 bytes): NumPy's bytes, at lengths around the 128- and 256-byte
    steps and the 1 MiB bound."""
    src = np.random.default_rng(6).integers(0, 256, (1 << 20) + 8192, dtype=np.uint8)
    big = np.zeros(3 * 4096 + (1 << 20) + 8192, np.uint8)
    s_at = cma.address(src) + 5
    for near in (0, 1, 16, 47, 48, 63, 64, 200, 4080, 4095):
        a = (s_at + near - cma.address(big)) % 4096 + 4096
        for m in (0, 100, 383, 384, 385, 511, 512, 639, 640, 641, 4096 + 7, 1 << 20,
                  (1 << 20) + 389):
            big[...] = 0
            cma.stream(big[a:a + m], src[5:5 + m])
            assert (cma.address(big[a:]) - s_at) % 4096 == near
            assert np.array_equal(big[a:a + m], src[5:5 + m]), (near, m)
            assert not big[:a].any() and not big[a + m:].any(), (near, m)


def at_crossover(comm) -> list[tuple[str, int, bool, bool]]:
    """Each collective just below and at its crossover: (what, bytes, direct?, bits
    equal to Simple's)."""
    res = []
    for coll in ("all_gather", "reduce_scatter", "broadcast"):
        least = MIN_BYTES[(ll_direct.Collective(coll), comm.size > 2)]
        blocks = 1 if coll == "broadcast" else comm.size
        first = -(-least // (4 * blocks))  # the fewest float32 a block that run directly
        for count in (first - 1, first):
            x = _input(comm.rank, count * blocks, "float32", 7)
            if coll == "all_gather":
                got, direct = _gather(comm, x[:count], False)
                want = comm.all_gather(x[:count], algo="direct").tobytes()
            elif coll == "reduce_scatter":
                got, direct = _scatter(comm, x, "sum", False)
                want = comm.reduce_scatter(x, "sum", algo="direct").tobytes()
            else:
                y, before = x.copy(), _direct_calls()
                comm.broadcast(y, 0)
                got, direct = y.tobytes(), _direct_calls() > before
                comm.broadcast(x, 0, algo="direct")
                want = x.tobytes()
            res.append((coll, count * 4 * blocks, direct, got == want))
    return res


def test_crossover_and_switch():
    def want(on: bool) -> list:
        return [(False, True), (on, True)] * 3

    # the constants (the measuring, which may move the all-gather's, off)
    for r, res in enumerate(run_ranks(at_crossover, 2, timeout=60,
                                      env={"RINGTREE_TUNE": "model"})):
        assert not isinstance(res, BaseException), res
        assert [(d, same) for _, _, d, same in res] == want(True), f"rank {r}: {res}"
    # switched off: the segment's paths, the same bits
    for r, res in enumerate(run_ranks(at_crossover, 2, timeout=60, env={"RINGTREE_CMA": "0"})):
        assert not isinstance(res, BaseException), res
        assert [(d, same) for _, _, d, same in res] == want(False), f"rank {r}: {res}"


def refused_on_rank_1(comm) -> tuple[bool, str]:
    """Probe again with rank 1's reads refused (EPERM, as a ptrace policy would)."""
    if comm.rank == 1:
        def refuse(*_a, **_k):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        cma.read_into = refuse
    direct, why = ll_direct_probe.probe(comm.ll.ll, 30.0)
    return direct is None, why


def test_a_refused_probe_falls_back_on_every_rank():
    res = run_ranks(refused_on_rank_1, 3, timeout=60)
    assert res[1] == (True, "reading rank 0: " + os.strerror(errno.EPERM))
    for r in (0, 2):
        assert res[r] == (True, "rank 1 may not read its peers"), res[r]


def rank_1_dies(comm, count: int = 1000) -> tuple[int | None, str]:
    """Rank 1 killed after a first all-gather of ``count`` floats; what the survivors'
    second one raises (the peer it names, the message)."""
    x = np.ones(count, np.float32)
    comm.all_gather(x)  # planned on the direct path
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
    try:
        comm.all_gather(x)
    except (PeerError, CommAborted) as e:  # aborted: another survivor saw it first
        return e.peer, f"{type(e).__name__}: {e}"
    return None, "no error"


def test_a_killed_peer_is_named():
    res = run_ranks(rank_1_dies, 3, timeout=60, env=ALL_DIRECT)
    for r in (0, 2):
        peer, msg = res[r]
        assert peer in (1, None) and "rank 1 died" in msg, msg
    assert (1, True) in [(res[r][0], res[r][1].startswith("PeerError")) for r in (0, 2)], res


def post_unmapped(module, buf: np.ndarray) -> None:
    """From now on ``module``'s publication posts an address this process has not mapped
    for ``buf`` (its first ask for it: later ones, the own folds' and copies', stay
    true), so a peer's move of it fails in the kernel (EFAULT), in C or in Python. This
    rank's calls take the Python steps (the C entry posts the true addresses); its
    peers' may take the C entry, whose failed move is then what is tested."""
    ll_direct_entry.mode = lambda op: None
    real, posted = module.cma, [cma.address(buf)]

    class Unmapped:  # the module's cma, but buf's address unmapped once
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def address(a):
            at = real.address(a)
            if posted and at == posted[0]:
                posted.clear()
                return 4096
            return at
    module.cma = Unmapped()


def rank_1_cannot_read(comm) -> tuple[str, bool]:
    x = np.arange(10000, dtype=np.float32) + comm.rank
    keep = x.copy()
    if comm.rank == 0:
        post_unmapped(ll_direct, x)
    try:
        comm.reduce_scatter(x)
    except RingtreeError as e:
        return str(e), np.array_equal(x, keep)
    return "no error", np.array_equal(x, keep)


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_failed_read_is_raised_on_every_rank(native):
    env = {**ALL_DIRECT, "RINGTREE_LL_NATIVE": native}
    for msg, kept in run_ranks(rank_1_cannot_read, 2, timeout=60, env=env):
        assert "rank 1 could not read rank 0's buffer" in msg and kept, msg


def rank_1_cannot_write(comm) -> tuple[str, bool]:
    """An all-gather below LL's range on the single copy, which pushes: rank 0 posts an
    output address it has not mapped."""
    x = np.arange(10000, dtype=np.float32) + comm.rank
    keep, out = x.copy(), np.zeros(10000 * comm.size, np.float32)
    if comm.rank == 0:
        post_unmapped(ll_direct, out)
    try:
        comm.all_gather(x, out=out)
    except RingtreeError as e:
        return str(e), np.array_equal(x, keep)
    return "no error", np.array_equal(x, keep)


def test_a_failed_write_is_raised_on_every_rank():
    for msg, kept in run_ranks(rank_1_cannot_write, 2, timeout=60, env=ALL_DIRECT):
        assert "rank 1 could not write into rank 0's buffer" in msg and kept, msg


def test_compiled_and_ctypes_reads_agree():
    src = np.arange(1 << 16, dtype=np.uint8)
    child = os.fork()
    if child == 0:  # holds src (the same address) until killed
        time.sleep(30)
        os._exit(0)
    try:
        base = cma.address(src)
        # more spans than one system call takes, odd lengths, an empty one
        cuts = [(o, (o * 7) % 991 + 1) for o in range(0, 60000, 997)] + [(5, 0)]
        # bounced: through a scratch smaller than most spans, of an odd size
        ways = [(True, None), (False, None), (False, np.empty(333, np.uint8))]
        for python, scratch in ways:
            dst = np.zeros_like(src)
            cma.read_spans(child, [(cma.address(dst) + o, base + o, m) for o, m in cuts],
                           python=python, scratch=scratch)
            for o, m in cuts:
                assert np.array_equal(dst[o:o + m], src[o:o + m]), (python, o, m)
            with pytest.raises(OSError) as e:  # a page the peer has not mapped
                cma.read_spans(child, [(cma.address(dst), 4096, 8)], python=python,
                               scratch=scratch)
            assert e.value.errno == errno.EFAULT
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    gone = child  # reaped: ESRCH, which a Direct reports as the peer's death
    for python, scratch in ways:
        with pytest.raises(ProcessLookupError):
            cma.read_spans(gone, [(cma.address(src), base, 8)], python=python,
                           scratch=scratch)
    ll = SimpleNamespace(rank=0, n=2, peers={0: None, 1: SimpleNamespace(pid=gone)})
    with pytest.raises(PeerError, match=f"rank 1 died \\(pid {gone} is gone\\)") as e:
        ll_direct.Direct(ll, None).read(1, [(cma.address(src), base, 8)])
    assert e.value.peer == 1


def rank_1_stages(comm) -> str:
    """Rank 1 takes the segment's path for a call the others read directly."""
    if comm.rank == 1:
        comm.ll.direct = None
    try:
        comm.all_gather(np.ones(1000, np.float32))
    except RingtreeError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_ranks_on_different_paths_are_a_mismatch():
    for msg in run_ranks(rank_1_stages, 2, timeout=60, env=ALL_DIRECT):
        assert msg.startswith("MismatchError") and "single copy" in msg, msg


def torch_tensors(comm) -> list[str]:
    """bfloat16 (and float32) torch tensors through the communicator: direct against
    Simple's ``direct`` Program, bit for bit."""
    import torch

    bad = []
    for dt in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(comm.rank)
        x = (torch.randn(1003 * comm.size, generator=g) * 100).to(dt)
        for name, call in (("reduce_scatter", lambda a, **k: comm.reduce_scatter(a, **k)),
                           ("all_gather", lambda a, **k: comm.all_gather(a[:1003], **k))):
            before = _direct_calls()
            got = call(x)
            direct = _direct_calls() > before
            want = call(x, algo="direct")
            if not direct or not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                bad.append(f"{name} {dt}: {'differs' if direct else 'not direct'}")
    return bad


def test_torch_bfloat16():
    pytest.importorskip("torch")
    for r, bad in enumerate(run_ranks(torch_tensors, 2, timeout=60, env=ALL_DIRECT)):
        assert bad == [], f"rank {r}: {bad}"
