"""Fixtures for the server tests: the shipped demo model loaded twice (one Session behind the server, one in-process
reference), and a server on a free loopback port."""

from __future__ import annotations

import pytest
from server_support import DEMO, running_server

from tessera import engine


@pytest.fixture(scope="session")
def served_session():
    session = engine.load(DEMO)
    yield session
    session.close()


@pytest.fixture(scope="session")
def reference_session():
    """An independent Session on the same model: what the in-process engine answers."""
    session = engine.load(DEMO)
    yield session
    session.close()


@pytest.fixture(scope="module")
def server(served_session):
    with running_server(served_session) as running:
        yield running
