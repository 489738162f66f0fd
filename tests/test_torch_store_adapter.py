"""The c10d store adapter raises ringtree's ``StoreTimeout`` when torch's store times out
(torch raises a bare ``RuntimeError``), so the rendezvous, which waits in one-second
slices, keeps waiting for a rank that is late instead of failing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from ringtree.bootstrap.rendezvous import meet  # noqa: E402
from ringtree.bootstrap.store import StoreTimeout  # noqa: E402
from ringtree.torch.store import TorchStore  # noqa: E402


@pytest.mark.parametrize("kind", ["file", "tcp"])
def test_timeout_is_store_timeout(tmp_path, kind):
    raw = (dist.FileStore(str(tmp_path / "store"), 1) if kind == "file"
           else dist.TCPStore("127.0.0.1", 0, 1, True))
    store = TorchStore(raw)
    with pytest.raises(StoreTimeout, match="not in torch's store after 0.1 s"):
        store.wait(["absent"], 0.1)
    with pytest.raises(StoreTimeout):
        store.get("absent", 0.1)


def test_rendezvous_waits_for_a_late_rank(tmp_path):
    """Rank 1 publishes 1.5 s after rank 0 starts waiting (longer than one slice)."""
    import threading
    import time

    path = str(tmp_path / "store")
    results = {}

    def rank(r: int, delay: float) -> None:
        time.sleep(delay)
        store = TorchStore(dist.FileStore(path, 2))
        results[r] = meet(store, "t", r, 2, f"peer{r}".encode(), 20.0)

    threads = [threading.Thread(target=rank, args=(0, 0.0)),
               threading.Thread(target=rank, args=(1, 1.5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results[0] == results[1] == [b"peer0", b"peer1"]
