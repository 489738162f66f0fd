"""``torch.distributed.shrink_group`` on ringtree groups, and the group's failure state.

torch 2.13's ``shrink_group(ranks_to_exclude, group, shrink_flags, pg_options)`` asks the
group's *C++ backend* for ``supports_shrinking`` and ``shrink(...)`` and wraps what
``shrink`` returns in a new ``ProcessGroup`` (``_create_shrunk_process_group``) — a step
that only a C++ ``Backend`` can pass, and a Python backend cannot be one (its constructor
is not exposed). A ringtree group is a Python ``ProcessGroup`` that is its own backend, so
:func:`install` teaches torch's two helpers about it: the backend of a ringtree group is
the group itself, and the group ``shrink`` returns is already the new process group (it is
named and registered by torch exactly as torch names and registers a shrunk NCCL group).
Every other group goes to torch's functions unchanged. The rest of ``shrink_group`` —
argument checks, destroying the other groups when the default group shrinks, removing
the old group, registering the new one and making it the default — is torch's own.

:func:`error_type` is the group's ``get_error()``: torch's ``ErrorType`` of the
communicator's first failure.
"""

from __future__ import annotations

import functools

import torch.distributed.distributed_c10d as c10d

from ringtree.errors import CollectiveTimeout, CommAborted, PeerError


def error_type(comm):
    """``SUCCESS`` while healthy; ``TIMEOUT``; ``REMOTE_ERROR`` when another rank failed
    first (a dead peer, an abort or revoke elsewhere); ``COMM_ERROR`` otherwise."""
    from torch._C._distributed_c10d import ErrorType

    err = comm.health.broken
    if err is None:
        return ErrorType.SUCCESS
    if isinstance(err, CollectiveTimeout):
        return ErrorType.TIMEOUT
    if isinstance(err, (PeerError, CommAborted)):
        return ErrorType.REMOTE_ERROR
    return ErrorType.COMM_ERROR


def install() -> None:
    """Patch torch's two shrink helpers (idempotent)."""
    from ringtree.torch.backend import RingtreeProcessGroup

    check = c10d._validate_shrink_backend_requirements
    create = c10d._create_shrunk_process_group
    if getattr(check, "_ringtree", False):
        return

    @functools.wraps(check)
    def backend_of(group_info: dict):
        pg = group_info["process_group"]
        return pg if isinstance(pg, RingtreeProcessGroup) else check(group_info)

    @functools.wraps(create)
    def new_group(new_backend, remaining_ranks, metadata, is_default_group):
        if not isinstance(new_backend, RingtreeProcessGroup):
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend.setGroupName(metadata["new_group_name"])
        new_backend.setGroupDesc("default:shrunken" if is_default_group else
                                 f"{metadata['original_group_name']}:shrunk")
        return new_backend

    backend_of._ringtree = new_group._ringtree = True
    c10d._validate_shrink_backend_requirements = backend_of
    c10d._create_shrunk_process_group = new_group
