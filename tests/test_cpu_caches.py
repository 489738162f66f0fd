"""The cache sizes read from sysfs (``transports/cpu_caches.py``) and the registered
all-reduce's choice of streamed pushes made from them (``ll_reg_kernel.pushes_stream``)."""

from __future__ import annotations

import pytest

from ringtree.runtime.protocols import ll_reg_kernel
from ringtree.transports import cpu_caches


def _fake(tmp_path, caches: list[tuple[int, str, str]]) -> str:
    root = tmp_path / "cpu{}" / "cache"
    for i, (level, kind, size) in enumerate(caches):
        d = tmp_path / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return str(root)


def test_levels_from_sysfs(tmp_path, monkeypatch):
    root = _fake(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "64K"),
                            (2, "Unified", "512K"), (3, "Unified", "16384K")])
    monkeypatch.setattr(cpu_caches, "_ROOT", root)
    cpu_caches._levels.cache_clear()
    try:
        assert [cpu_caches.level_bytes(k) for k in (1, 2, 3)] == [32 << 10, 512 << 10,
                                                                   16 << 20]
    finally:
        cpu_caches._levels.cache_clear()


def test_defaults_where_sysfs_is_silent(tmp_path, monkeypatch):
    root = _fake(tmp_path, [(2, "Unified", "2M"), (3, "Unified", "garbage")])
    monkeypatch.setattr(cpu_caches, "_ROOT", root)
    cpu_caches._levels.cache_clear()
    try:
        assert cpu_caches.level_bytes(2) == 2 << 20
        assert cpu_caches.level_bytes(3) == cpu_caches.DEFAULT[3]  # unreadable size
        assert cpu_caches.level_bytes(3, cpu=99) == cpu_caches.DEFAULT[3]  # no such CPU
        assert cpu_caches.level_bytes(4) == 0
    finally:
        cpu_caches._levels.cache_clear()


@pytest.mark.parametrize("n,nbytes,streamed", [
    (2, 1 << 20, False), (2, 16 << 20, False), (2, 32 << 20, True), (4, 4 << 20, False),
    (4, 8 << 20, False), (4, 16 << 20, True)])
def test_pushes_stream_once_the_ranks_bytes_exceed_twice_the_l3(monkeypatch, n, nbytes,
                                                                 streamed):
    """The measured host's rule (16 MiB L3): 2 ranks cached to 16 MiB, 4 ranks to 8 MiB."""
    monkeypatch.setattr(ll_reg_kernel, "STREAM_MIN_AR", 2 * (16 << 20))
    assert ll_reg_kernel.pushes_stream(n, nbytes) is streamed
