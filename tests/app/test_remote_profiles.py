"""Remote profiles: saved without keys; keys in the keyring when one is usable, else in a 0600 file."""

from __future__ import annotations

import json
import stat

import keyring
import pytest
from keyring.backend import KeyringBackend

from tessera.app.remote_profiles import KEYRING_SERVICE, KeyStore, ProfileError, ProfileStore, RemoteProfile

PROFILE = RemoteProfile("gpu box", "http://10.0.0.5:8000/v1", "Qwen/Qwen3-235B-A22B")


class MemoryKeyring(KeyringBackend):
    priority = 10

    def __init__(self):
        self.store = {}

    def get_password(self, service, username):
        return self.store.get((service, username))

    def set_password(self, service, username, password):
        self.store[(service, username)] = password

    def delete_password(self, service, username):
        del self.store[(service, username)]


def test_file_fallback_is_private_and_profiles_hold_no_key(tmp_path):
    store = ProfileStore(tmp_path, KeyStore(tmp_path / "remote_keys.json", use_keyring=False))
    store.save(PROFILE, "sk-secret-1")
    assert store.profiles() == [PROFILE] and store.api_key("gpu box") == "sk-secret-1"
    assert "sk-secret" not in store.path.read_text()
    key_file = tmp_path / "remote_keys.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key_file.chmod(0o644)
    assert store.api_key("gpu box") == "sk-secret-1" and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    store.save(RemoteProfile("gpu box", "http://10.0.0.6:8000/v1"), keep_key=True)
    assert store.get("gpu box").base_url.endswith("6:8000/v1") and store.api_key("gpu box") == "sk-secret-1"
    store.delete("gpu box")
    assert store.profiles() == [] and store.api_key("gpu box") is None
    assert "remote_keys.json" in store.keys.where


def test_keyring_is_used_when_usable(tmp_path):
    backend = MemoryKeyring()
    old = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        store = ProfileStore(tmp_path)
        store.save(PROFILE, "sk-secret-2")
        assert backend.store == {(KEYRING_SERVICE, "gpu box"): "sk-secret-2"}
        assert not (tmp_path / "remote_keys.json").exists() and "keyring" in store.keys.where
        assert store.api_key("gpu box") == "sk-secret-2"
        store.delete("gpu box")
        assert backend.store == {}
    finally:
        keyring.set_keyring(old)


def test_bad_profiles_are_named(tmp_path):
    store = ProfileStore(tmp_path, KeyStore(tmp_path / "k.json", use_keyring=False))
    with pytest.raises(ProfileError) as e:
        store.save(RemoteProfile("x", "gpu-box:8000"))
    assert e.value.subject == "base URL"
    with pytest.raises(ProfileError):
        store.save(RemoteProfile(" ", "http://a"))
    store.path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ProfileError) as e:
        store.profiles()
    assert "remote_profiles.json" in e.value.subject
