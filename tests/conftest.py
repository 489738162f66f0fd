"""Fixtures every test module shares."""

import pytest


@pytest.fixture(autouse=True)
def _named_algorithms_leave_with_their_test():
    """Algorithms a test registers by naming them (an MSCCL-IR file, a synthesized
    forest) leave the registry with the test, so no other test walks them."""
    from ringtree.msccl import catalog
    from ringtree.schedules import synth

    yield
    catalog.forget()
    synth.forget()
