"""The app tests' shared fixtures (defined in app_fakes.py), registered here so every tests/app module can take them
as parameters without importing them."""

from app_fakes import data_dir, fake_api, worker  # noqa: F401 - re-exported as fixtures for tests/app

