"""Fixtures for the native kernel tests (helpers live in native_cases.py)."""

import pytest

import tessera.engine.native as N


@pytest.fixture(scope="session")
def pool():
    """One 2-thread pool for all native tests (the caller works as thread 0)."""
    return N.make_pool(2)
