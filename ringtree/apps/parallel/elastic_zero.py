"""``ringtree train --elastic --zero 1``: ZeRO-1 that loses nothing when a rank dies.

ZeRO stage 1 (Rajbhandari et al., SC 2020, arXiv 1910.02054) keeps Adam's two moments
only for a block of the parameters per data-parallel rank. Here logical rank ``l`` (of
the run's ``L``, as in :mod:`ringtree.apps.parallel.elastic`) owns block ``l`` of the
flat parameter vector (``ceil(P/L)`` elements, the last one shorter). A step is:

1. every process computes the gradient of each logical rank it plays;
2. one ``all_to_all`` sends block ``j`` of every gradient to the process playing logical
   rank ``j`` — the volume of a reduce-scatter, ``(L-1)/L·P`` per logical rank, but
   unreduced, so that the owner sums ``g_0 + … + g_{L-1}`` *in logical order* (the same
   bits wherever block ``j`` is summed);
3. the owner takes the AdamW step of its block, and sends the summed block to the
   block's *buddy* (the next process, in world-rank order, after the owner), which
   applies the same moment update to its mirror of the block's moments (the same ops on
   the same bits: the same result);
4. one ``all_gather`` of the updated blocks gives every process the whole parameters.

The step commits (moments, parameters, counts) only when the all-gather is done; until
then the new moments are kept aside. So after a failure a process is either at step
``k`` with the step's moments aside (everyone contributed to the all-gather) or at
``k+1``; one behind commits what it kept aside and receives the parameters.

**Where the dead rank's optimizer state comes from: the buddy's mirror**, kept current
every step, not recomputed (the moments depend on every gradient since step 0; there is
nothing to recompute them from short of replaying the run). With *shrink*, the dead
process's logical ranks go to their buddies, which already hold the moments; with
*replace*, the newcomer takes the dead process's logical ranks and receives their
moments from the buddies (and the blocks it mirrors from their owners). Then every block
whose owner or buddy changed is sent where the new membership wants it. The cost, per
step and logical rank: one block (``P/L`` floats) more on the wire, 1/``L`` of the
all-to-all's and all-gather's ``2(L-1)/L·P``; in memory, a second copy of the moments of
the blocks a process mirrors (``16P/L`` bytes per process in all instead of ZeRO-1's
``8P/L``, still below plain DP's ``8P`` from ``L = 3`` on). An owner and its buddy dying
in the same failure lose that block's moments: a clear :class:`RecoveryError`.
"""

from __future__ import annotations

import numpy as np
import torch

from ringtree.apps.parallel.elastic import ElasticTrainer, adamw, moments


class ElasticZeroTrainer(ElasticTrainer):
    """One process of an elastic ZeRO-1 run (see the module docstring)."""

    # ---- layout -------------------------------------------------------------------------

    def _init_optimizer(self) -> None:
        P = self.flat.numel()
        self.blk = -(-P // self.L)
        self.moments: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            lg: (torch.zeros(self._len(lg)), torch.zeros(self._len(lg)))
            for lg in self._held(self.me)}
        self.aside: tuple[int, dict] | None = None  # (step, moments kept aside)

    def _span(self, lg: int) -> slice:
        return slice(lg * self.blk, min((lg + 1) * self.blk, self.flat.numel()))

    def _len(self, lg: int) -> int:
        s = self._span(lg)
        return max(0, s.stop - s.start)

    def _alive(self) -> list[int]:
        return list(self.comm.world_ranks)

    def buddy(self, lg: int, alive: list[int] | None = None) -> int | None:
        """The process that mirrors block ``lg``'s moments: the next one after its owner."""
        alive = alive or self._alive()
        if len(alive) < 2:
            return None
        return alive[(alive.index(self.owner[lg]) + 1) % len(alive)]

    def _held(self, w: int) -> list[int]:
        """Blocks whose moments process ``w`` keeps: those it owns and those it mirrors."""
        return [lg for lg in range(self.L) if w in (self.owner[lg], self.buddy(lg))]

    def mirrored(self) -> list[int]:
        return [lg for lg in range(self.L) if self.buddy(lg) == self.me]

    # ---- one step -----------------------------------------------------------------------

    def train_step(self) -> None:
        alive, slots, blk = self._alive(), self.slots, self.blk
        owned = [[lg for lg, w in enumerate(self.owner) if w == q] for q in alive]
        send = np.zeros((len(alive), slots, slots, blk), np.float32)

        def scatter(i: int, g: np.ndarray) -> None:
            for q, blocks in enumerate(owned):
                for k, j in enumerate(blocks):
                    send[q, i, k, :self._len(j)] = g[self._span(j)]

        meta = self._compute(scatter)
        got = self._exchange(self.comm.all_to_all, send)
        where = self._where(meta)
        self._fire("optimizer")
        aside, params = {}, np.zeros((slots, blk), np.float32)
        sums = {}
        for k, j in enumerate(self.mine()):
            n = self._len(j)
            total = np.zeros(n, np.float32)
            for lg in range(self.L):  # the reduction order: logical ranks, always
                p, i = divmod(where[lg], slots)
                total += got[p, i, k, :n]
            total /= np.float32(self.L)
            m, v = (t.clone() for t in self.moments[j])
            p_j = self.flat[self._span(j)].clone()
            adamw(self.spec, self.step, p_j, m, v, torch.from_numpy(total))
            aside[j], params[k, :n], sums[j] = (m, v), p_j.numpy(), total
        aside.update(self._mirror(sums))
        self.aside = (self.step, aside)
        every = self.comm.all_gather(params).reshape(len(alive), slots, blk)
        for q, blocks in enumerate(owned):
            for k, j in enumerate(blocks):
                self.flat[self._span(j)] = torch.from_numpy(every[q, k, :self._len(j)])
        self.moments.update(aside)
        self.aside = None
        self._commit(where)

    def _mirror(self, sums: dict[int, np.ndarray]) -> dict:
        """Send each owned block's summed gradient to its buddy; apply the ones received
        to the mirrored moments (kept aside, like the owner's)."""
        comm, ranks = self.comm, {w: r for r, w in enumerate(self.comm.world_ranks)}
        inbox = {j: np.empty(self._len(j), np.float32) for j in self.mirrored()}
        with comm.group():
            for j in sorted(sums):
                b = self.buddy(j)
                if b is not None:
                    comm.send(sums[j], ranks[b], tag=j)
            for j in sorted(inbox):
                comm.recv(inbox[j], ranks[self.owner[j]], tag=j)
        out = {}
        for j, g in inbox.items():
            m, v = (t.clone() for t in self.moments[j])
            moments(m, v, torch.from_numpy(g))
            out[j] = (m, v)
        return out

    # ---- recovery -----------------------------------------------------------------------

    def _adopt(self, old, alive: list[int]) -> None:
        """A dead process's logical ranks go to their buddies, which hold their moments."""
        from ringtree.errors import RecoveryError

        before = list(old.world_ranks)
        for lg, w in enumerate(list(self.owner)):
            if w in alive:
                continue
            b = self.buddy(lg, before)
            if b is None or b not in alive:
                raise RecoveryError(
                    f"--zero 1: logical rank {lg}'s optimizer state is lost: its owner "
                    f"(rank {w}) and its buddy (rank {b}) died in the same failure")
            self.owner[lg] = b

    def _replicated(self) -> list[np.ndarray]:
        return [self.flat.numpy(), self.counts]

    def _catch_up(self, newest: int, fresh: bool) -> None:
        """A newcomer holds no moments; a survivor one step behind commits the moments it
        kept aside (it passed the all-to-all of step ``newest - 1``, as everyone did)."""
        from ringtree.errors import RecoveryError

        if fresh:
            self.moments, self.aside = {}, None
            return
        if self.step == newest - 1:
            if self.aside is None or self.aside[0] != self.step:
                raise RecoveryError(f"rank {self.me}: step {self.step} was committed "
                                    "elsewhere, and this rank kept no moments aside for it")
            self.moments.update(self.aside[1])
        self.aside = None

    def _place_state(self, moved: dict | None) -> dict | None:
        """Every block's moments to its owner and its buddy under the new membership,
        each from the lowest process that holds them; blocks no longer kept are freed."""
        from ringtree.errors import RecoveryError

        comm = self.comm
        holds = comm.all_gather_object(sorted(self.moments))
        need = {lg: [r for r, w in enumerate(comm.world_ranks)
                     if lg in self._held(w) and lg not in holds[r]] for lg in range(self.L)}
        sent = 0
        with comm.group():
            for lg in range(self.L):
                if not need[lg]:
                    continue
                have = [r for r in range(comm.size) if lg in holds[r]]
                if not have:
                    raise RecoveryError(f"--zero 1: no process holds logical rank {lg}'s "
                                        "optimizer state")
                if comm.rank == have[0]:
                    for r in need[lg]:
                        for t in self.moments[lg]:
                            comm.send(t.numpy(), r, tag=lg)
                            sent += t.numel() * 4
                if comm.rank in need[lg]:
                    pair = (torch.empty(self._len(lg)), torch.empty(self._len(lg)))
                    for t in pair:
                        comm.recv(t.numpy(), have[0], tag=lg)
                    self.moments[lg] = pair
        keep = set(self._held(self.me))
        self.moments = {lg: mv for lg, mv in self.moments.items() if lg in keep}
        moved = dict(moved or {})
        moved["optimizer_bytes_sent"] = int(sum(comm.all_gather_object(sent)))
        return moved
