"""A real torchft training loop on ringtree, with a replica killed mid-run.

torchft (``pip install torchft``; not a dependency of ringtree) runs fault-tolerant data
parallelism across *replica groups*: a Lighthouse forms a quorum of live replicas each
step, every replica's ``Manager`` reconfigures its cross-replica process group over the
quorum (``configure``), gradients are averaged through it, and a replica that joins late
fetches the state from a live peer. Here that process group is ringtree's
(:class:`ProcessGroupRingtree`: :class:`ringtree.torch.reconfigurable.ReconfigurableGroup`
under torchft's ``ProcessGroup`` class, the way torchft is extended).

The drill: ``--replicas`` single-process replica groups train a small MLP with torchft's
``DistributedDataParallel`` and ``OptimizerWrapper`` for ``--steps`` committed steps;
replica ``--kill-replica`` SIGKILLs itself in step ``--kill-step``; with ``--restart`` the
driver starts it again (it rejoins, receives the state over torchft's HTTP transport,
and trains on). Each replica prints one JSON line: the steps it committed, the number of
participants of each of its steps, and a SHA-256 of its final parameters; the driver
reports whether every replica that finished holds the same parameters.

    python benchmarks/torchft_loop.py --replicas 3 --steps 40 --kill-step 5 --restart

Without torchft the script says so and exits 0 (nothing to run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replica(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    from torch import nn
    from torch.distributed import TCPStore
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroup as TorchftProcessGroup

    from ringtree.torch.reconfigurable import ReconfigurableGroup

    class ProcessGroupRingtree(ReconfigurableGroup, TorchftProcessGroup):
        """torchft's reconfigurable group, on ringtree."""

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd) -> None:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    # the replica group's own store (torchrun's role; one process per replica group here)
    store = TCPStore("127.0.0.1", args.store_port, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupRingtree(timedelta(seconds=30)), min_replica_size=2,
        load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"replica{args.replica}", store_addr="127.0.0.1",
        store_port=args.store_port, rank=0, world_size=1,
        lighthouse_addr=args.lighthouse, timeout=timedelta(seconds=30),
        quorum_timeout=timedelta(seconds=60), connect_timeout=timedelta(seconds=30))
    ddp = DistributedDataParallel(manager, model)
    optim = OptimizerWrapper(manager, opt)
    participants, t0 = [], time.monotonic()
    while manager.current_step() < args.steps:
        step = manager.current_step()
        if args.kill and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * step + args.replica)
        x, y = torch.randn(8, 16, generator=g), torch.randint(4, (8,), generator=g)
        optim.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        time.sleep(args.step_ms / 1000)  # stands for compute, so a restart can catch up
        optim.step()  # commits (advances current_step) only if the quorum's step succeeded
        participants.append((step, manager.num_participants(), manager.current_step() > step))
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    print(json.dumps({"replica": args.replica, "step": manager.current_step(),
                      "participants": participants, "param_sha256": digest,
                      "seconds": round(time.monotonic() - t0, 2)}), flush=True)
    manager.shutdown(wait=False)
    del store
    os._exit(0)  # torchft's background threads would keep the process alive


def _start(args: argparse.Namespace, i: int, lighthouse: str, kill: bool) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--replica", str(i), "--lighthouse",
           lighthouse, "--store-port", str(_free_port()), "--steps", str(args.steps),
           "--kill-step", str(args.kill_step), "--step-ms", str(args.step_ms)] + (["--kill"] if kill else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _drive(args: argparse.Namespace) -> int:
    from torchft._torchft import LighthouseServer

    lh = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=1000,
                          heartbeat_timeout_ms=args.heartbeat_ms)
    procs = {i: _start(args, i, lh.address(), i == args.kill_replica)
             for i in range(args.replicas)}
    t0, events, results = time.monotonic(), [], {}
    try:
        while procs:
            for i, p in list(procs.items()):
                rc = p.poll()
                if rc is None:
                    continue
                out = p.stdout.read()
                del procs[i]
                events.append({"replica": i, "exit": rc, "at_s": round(time.monotonic() - t0, 2)})
                if rc == -signal.SIGKILL and args.restart:
                    procs[i] = _start(args, i, lh.address(), False)
                    events.append({"replica": i, "restarted": True})
                for line in out.splitlines():
                    if line.startswith("{"):
                        results[i] = json.loads(line)
            if time.monotonic() - t0 > args.timeout:
                raise TimeoutError(f"replicas {sorted(procs)} still running after "
                                   f"{args.timeout} s")
            time.sleep(0.2)
    finally:
        for p in procs.values():
            p.kill()
        lh.shutdown()
    digests = {r["param_sha256"] for r in results.values()}
    summary = {"events": events, "results": results, "finished": sorted(results),
               "same_params": len(digests) == 1}
    print(json.dumps(summary))
    return 0 if len(digests) == 1 and results else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=200.0, help="sleep per step (compute)")
    ap.add_argument("--kill-replica", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=5)
    ap.add_argument("--restart", action="store_true", help="start the killed replica again")
    ap.add_argument("--heartbeat-ms", type=int, default=5000,
                    help="the Lighthouse's heartbeat timeout (torchft's default: 5000)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--replica", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    ap.add_argument("--store-port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--kill", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        import torchft  # noqa: F401
    except ImportError as e:
        print(f"skipped: torchft is not installed ({e}); pip install torchft to run this")
        return 0
    if args.replica is not None:
        _replica(args)
        return 0
    return _drive(args)


if __name__ == "__main__":
    sys.exit(main())
