"""``ringtree train --elastic``: data-parallel training that loses nothing when a rank dies.

The run has ``L`` *logical* ranks, the world size at start, for its whole life. Logical
rank ``l`` owns rows ``[l·B/L, (l+1)·B/L)`` of global batch ``k``
(:func:`ringtree.apps.models.data.global_batch`) and one place in the reduction order.
A step is:

1. every process computes the gradient of each logical rank it plays (forward and
   backward on that shard, micro-batch by micro-batch, into a flat float32 vector);
2. one ``all_gather`` over the processes brings every logical rank's gradient, tagged
   with its logical rank, to every process;
3. every process sums them *in logical order* ``g_0 + g_1 + … + g_{L-1}`` and divides by
   ``L``, then takes an AdamW step on its replica of the flat parameters.

The sum's order depends on logical ranks only, never on which process computed what, and
a logical rank's gradient is the same bits on any process (the same weights, the same
rows, one torch thread). So when a process dies, the survivors revoke, agree and shrink
(:mod:`ringtree.resilience`), hand the dead process's logical ranks to survivors
(round-robin in world-rank order), bring every survivor to the newest committed step
(a survivor that had not finished step ``k`` when another had receives its parameters,
Adam moments and sample counts by broadcast), and re-execute the step: the final
parameters are bitwise those of a run without the failure, and every sample is used
exactly once. The cost: the gradient exchange moves ``L`` gradients to every process
(an all-gather, ``(L-1)/L·L·P`` bytes in), where a ring all-reduce moves ``2(L-1)/L·P``
— the price of a reduction order that no failure can change. tp and pp are refused;
ZeRO-1 is :mod:`ringtree.apps.parallel.elastic_zero`.

Failure drills: ``--kill RANK:STEP[:PHASE]`` (repeatable) makes world rank ``RANK`` SIGKILL itself in
step ``STEP``: during ``compute`` (after its first forward), during ``allreduce`` (with
its contribution to the exchange issued and the others inside it) or in ``optimizer``
(after the exchange, before its update); a random phase when omitted.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import signal
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ringtree.apps.models import data
from ringtree.apps.models.gpt import GPT, init_state_dict

PHASES = ("compute", "allreduce", "optimizer")
DRILLS = PHASES + ("transfer",)  # transfer: as a source of a recovery's state transfer
KILLED = "elastic/killed"  # store key of a drill's time of death, per world rank
BETAS, EPS = (0.9, 0.95), 1e-8


@dataclass(frozen=True)
class Kill:
    rank: int
    step: int
    phase: str


def parse_kill(text: str, seed: int | None = None) -> Kill:
    """``RANK:STEP[:PHASE]`` (PHASE one of :data:`DRILLS`; random among :data:`PHASES`
    when omitted; ``transfer`` fires when that rank is about to stream state to a newcomer
    in a recovery of step STEP)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.strip().isdigit() for p in parts[:2]):
        raise ValueError(f"--kill {text!r}: expected RANK:STEP[:PHASE], e.g. 2:5:allreduce")
    phase = parts[2] if len(parts) == 3 else random.Random(seed).choice(PHASES)
    if phase not in DRILLS:
        raise ValueError(f"--kill {text!r}: phase must be one of {', '.join(DRILLS)}")
    return Kill(int(parts[0]), int(parts[1]), phase)


def moments(m: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> None:
    """Adam's moment updates in place (Kingma & Ba, ICLR 2015), elementwise."""
    b1, b2 = BETAS
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)


def adamw(spec, step: int, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
          g: torch.Tensor) -> None:
    """AdamW without weight decay (Loshchilov & Hutter, ICLR 2019) of step ``step``,
    elementwise and in place on ``p``, ``m``, ``v`` (whole vectors or any block of them:
    the same bits either way); the learning rate warms up linearly as the trainer's does."""
    t = step + 1
    lr = spec.lr * min(1.0, t / max(1, spec.warmup))
    b1, b2 = BETAS
    moments(m, v, g)
    denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(EPS)
    p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


class ElasticTrainer:
    """One process of an elastic data-parallel run (see the module docstring)."""

    def __init__(self, spec, comm, kills: list[Kill] | None = None, *,
                 logical: int | None = None, max_restarts: int = 0, corrupt: int = -1):
        cfg = spec.model
        self.spec, self.comm, self.kills = spec, comm, list(kills or ())
        self.L = logical or comm.size
        self.max_restarts = max_restarts  # the launcher's replacements, in all
        self.corrupt = corrupt  # drill: the first state transfer damages this chunk
        if spec.batch_size % (self.L * spec.micro_batches):
            raise ValueError(f"--batch-size {spec.batch_size} does not split into "
                             f"{self.L} ranks x {spec.micro_batches} micro-batches")
        self.me = comm.world_ranks[comm.rank]
        self.model = GPT(cfg)
        self.model.load_state_dict(init_state_dict(cfg, spec.seed))
        params = list(self.model.parameters())
        self.flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.grad = torch.zeros_like(self.flat)
        off = 0
        for p in params:  # parameters and gradients become views of two flat vectors
            n = p.numel()
            p.data = self.flat[off:off + n].view_as(p)
            p.grad = self.grad[off:off + n].view_as(p)
            off += n
        self.step = 0
        self.owner = list(comm.world_ranks)          # logical rank -> world rank playing it
        self._init_optimizer()
        self.counts = np.zeros(spec.steps * spec.batch_size, np.int32)  # uses per sample
        self.losses: list[float] = []
        self.failures: list[dict] = []
        self.pending: BaseException | None = None  # a failure still to recover from

    def _init_optimizer(self) -> None:
        self.m, self.v = torch.zeros_like(self.flat), torch.zeros_like(self.flat)

    # ---- one step ------------------------------------------------------------------------

    def mine(self) -> list[int]:
        return [lg for lg, w in enumerate(self.owner) if w == self.me]

    def _due(self, phase: str) -> bool:
        return any(k.rank == self.me and k.step == self.step and k.phase == phase
                   for k in self.kills)

    def _fire(self, phase: str) -> None:
        if self._due(phase):  # the time goes to the store: "resumed_s" is measured from it
            self.comm.store.set(f"{KILLED}/{self.me}", repr(time.time()).encode())
            os.kill(os.getpid(), signal.SIGKILL)

    def _shard_grad(self, lg: int) -> float:
        """Gradient of logical rank ``lg`` for this step into ``self.grad``; its loss."""
        s = self.spec
        x, y = data.global_batch("train", self.step, s.batch_size, s.model.block_size, s.seed)
        x, y = data.shard_rows(x, lg, self.L), data.shard_rows(y, lg, self.L)
        mb = s.batch_size // (self.L * s.micro_batches)
        self.grad.zero_()
        total = 0.0
        for xm, ym in zip(x.split(mb), y.split(mb)):
            logits = self.model(xm)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ym.reshape(-1))
            self._fire("compute")
            (loss / s.micro_batches).backward()
            total += float(loss.detach()) / s.micro_batches
        return total

    @property
    def slots(self) -> int:
        """The most logical ranks any process plays (the exchange's rows per process)."""
        return max(self.owner.count(w) for w in set(self.owner))

    def _compute(self, each) -> np.ndarray:
        """Every logical rank of this process: its gradient, handed to ``each(slot,
        grad)``; the exchange's metadata rows (logical rank, its loss)."""
        meta = np.full((self.slots, 2), -1.0, np.float64)
        for i, lg in enumerate(self.mine()):
            meta[i] = (lg, self._shard_grad(lg))
            each(i, self.grad.numpy())
        return meta

    def _exchange(self, call, x: np.ndarray) -> np.ndarray:
        """``call(x)`` (the gradient exchange); a drill's ``allreduce`` kill fires with our
        part issued and the others inside it."""
        if not self._due("allreduce"):
            return call(x)
        work = call(x, async_op=True)
        self._fire("allreduce")
        work.wait()
        return work.result()

    def _where(self, meta: np.ndarray) -> dict[int, int]:
        """Logical rank -> its row in the all-gathered metadata (each exactly once)."""
        metas = self.comm.all_gather(meta).reshape(-1, 2)
        self._metas = metas
        held = sorted(int(lg) for lg in metas[:, 0] if lg >= 0)
        if held != list(range(self.L)):
            raise RuntimeError(f"step {self.step}: the exchange holds logical ranks "
                               f"{held}, not each of 0..{self.L - 1} once")
        return {lg: i for i, lg in enumerate(metas[:, 0].astype(int)) if lg >= 0}

    def train_step(self) -> None:
        """Compute, exchange, sum in logical order, update (raises on a failure)."""
        P = self.flat.numel()
        grads = np.zeros((self.slots, P), np.float32)
        meta = self._compute(grads.__setitem__)
        every = self._exchange(self.comm.all_gather, grads).reshape(-1, P)
        where = self._where(meta)
        total = np.zeros(P, np.float32)
        for lg in range(self.L):  # the reduction order: logical ranks, always
            total += every[where[lg]]
        total /= np.float32(self.L)
        self._fire("optimizer")
        adamw(self.spec, self.step, self.flat, self.m, self.v, torch.from_numpy(total))
        self._commit(where)

    def _commit(self, where: dict[int, int]) -> None:
        """The step is done: count its samples and loss, move on."""
        B = self.spec.batch_size
        for lg in where:
            lo = self.step * B + lg * (B // self.L)
            self.counts[lo:lo + B // self.L] += 1
        self.losses.append(float(sum(self._metas[where[lg], 1] for lg in range(self.L))
                                 / self.L))
        self.step += 1
        if self.failures and "resumed_s" not in self.failures[-1]:
            self._resumed(self.failures[-1])

    def _resumed(self, event: dict) -> None:
        """The first step committed after a recovery: seconds since the drill's kill."""
        killed = [self.comm.store.try_get(f"{KILLED}/{w}") for w in event["dead"]]
        if killed and all(killed):
            event["resumed_s"] = round(time.time() - max(float(k) for k in killed), 4)
        else:
            event["resumed_s"] = None  # not a drill: no time of death

    # ---- recovery --------------------------------------------------------------------------

    def recover(self, err: BaseException) -> None:
        """Revoke and agree; replace the dead (while the launcher has restarts left) or
        shrink and give their logical ranks to survivors; bring everyone to the newest
        committed step."""
        from ringtree.resilience.state import state

        t0 = time.monotonic()
        old = self.comm
        old.revoke()
        left = self.max_restarts - sum(len(f["dead"]) for f in self.failures)
        if self.max_restarts:  # one decision on every rank: a newcomer whose first state
            # transfer failed has not received the run's failures and counts too many
            # restarts left; the AND of "bits 0..left" masks is the smallest count's
            left = old.agree((1 << (max(0, min(left, 30)) + 1)) - 1).bit_length() - 1
        child = old.replace(limit=left) if left > 0 else old.shrink()
        alive = list(child.world_ranks)
        dead = sorted(old.world_ranks[r] for r in state(old).failed)
        self._adopt(old, alive)
        self.comm = child
        self.failures.append({"step": self.step, "dead": dead, "ranks": alive,
                              "how": "replace" if len(alive) == old.size else "shrink",
                              "error": type(err).__name__})
        self._sync(fresh=False, t0=t0)

    def _adopt(self, old, alive: list[int]) -> None:
        """The dead processes' logical ranks go to survivors, round-robin in world-rank
        order."""
        orphans = [lg for lg, w in enumerate(self.owner) if w not in alive]
        for i, lg in enumerate(orphans):
            self.owner[lg] = alive[i % len(alive)]

    def join(self) -> None:
        """A replacement (``RINGTREE_JOIN=1``): receive the state from the survivors; a
        rank that dies meanwhile is recovered from in :meth:`run`, as by the others."""
        from ringtree.errors import RecoveryError, RingtreeError

        try:
            self._sync(fresh=True, t0=time.monotonic())
        except RecoveryError:
            raise
        except RingtreeError as e:
            self.pending = e

    def _sync(self, fresh: bool, t0: float) -> None:
        """Collective over the new communicator: whoever is behind the newest committed
        step (a newcomer; a survivor that had not finished the step another finished)
        receives parameters, Adam moments and sample counts, streamed from every rank at
        that step with checksums (:func:`ringtree.resilience.transfer.stream`), and the
        run's bookkeeping from the first of them."""
        from ringtree.resilience.transfer import stream

        comm = self.comm
        steps = comm.all_gather(np.array([-1 if fresh else self.step], np.int64)).reshape(-1)
        newest = int(steps.max())
        self._catch_up(newest, fresh)
        sources = [r for r in range(comm.size) if steps[r] == newest]
        dests = [r for r in range(comm.size) if steps[r] != newest]
        moved = None
        if dests:
            if comm.rank in sources:
                self._fire("transfer")
            t1 = time.monotonic()
            bad = self.corrupt
            self.corrupt = -1

            def damage(i: int, chunk: np.ndarray) -> np.ndarray:
                return chunk if i != bad else np.bitwise_xor(chunk, np.uint8(1))

            moved = stream(comm, self._replicated(), sources, dests, chunk_bytes=1 << 18,
                           corrupt=damage if bad >= 0 else None)
            moved["seconds"] = round(time.monotonic() - t1, 4)
            moved["sources"] = len(sources)
            book = (self.step, self.owner, self.losses, self.failures)
            book = comm.broadcast_object(book, root=sources[0])
            self.step, self.owner, self.losses, self.failures = \
                book[0], list(book[1]), list(book[2]), [dict(f) for f in book[3]]
        moved = self._place_state(moved)
        if self.failures:
            self.failures[-1]["transfer"] = moved
            self.failures[-1]["recovery_s"] = round(time.monotonic() - t0, 4)

    def _replicated(self) -> list[np.ndarray]:
        """What every process holds whole (a process behind receives it)."""
        return [self.flat.numpy(), self.m.numpy(), self.v.numpy(), self.counts]

    def _catch_up(self, newest: int, fresh: bool) -> None:
        """Before the transfer: bring local state to step ``newest`` where possible (ZeRO)."""

    def _place_state(self, moved: dict | None) -> dict | None:
        """After the transfer: put sharded state where the new membership wants it (ZeRO)."""
        return moved

    def run(self) -> None:
        from ringtree.errors import RecoveryError, RingtreeError

        pending, self.pending = self.pending, None
        while self.step < self.spec.steps or pending is not None:
            try:
                if pending is not None:  # again if another rank dies during recovery
                    err, pending = pending, None
                    self.recover(err)
                else:
                    self.train_step()
            except RecoveryError:
                raise
            except RingtreeError as e:
                pending = e

    def report(self) -> dict:
        """``param_sha256``: digest of the final parameters; ``samples``: how often each
        sample id (step·batch + row) was used, as a digest and its extremes."""
        c = self.counts
        return {"param_sha256": hashlib.sha256(self.flat.numpy().tobytes()).hexdigest(),
                "samples": {"sha256": hashlib.sha256(c.tobytes()).hexdigest(),
                            "ids": int(c.size), "min_uses": int(c.min()),
                            "max_uses": int(c.max())},
                "losses": self.losses, "failures": self.failures, "logical_ranks": self.L,
                "ranks_at_end": self.comm.size, "steps": self.step}
