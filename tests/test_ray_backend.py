"""ringtree as a ``ray.util.collective`` backend, on a local Ray cluster: 2 and 3 actors
run every collective (NumPy arrays, and a torch tensor), checked against exact results;
the group is made from inside the actors and from the driver."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")
col = pytest.importorskip("ray.util.collective")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    import ringtree.ray  # noqa: F401 - the driver registers too (create_collective_group)

    actors = [Member.remote() for _ in range(3)]  # groups of 2 and 3 over the same actors
    yield actors
    for a in actors:
        ray.kill(a)
    ray.shutdown()


@ray.remote(num_cpus=0)
class Member:
    def __init__(self):
        import ringtree.ray  # noqa: F401 - registers the backend in this actor

    def join(self, group: str, rank: int, size: int) -> None:
        col.init_collective_group(size, rank, backend="RINGTREE", group_name=group)

    def leave(self, group: str) -> None:
        col.destroy_collective_group(group)

    def everything(self, group: str) -> dict:
        handle = col.collective.get_group_handle(group)  # a driver-declared group is made here
        r, n = handle.rank, handle.world_size
        out: dict = {}
        x = np.arange(6, dtype=np.int64) + 10 * r
        col.allreduce(x, group_name=group)
        out["allreduce sum"] = x
        for name, op in (("prod", col.types.ReduceOp.PRODUCT),
                         ("min", col.types.ReduceOp.MIN), ("max", col.types.ReduceOp.MAX)):
            y = np.full(4, r + 2, dtype=np.float64)
            col.allreduce(y, group_name=group, op=op)
            out[f"allreduce {name}"] = y
        col.barrier(group_name=group)
        z = np.full(5, float(r + 1), dtype=np.float32)
        col.reduce(z, dst_rank=n - 1, group_name=group)
        out["reduce"] = z
        b = np.full(3, r, dtype=np.int32) if r == 1 else np.zeros(3, np.int32)
        col.broadcast(b, src_rank=1, group_name=group)
        out["broadcast"] = b
        gathered = [np.zeros(4, np.int16) for _ in range(n)]
        col.allgather(gathered, np.full(4, r * 3, np.int16), group_name=group)
        out["allgather"] = np.stack(gathered)
        blocks = [np.full(7, float(100 * r + k), np.float64) for k in range(n)]
        before = [blk.copy() for blk in blocks]
        mine = np.zeros(7, np.float64)
        col.reducescatter(mine, blocks, group_name=group)
        out["reducescatter"] = mine
        out["reducescatter inputs intact"] = all(np.array_equal(a, b)
                                                 for a, b in zip(blocks, before))
        if r == 0:
            col.send(np.arange(9, dtype=np.float32), 1, group_name=group)
        elif r == 1:
            got = np.zeros(9, np.float32)
            col.recv(got, 0, group_name=group)
            out["recv"] = got
        import torch

        t = torch.full((3, 2), float(r + 1))[:, 0]  # torch tensor, non-contiguous
        col.allreduce(t, group_name=group)
        out["torch non-contiguous"] = t.numpy().copy()
        out["rank"] = col.get_rank(group)
        return out


def _expected(n: int, r: int) -> dict:
    e = {"allreduce sum": sum(np.arange(6, dtype=np.int64) + 10 * k for k in range(n)),
         "allreduce prod": np.full(4, float(np.prod([k + 2 for k in range(n)]))),
         "allreduce min": np.full(4, 2.0), "allreduce max": np.full(4, float(n + 1)),
         "broadcast": np.full(3, 1, np.int32),
         "allgather": np.stack([np.full(4, k * 3, np.int16) for k in range(n)]),
         "reducescatter": np.full(7, float(sum(100 * k + r for k in range(n)))),
         "reducescatter inputs intact": True,
         "torch non-contiguous": np.full(3, float(n * (n + 1) // 2)), "rank": r}
    if r == n - 1:
        e["reduce"] = np.full(5, float(n * (n + 1) // 2), np.float32)
    if r == 1:
        e["recv"] = np.arange(9, dtype=np.float32)
    return e


def _check(results: list[dict], n: int) -> None:
    for r, got in enumerate(results):
        for key, want in _expected(n, r).items():
            assert np.array_equal(np.asarray(got[key]), np.asarray(want)), (r, key, got[key])


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_from_actors(cluster, n):
    actors, group = cluster[:n], f"inside{n}"
    ray.get([a.join.remote(group, r, n) for r, a in enumerate(actors)])
    _check(ray.get([a.everything.remote(group) for a in actors]), n)
    ray.get([a.leave.remote(group) for a in actors])


def test_group_declared_by_driver(cluster):
    actors = cluster[1:]  # ranks in the driver's order, not the actors' creation order
    col.create_collective_group(actors, 2, [1, 0], backend="RINGTREE", group_name="declared")
    got = ray.get([a.everything.remote("declared") for a in actors])
    _check([got[1], got[0]], 2)
    ray.get([a.leave.remote("declared") for a in actors])


def test_bad_input_is_named():
    from ringtree.ray.group import _one, _stage

    with pytest.raises(TypeError, match="numpy.ndarray or torch CPU tensors"):
        _stage([1, 2, 3], True)
    with pytest.raises(ValueError, match="expected one tensor per process, got 2"):
        _one([np.zeros(1), np.zeros(1)], "allreduce")
