"""TCP key-value store for rendezvous, with job-token authentication.

This is ringtree's counterpart of ``torch.distributed.TCPStore`` (and of the root socket in
NCCL's ``src/bootstrap.cc``): one :class:`StoreServer` per job (hosted by rank 0 or by the
``ringtree run`` launcher), one :class:`StoreClient` per rank. The API follows torch's Store:
``set``, blocking ``get``, ``add`` (atomic counter), ``compare_set``, ``wait``, ``check``,
``delete``.

Wire protocol (no pickle, ever). Every message is a frame::

    frame  = u32 length ‖ body                      (network byte order)
    body   = u8 code ‖ field*       (code: an Op in requests, a Status in replies)
    field  = u32 length ‖ bytes

Numbers travel as fields holding ``!d`` (timeouts, seconds; ``inf`` = no deadline) or ``!q``
(counter increments). Keys are UTF-8 strings, values raw bytes.

Authentication is an HMAC-SHA256 challenge-response, so the token never crosses the wire:

1. server → client: ``RTSTORE1 ‖ snonce`` (32 random bytes);
2. client → server: ``HELLO(cnonce, HMAC(token, "client" ‖ snonce ‖ cnonce))``;
3. server → client: ``OK(HMAC(token, "server" ‖ snonce ‖ cnonce))`` (the client checks it, so a
   rank never talks to the store of another job) or ``AUTH_FAILED``, then disconnects.

Until step 2 succeeds the server acts on nothing a connection sends and accepts frames of at
most :data:`MAX_HELLO_BYTES`; a connection that has not authenticated within
:data:`HANDSHAKE_TIMEOUT` seconds is dropped.

The server is one thread around a ``selectors`` loop. Blocking ``get``/``wait`` never block it:
the request is parked and answered when its keys are written or its deadline (computed on the
server, so clients do not poll) expires.
"""

from ringtree.bootstrap.store.client import StoreClient
from ringtree.bootstrap.store.protocol import StoreAuthError, StoreError, StoreTimeout
from ringtree.bootstrap.store.server import StoreServer

__all__ = ["StoreAuthError", "StoreClient", "StoreError", "StoreServer", "StoreTimeout"]
