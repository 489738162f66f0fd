"""The compiled kernels carry the digest of their sources; one built from other sources
is not loaded (ringtree.kernels)."""

from __future__ import annotations

import importlib
import shutil

import pytest

from ringtree import kernels


def _built(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} was not built (no C compiler at install)")


@pytest.mark.parametrize("name", sorted(kernels.KERNELS))
def test_a_fresh_build_carries_its_sources_digest(name):
    module = _built(name)
    assert module.SOURCE_DIGEST == kernels.digest(kernels.KERNELS[name])
    assert kernels.stale(name, module) is None
    assert kernels.load(name) is module


def _copy_sources(name, root):
    for path in kernels.KERNELS[name]:
        dest = root / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f"{kernels.ROOT}/{path}", dest)


@pytest.mark.parametrize("name", sorted(kernels.KERNELS))
def test_a_build_from_other_sources_is_not_loaded(name, tmp_path, monkeypatch):
    module = _built(name)
    _copy_sources(name, tmp_path)
    monkeypatch.setattr(kernels, "ROOT", str(tmp_path))
    assert kernels.load(name) is module                  # the same sources elsewhere
    header = tmp_path / kernels.KERNELS[name][-1]        # one byte of one header changed
    header.write_bytes(header.read_bytes() + b"\n")
    why = kernels.stale(name, module)
    assert why is not None and name in why and "build_ext --inplace" in why
    with pytest.warns(RuntimeWarning, match="built from other sources"):
        assert kernels.load(name) is None


def test_without_the_sources_a_build_is_trusted(tmp_path, monkeypatch):
    name = "ringtree.transports._llc"
    module = _built(name)
    monkeypatch.setattr(kernels, "ROOT", str(tmp_path))  # an install without the C files
    assert kernels.digest(kernels.KERNELS[name]) is None
    assert kernels.load(name) is module


def test_a_kernel_not_built_is_none():
    assert kernels.load("ringtree.transports._no_such_kernel") is None
