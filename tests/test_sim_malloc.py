"""``ringtree sim`` keeps its arrays in the heap where the C library is glibc."""

from __future__ import annotations

import platform

import pytest

from ringtree.sim import malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_mallopt_takes_both_thresholds():
    assert malloc.keep_arrays_in_heap() is True
    assert malloc.keep_arrays_in_heap() is True     # again: the same settings, accepted
