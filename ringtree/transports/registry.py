"""The transports, one record each (:class:`~ringtree.transports.base.TransportKind`), and
who reads them: which transport carries each peer (:mod:`ringtree.transports.assign`),
what its links cost (the tuner's ``MODELS``), which model every rank agrees on
(:func:`link_kind`), whether the LL protocol can run (:func:`shares_memory`) and what
``RINGTREE_TRANSPORT`` accepts (``auto`` or a registered name).

As NCCL's ``ncclTransports[]`` (``src/transport.cc``): a list in priority order whose
``canConnect`` decides, per pair of ranks, the first transport that applies. Adding a
transport is its module, which defines its record, and one line in :data:`BUILTIN`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ringtree import settings
from ringtree.transports.base import LinkModel, TransportKind
from ringtree.transports.shm_setup import SHM
from ringtree.transports.tcp_socket import TCP

BUILTIN: tuple[TransportKind, ...] = (SHM, TCP)

_KINDS: dict[str, TransportKind] = {}


def register(kind: TransportKind) -> TransportKind:
    """Add ``kind``; ``RINGTREE_TRANSPORT`` accepts its name from now on."""
    if kind.name in _KINDS or kind.name == "auto":
        raise ValueError(f"transport {kind.name!r} registered twice")
    _KINDS[kind.name] = kind
    _sync_choices()
    return kind


def unregister(name: str) -> None:
    """Remove a transport (tests register toy ones for a while)."""
    del _KINDS[name]
    _sync_choices()


def _sync_choices() -> None:
    settings.TRANSPORTS.options[:] = ["auto", *(k.name for k in kinds())]


def kinds() -> list[TransportKind]:
    """Every transport, the preferred first."""
    return sorted(_KINDS.values(), key=lambda k: (k.priority, k.name))


def get(name: str) -> TransportKind:
    kind = _KINDS.get(name)
    if kind is None:
        raise ValueError(f"no transport {name!r} (known: {', '.join(_KINDS)})")
    return kind


def allowed(choice: str) -> list[TransportKind]:
    """The transports ``RINGTREE_TRANSPORT=choice`` lets peers use, preferred first."""
    return kinds() if choice == "auto" else [get(choice)]


def network(choice: str = "auto") -> TransportKind:
    """The transport that carries ranks on different hosts: the first allowed one that
    is not host-local (or, when the choice allows none, the first of all)."""
    far = [k for k in allowed(choice) if not k.local] or [k for k in kinds() if not k.local]
    return far[0]


def on_host(choice: str) -> TransportKind:
    """The transport every rank expects ranks of one host to talk over (the cost model's:
    the first allowed, whether or not this machine can run it, so every rank agrees)."""
    return allowed(choice)[0]


def shares_memory(choice: str) -> bool:
    """Do ranks of this host talk through shared memory here: the first allowed
    transport this machine can run does (the LL protocol's condition)."""
    usable = [k for k in allowed(choice) if k.usable()]
    return bool(usable) and usable[0].shares_memory


def model_key(kind: TransportKind, crowded: bool) -> str:
    """The :data:`MODELS` key of ``kind``'s links: ``shm_crowded`` for a crowded host."""
    return f"{kind.name}_crowded" if crowded and kind.crowded is not None else kind.name


def link_kind(nodes: tuple[int, ...], choice: str) -> str:
    """The cost model every rank agrees on: the host's transport when the whole job is on
    one host (its crowded variant when ranks outnumber the cores), else the network's."""
    from ringtree.bootstrap.job import crowded

    if len(set(nodes)) != 1:
        return network(choice).name
    return model_key(on_host(choice), crowded(len(nodes)))


class _Models(Mapping[str, LinkModel]):
    """The tuner's link models by key (``tcp``, ``shm``, ``shm_crowded``): read from the
    records on every look-up, so a transport registered later has its model too."""

    def _table(self) -> dict[str, LinkModel]:
        table = {}
        for k in kinds():
            table[k.name] = k.model
            if k.crowded is not None:
                table[f"{k.name}_crowded"] = k.crowded
        return table

    def __getitem__(self, key: str) -> LinkModel:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


MODELS: Mapping[str, LinkModel] = _Models()

for _kind in BUILTIN:
    register(_kind)
