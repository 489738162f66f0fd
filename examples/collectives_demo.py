"""Run every collective once on every rank, check it, and print a result/time table.

    ringtree run -n 4 python examples/collectives_demo.py
    torchrun --nproc-per-node 4 examples/collectives_demo.py
    mpirun -n 4 python examples/collectives_demo.py
"""

from __future__ import annotations

import sys
import time

import numpy as np

import ringtree


def main() -> int:
    comm = ringtree.init()
    n, r = comm.size, comm.rank
    count = 1 << 18  # 1 MiB of float32 per rank
    rows = []

    def timed(name, fn, check):
        comm.barrier()
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        ok = bool(check(result))
        oks = comm.all_gather(np.array([ok], dtype=np.uint8))
        rows.append((name, "ok" if oks.all() else "WRONG", dt * 1e6))

    x = np.full(count, r + 1, dtype=np.float32)
    timed("all_reduce", lambda: comm.all_reduce(x), lambda y: (y == n * (n + 1) / 2).all())
    timed("all_gather", lambda: comm.all_gather(np.full(count // n, r, np.int32)),
          lambda y: (y == np.arange(n)[:, None]).all())
    timed("reduce_scatter", lambda: comm.reduce_scatter(np.ones(count, np.float32)),
          lambda y: (y == n).all())
    timed("broadcast", lambda: comm.broadcast(np.full(count, r, np.float32), root=0),
          lambda y: (y == 0).all())
    timed("reduce", lambda: comm.reduce(np.full(count, r, np.int64), root=n - 1),
          lambda y: r != n - 1 or (y == n * (n - 1) // 2).all())
    timed("gather", lambda: comm.gather(np.full(4, r), root=0),
          lambda y: r != 0 or (y == np.arange(n)[:, None]).all())
    timed("scatter", lambda: comm.scatter(np.arange(n * 4).reshape(n, 4) if r == 0 else None,
                                          root=0, out=np.empty(4, dtype=np.int64)),
          lambda y: (y == np.arange(4) + 4 * r).all())
    timed("all_to_all", lambda: comm.all_to_all(np.arange(n) + 100 * r),
          lambda y: (y == np.arange(n) * 100 + r).all())
    buf = np.empty(3, np.int64)

    def ring_pass():
        if n == 1:
            return np.full(3, r)
        with comm.group():
            comm.send(np.full(3, r), (r + 1) % n)
            comm.recv(buf, (r - 1) % n)
        return buf

    timed("send/recv", ring_pass, lambda y: (y == (r - 1) % n).all())
    timed("barrier", comm.barrier, lambda y: True)

    if r == 0:
        print(f"ringtree {ringtree.__version__}: {n} ranks, transport "
              f"{', '.join(sorted({t.name for t in comm.fabric.transports})) or 'none'}")
        print(f"{'collective':<16}{'result':>8}{'time (us)':>12}")
        for name, status, us in rows:
            print(f"{name:<16}{status:>8}{us:>12.1f}")
    bad = any(status != "ok" for _, status, _ in rows)
    comm.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
