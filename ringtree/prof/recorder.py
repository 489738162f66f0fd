"""The profiler's event recorder: NPKit's model in Python.

NPKit (microsoft/NPKit) gives each channel a preallocated buffer of 16-byte events
``(type, size, rsvd, timestamp)`` and appends with a bounds check, no locks; events come in
``_ENTRY``/``_EXIT`` pairs named after the primitive they wrap. Here each communicator's
executor gets one :class:`Recorder`: a preallocated ``bytearray`` ring of fixed-size
records written with one ``struct.pack_into`` call and read back as a NumPy structured
array (:data:`EVENT_DTYPE`) without copying. When the ring is full the oldest events are
overwritten and counted in ``dropped``.

In Python the call is what costs (≈0.3 µs each), so the per-step events fold NPKit's
ENTRY/EXIT pair into one record with a start and a duration (``ts``, ``dur``), written when
the span ends — the shape of NCCL's profiler-plugin events. Only the collective keeps a
separate ``COLL_ENTRY``/``COLL_EXIT`` pair, so a collective that never finished (a hang)
still shows. What the executor records (see :class:`Ev`):

- ``COLL_ENTRY/EXIT`` around each call: ``seq``, bytes, and in ``aux`` an id into
  :attr:`Recorder.calls` (name, algorithm, count, dtype, op, root);
- ``STEP``: one step of a channel, from issue to completion; ``prim`` is the NCCL
  primitive (:data:`PRIMS`), ``peer`` the rank it receives from, ``aux`` the one it sends to;
- inside a step, per slice: ``RECV_WAIT`` (from when the step needs the slice until it has
  arrived: the peer's lateness plus the wire), ``REDUCE`` (the reduction kernel), ``SEND``
  (an instant: a message posted; ``aux`` is its index on the connection within the call,
  the receiver's ``RECV_WAIT`` carries the same index, so the trace matches the two by
  ``(sender, receiver, channel, seq, index)``) and ``SEND_WAIT`` (draining the step's
  sends, recorded only if they had not completed by then);
- ``IDLE``: the scheduler slept in the transports' ``wait`` because no request could move
  — time spent waiting for peers.

Timestamps are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux, shared by the
processes of one host); :mod:`ringtree.prof.clock` estimates each rank's offset to rank 0.
"""

from __future__ import annotations

import struct
import time
from enum import IntEnum

import numpy as np

from ringtree.runtime.observer import Observer, StepWatch

DEFAULT_CAPACITY = 1 << 18          # events per communicator (56 B each: 14 MiB)

_REC = struct.Struct("<qqqqiiiihh4x")  # ts, dur, size, aux, chan, peer, seq, gid, type, prim
EVENT_DTYPE = np.dtype({
    "names": ["ts", "dur", "size", "aux", "chan", "peer", "seq", "gid", "type", "prim"],
    "formats": ["<i8", "<i8", "<i8", "<i8", "<i4", "<i4", "<i4", "<i4", "<i2", "<i2"],
    "offsets": [0, 8, 16, 24, 32, 36, 40, 44, 48, 50], "itemsize": 56})
assert EVENT_DTYPE.itemsize == _REC.size

now = time.perf_counter_ns


class Ev(IntEnum):
    """Event ids. ENTRY/EXIT pairs for collectives; spans (start + duration) and instants
    for everything inside them."""

    COLL_ENTRY = 0x01
    COLL_EXIT = 0x02
    STEP = 0x03
    RECV_WAIT = 0x04
    REDUCE = 0x05
    SEND_WAIT = 0x06
    IDLE = 0x07
    SEND = 0x08


# NCCL's primitive names (Step.name), numbered for the ``prim`` field.
PRIMS: tuple[str, ...] = (
    "", "send", "recv", "copy", "reduce", "copySend", "reduceSend", "recvSend",
    "recvCopySend", "recvReduce", "recvReduceSend", "recvReduceCopy", "recvReduceCopySend",
    "recvCopy",
)
PRIM_CODE = {name: i for i, name in enumerate(PRIMS)}

_PRIM_CACHE: dict[int, tuple[object, int]] = {}


def prim_code(step) -> int:
    """The ``PRIMS`` index of a :class:`~ringtree.ir.program.Step` (cached: ``Step.name`` builds
    a string each time)."""
    hit = _PRIM_CACHE.get(id(step))
    if hit is not None and hit[0] is step:
        return hit[1]
    if len(_PRIM_CACHE) > 1 << 16:
        _PRIM_CACHE.clear()
    code = PRIM_CODE.get(step.name, 0)
    _PRIM_CACHE[id(step)] = (step, code)
    return code


class Recorder:
    """One communicator's event ring. ``ev`` and ``span`` are the hot-path methods."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        cap = 1 << max(4, (int(capacity) - 1).bit_length())
        self.capacity = cap
        self._mask = cap - 1
        self._buf = bytearray(cap * _REC.size)
        self._pack = _REC.pack_into
        self.head = 0
        self.calls: list[dict] = []            # call-table: aux of COLL events
        self._call_ids: dict[tuple, int] = {}
        self._ords: dict[tuple, int] = {}      # message index per (direction, peer, chan, seq)
        self.anchor = (time.perf_counter_ns(), time.time_ns())

    # ---- hot path ---------------------------------------------------------------------

    def ev(self, typ: int, chan: int, peer: int, seq: int, gid: int, prim: int, size: int,
           aux: int) -> None:
        """An instant (or an ENTRY/EXIT) now."""
        i = self.head
        self.head = i + 1
        self._pack(self._buf, (i & self._mask) * 56, time.perf_counter_ns(), 0, size, aux,
                   chan, peer, seq, gid, typ, prim)

    def span(self, typ: int, t0: int, chan: int, peer: int, seq: int, gid: int, prim: int,
             size: int, aux: int) -> None:
        """A span that started at ``t0`` (``perf_counter_ns``) and ends now."""
        i = self.head
        self.head = i + 1
        self._pack(self._buf, (i & self._mask) * 56, t0, time.perf_counter_ns() - t0, size,
                   aux, chan, peer, seq, gid, typ, prim)

    def send(self, chan: int, peer: int, seq: int, gid: int, prim: int, size: int) -> None:
        """A message posted to ``peer`` (an instant, with its index on the connection)."""
        key = (1, peer, chan, seq)
        idx = self._ords.get(key, 0)
        self._ords[key] = idx + 1
        i = self.head
        self.head = i + 1
        self._pack(self._buf, (i & self._mask) * 56, time.perf_counter_ns(), 0, size, idx,
                   chan, peer, seq, gid, Ev.SEND, prim)

    def claim_recvs(self, peers: tuple[int, ...], chan: int, seq: int, count: int) -> list[int]:
        """Indices of the first of ``count`` messages from each of ``peers``."""
        out = []
        for p in peers:
            key = (0, p, chan, seq)
            base = self._ords.get(key, 0)
            self._ords[key] = base + count
            out.append(base)
        return out

    def claim(self, direction: int, peer: int, chan: int, seq: int, count: int) -> int:
        """Index of the next message on (direction, peer, chan) within call ``seq``. Both
        ends post a connection's messages in the same order (the IR's matching rule), so
        the indices agree whatever calls each side ran together."""
        key = (direction, peer, chan, seq)
        base = self._ords.get(key, 0)
        self._ords[key] = base + count
        return base

    def call_id(self, desc, nbytes: int) -> int:
        key = (desc.name, desc.algo, desc.proto, desc.count, desc.dtype, desc.op, desc.root,
               nbytes)
        cid = self._call_ids.get(key)
        if cid is None:
            cid = self._call_ids[key] = len(self.calls)
            self.calls.append({"name": desc.name, "algo": desc.algo, "proto": desc.protocol,
                               "count": desc.count,
                               "dtype": desc.dtype, "op": desc.op, "root": desc.root,
                               "bytes": nbytes})
        return cid

    # ---- executor hooks (once per run, not per step) ---------------------------------

    def run_begin(self, calls) -> None:
        for call in calls:
            b0, b1 = call.bufs[0], call.bufs[1]
            nbytes = max(0 if b0 is None else b0.nbytes, 0 if b1 is None else b1.nbytes)
            d = call.desc
            self.ev(Ev.COLL_ENTRY, call.channel_base, -1, d.seq, -1, d.coll_code, nbytes,
                    self.call_id(d, nbytes))

    def run_end(self, calls) -> None:
        seqs = set()
        for call in reversed(calls):
            d = call.desc
            self.ev(Ev.COLL_EXIT, call.channel_base, -1, d.seq, -1, d.coll_code, 0, 0)
            seqs.add(d.seq)
        # batches overlap: forget only this batch's message counters
        for key in [k for k in self._ords if k[3] in seqs]:
            del self._ords[key]

    # ---- reading ------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        return max(0, self.head - self.capacity)

    def events(self) -> np.ndarray:
        """The recorded events, oldest first (a copy)."""
        arr = np.frombuffer(self._buf, dtype=EVENT_DTYPE)
        n = self.head
        if n <= self.capacity:
            return arr[:n].copy()
        cut = n & self._mask
        return np.concatenate([arr[cut:], arr[:cut]])

    def reset(self) -> None:
        self.head = 0
        self._ords.clear()


# ---- the executor's observer ------------------------------------------------------------

class ProfileObserver(Observer):
    """Writes what the executor reports (:class:`ringtree.runtime.observer.Observer`) into a
    :class:`Recorder`: the events listed in the module docstring."""

    active = True

    def __init__(self, rec: Recorder):
        self.rec = rec

    def run_begin(self, calls) -> None:
        self.rec.run_begin(calls)

    def run_end(self, calls) -> None:
        self.rec.run_end(calls)

    def step(self, cs, call, channel: int) -> StepEvents:
        return StepEvents(self.rec, cs, call, channel)

    def idle(self, t0: int, call) -> None:
        self.rec.span(Ev.IDLE, t0, call.channel_base, -1, call.desc.seq, -1, 0, 0, 0)

    def outside_begin(self, desc, code: int, nbytes: int) -> None:
        rec = self.rec
        rec.ev(Ev.COLL_ENTRY, 0, -1, desc.seq, -1, code, nbytes, rec.call_id(desc, nbytes))

    def outside_end(self, seq: int, code: int) -> None:
        self.rec.ev(Ev.COLL_EXIT, 0, -1, seq, -1, code, 0, 0)


class StepEvents(StepWatch):
    """One step's events: its span, and per slice RECV_WAIT, REDUCE and SEND."""

    __slots__ = ("rec", "t0", "ch", "seq", "gid", "prim", "rbase", "reduce", "rpeer",
                 "speer")

    def __init__(self, rec: Recorder, cs, call, ch: int):
        s = cs.step
        self.rec, self.t0, self.ch = rec, now(), ch
        self.seq, self.gid, self.prim = call.desc.seq, cs.gid, prim_code(s)
        # message indices of its receives, claimed at issue (the order both ends agree on)
        self.rbase = rec.claim_recvs(s.recv_from, ch, self.seq, len(cs.slices))
        self.reduce = s.reduce
        self.rpeer = s.recv_from[0] if s.recv_from else -1
        self.speer = s.send_to[0] if s.send_to else -1

    def recv_waited(self, t0: int, j: int, k: int, req, nbytes: int) -> None:
        self.rec.span(Ev.RECV_WAIT, t0, self.ch, req.peer, self.seq, self.gid, self.prim,
                      nbytes, self.rbase[j] + k)

    def combined(self, t0: int, nbytes: int) -> None:
        if self.reduce:
            self.rec.span(Ev.REDUCE, t0, self.ch, -1, self.seq, self.gid, self.prim, nbytes, 0)

    def sent(self, peer: int, nbytes: int) -> None:
        self.rec.send(self.ch, peer, self.seq, self.gid, self.prim, nbytes)

    def draining(self, sends) -> int:
        return now() if sends and not sends[-1].done else 0

    def finished(self, t_drain: int, nbytes: int) -> None:
        rec = self.rec
        if t_drain:
            rec.span(Ev.SEND_WAIT, t_drain, self.ch, self.speer, self.seq, self.gid, self.prim,
                     0, 0)
        rec.span(Ev.STEP, self.t0, self.ch, self.rpeer, self.seq, self.gid, self.prim, nbytes,
                 self.speer)
