"""``with resource:`` closes it on the way out, however the block ends.

The one context-manager protocol of ringtree's resources that hold sockets, processes or
namespaces (the store's client and server, the rank pool, the testbed). A communicator
is different: it aborts instead of closing when the block raises."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["Closing"]

T = TypeVar("T", bound="Closing")


class Closing:
    """Mixin: ``__enter__`` returns the object, ``__exit__`` calls its ``close()``."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
