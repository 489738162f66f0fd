"""An outsider — a process without the job's environment, knowing only what `ps`,
`squeue` and the command line show — cannot drive the job's store, in every launch mode."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ringtree.bootstrap.job import job_id
from ringtree.bootstrap.jobtoken import bind_address
from ringtree.bootstrap.store import StoreClient, StoreError
from ringtree.testing import _ctx, free_port
from tests.rendezvous_helpers import LAUNCHER_VARS

OTHER_IP = bind_address("192.0.2.2") if bind_address("192.0.2.2") != "0.0.0.0" else None


def _public_tokens(env: dict[str, str], addr: str, port: int, world: int) -> list[str]:
    """Every token an outsider can compute from public job information."""
    job = job_id(env) or ""
    seeds = [f"ringtree-token|{job}|{a}|{p}{w}" for a in (addr, "localhost")
             for p in (port, port - 1) for w in ("", f"|{world}")]  # torchrun: MASTER_PORT+1
    return [hashlib.sha256(s.encode()).hexdigest()[:32] for s in seeds] + [""]


def _attack(addrs: list[str], port: int, tokens: list[str]) -> list[str]:
    """Try to write the abort key; return how every attempt that got in did it."""
    wins = []
    for addr in addrs:
        for tok in tokens:
            try:
                with StoreClient(addr, port, tok, connect_timeout=1.0, timeout=2.0) as c:
                    c.set("rt/world/abort", b"attacker wrote this")
                    wins.append(f"{addr} with token {tok!r}")
            except StoreError:
                pass
    return wins


def _job(comm, ready, go):
    x = np.full(8, comm.rank + 1, np.int64)
    comm.all_reduce(x)
    ready.put(comm.rank)
    go.wait(60)
    comm.barrier()  # a written abort key would make this raise
    return int(x[0])


def _entry(env, conn, ready, go):
    import warnings

    for k in list(os.environ):
        if k.startswith("RINGTREE_") or k in LAUNCHER_VARS:
            del os.environ[k]
    os.environ.update(env)
    try:
        import ringtree

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            comm = ringtree.init(timeout=30)
        try:
            value = _job(comm, ready, go)
        finally:
            comm.close()
        conn.send(("ok", (value, [str(w.message) for w in caught
                                   if str(w.message).startswith("ringtree:")])))
    except BaseException as e:  # noqa: BLE001
        conn.send(("err", e))


def _run_mode(envs, store_port, world, master="127.0.0.1"):
    ctx = _ctx()
    ready, go = ctx.Queue(), ctx.Event()
    pipes, procs = [], []
    for env in envs:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_entry, args=(env, child, ready, go), daemon=True)
        p.start()
        pipes.append(parent)
        procs.append(p)
    try:
        for _ in envs:
            ready.get(timeout=60)
        addrs = ["127.0.0.1"] + ([OTHER_IP] if OTHER_IP else [])
        wins = _attack(addrs, store_port, _public_tokens(envs[0], master, store_port, world))
        go.set()
        results = []
        for c in pipes:
            assert c.poll(60), "a rank did not finish"
            results.append(c.recv())
        return wins, results
    finally:
        go.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def _torchrun(r, port):
    return {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "none"}


def _openmpi(r, port, **extra):
    return {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_MCA_ess_base_jobid": "4242", "RINGTREE_MASTER_PORT": str(port), **extra}


def _pmi(r, port):
    return {"PMI_RANK": str(r), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(r),
            "MPI_LOCALNRANKS": "2", "PMI_KVSNAME": "kvs_77_0",
            "RINGTREE_MASTER_PORT": str(port)}


def _slurm(r, port):
    return {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
            "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_ID": "991", "SLURM_STEP_ID": "0",
            "SLURM_NODELIST": "localhost", "RINGTREE_MASTER_PORT": str(port)}


MODES = {
    "torchrun": (_torchrun, 1),  # rank 0's store is on MASTER_PORT + 1
    "openmpi": (_openmpi, 0),
    "openmpi-psm-key": (lambda r, p: _openmpi(
        r, p, OMPI_MCA_orte_precondition_transports="0f1e2d3c4b5a6978-8796a5b4c3d2e1f0"), 0),
    "pmi": (_pmi, 0),
    "slurm": (_slurm, 0),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_outsider_cannot_write_the_store(mode):
    make, offset = MODES[mode]
    port = free_port(span=offset + 1)
    wins, results = _run_mode([make(0, port), make(1, port)], port + offset, 2)
    assert wins == [], f"{mode}: an outsider wrote the store via {wins}"
    for status, value in results:
        assert status == "ok", value
        total, warned = value
        assert total == 3 and warned == [], value


def test_ringtree_run_store_is_private(tmp_path):
    script = tmp_path / "job.py"
    flag = tmp_path / "go"
    script.write_text(textwrap.dedent(f"""
        import os, time, ringtree
        comm = ringtree.init(timeout=30)
        if comm.rank == 0:
            print("PORT", os.environ["RINGTREE_MASTER_PORT"], flush=True)
        while not os.path.exists({str(flag)!r}):
            time.sleep(0.05)
        comm.barrier()
        comm.close()
    """))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RINGTREE_") and k not in LAUNCHER_VARS}
    proc = subprocess.Popen([sys.executable, "-m", "ringtree.cli", "run", "-n", "2",
                             sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT"), line
        port = int(line.split()[1])
        addrs = ["127.0.0.1"] + ([OTHER_IP] if OTHER_IP else [])
        wins = _attack(addrs, port, _public_tokens(env, "127.0.0.1", port, 2))
        flag.write_text("")
        assert proc.wait(60) == 0
        assert wins == []
    finally:
        flag.write_text("")
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(OTHER_IP is None, reason="needs a non-loopback local address")
def test_multi_host_without_secret_warns_and_binds_only_the_master_address():
    port = free_port(span=2)
    envs = [{"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
             "MASTER_ADDR": OTHER_IP, "MASTER_PORT": str(port),
             "RINGTREE_HOST_ID": f"host{r}", "RINGTREE_TRANSPORT": "tcp"} for r in range(2)]
    ctx = _ctx()
    ready, go = ctx.Queue(), ctx.Event()
    pipes, procs = [], []
    for env in envs:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_entry, args=(env, child, ready, go), daemon=True)
        p.start()
        pipes.append(parent)
        procs.append(p)
    try:
        for _ in envs:
            ready.get(timeout=60)
        # nothing secret exists here; at least the store is not on every interface
        assert _attack(["127.0.0.1"], port + 1, ["x"]) == []
        with pytest.raises(StoreError, match="refused the job token"):
            StoreClient(OTHER_IP, port + 1, "wrong", connect_timeout=2.0)
        go.set()
        results = [c.recv() for c in pipes if c.poll(60)]
    finally:
        go.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    assert [s for s, _ in results] == ["ok", "ok"], results
    warned = results[0][1][1]
    assert len(warned) == 1 and "RINGTREE_TOKEN" in warned[0], warned
    assert results[1][1][1] == []
