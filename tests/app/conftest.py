"""The app tests' shared fixtures: the fakes' (defined in app_fakes.py), registered here so every tests/app module can
take them as parameters without importing them, and `real_worker`, an EngineWorker on the real engine."""

import pytest
from app_fakes import data_dir, fake_api, worker  # noqa: F401 - re-exported as fixtures for tests/app


@pytest.fixture
def real_worker(qtbot):
    """An EngineWorker on the real engine, on its own thread; shut down after the test."""
    from tessera.app.worker import EngineWorker

    w = EngineWorker()
    w.start()
    yield w
    w.shutdown()
