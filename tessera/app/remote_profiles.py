"""Remote-server profiles for the app's Remote engine: name, base URL, model. Qt-free.

Profiles live in `remote_profiles.json` in the app's data folder and never hold a key. API keys go to the OS keyring
(the `keyring` package) when a usable one is there, otherwise to `remote_keys.json` readable only by the user (0600).
Keys never reach the chat database, the logs or exports.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

KEYRING_SERVICE = "Tessera remote server"


class ProfileError(Exception):
    """A profile or key file that cannot be used, named like the engine's errors: `subject: message`."""

    def __init__(self, subject: str, message: str):
        super().__init__(f"{subject}: {message}")
        self.subject, self.message = subject, message


@dataclass(frozen=True)
class RemoteProfile:
    name: str
    base_url: str
    model: str = ""  # "" = the first model the server lists


def _write_private(path: Path, text: str) -> None:
    """Write atomically, readable and writable by the user only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class KeyStore:
    """API keys by profile name: the OS keyring when usable, else a 0600 JSON file. `where` says which, for the UI."""

    def __init__(self, file: Path, *, use_keyring: bool = True):
        self.file = Path(file)
        self._keyring = _usable_keyring() if use_keyring else None

    @property
    def where(self) -> str:
        if self._keyring is not None:
            return f"the system keyring ({type(self._keyring).__name__})"
        return f"{self.file} (readable only by you)"

    def get(self, name: str) -> str | None:
        if self._keyring is not None:
            return self._keyring.get_password(KEYRING_SERVICE, name)
        return self._read().get(name)

    def set(self, name: str, key: str | None) -> None:
        if not key:
            self.delete(name)
            return
        if self._keyring is not None:
            self._keyring.set_password(KEYRING_SERVICE, name, key)
            return
        keys = self._read()
        keys[name] = key
        _write_private(self.file, json.dumps(keys))

    def delete(self, name: str) -> None:
        if self._keyring is not None:
            try:
                self._keyring.delete_password(KEYRING_SERVICE, name)
            except Exception:  # noqa: BLE001 - keyring raises PasswordDeleteError when there is none
                pass
            return
        keys = self._read()
        if keys.pop(name, None) is not None:
            _write_private(self.file, json.dumps(keys))

    def _read(self) -> dict:
        if not self.file.exists():
            return {}
        if self.file.stat().st_mode & 0o077:
            os.chmod(self.file, 0o600)  # someone loosened it: keys are the user's alone
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
        except ValueError:
            raise ProfileError(str(self.file), "is not valid JSON; remove it and enter the keys again") from None
        return data if isinstance(data, dict) else {}


def _usable_keyring():
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring) or type(backend).__module__.startswith("keyring.backends.null"):
        return None
    if getattr(backend, "priority", 1) <= 0 and type(backend).__name__ == "ChainerBackend":
        return None
    return backend


class ProfileStore:
    """The saved profiles (JSON, no keys) and their keys (KeyStore)."""

    def __init__(self, folder: Path, keys: KeyStore | None = None):
        self.folder = Path(folder)
        self.path = self.folder / "remote_profiles.json"
        self.keys = keys or KeyStore(self.folder / "remote_keys.json")

    def profiles(self) -> list[RemoteProfile]:
        if not self.path.exists():
            return []
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return [RemoteProfile(str(p["name"]), str(p["base_url"]), str(p.get("model", ""))) for p in raw]
        except (ValueError, KeyError, TypeError):
            raise ProfileError(str(self.path), "is not a list of remote profiles; fix or remove it") from None

    def get(self, name: str) -> RemoteProfile | None:
        return next((p for p in self.profiles() if p.name == name), None)

    def save(self, profile: RemoteProfile, api_key: str | None = None, *, keep_key: bool = False) -> None:
        """Add or replace a profile (by name). api_key: stored in the KeyStore (None/"" removes it unless keep_key)."""
        if not profile.name.strip():
            raise ProfileError("profile name", "is empty")
        if not profile.base_url.startswith(("http://", "https://")):
            raise ProfileError("base URL", f"{profile.base_url!r} must start with http:// or https://")
        others = [p for p in self.profiles() if p.name != profile.name]
        self.folder.mkdir(parents=True, exist_ok=True)
        _write_private(self.path, json.dumps([asdict(p) for p in [*others, profile]], indent=1))
        if not keep_key:
            self.keys.set(profile.name, api_key)

    def delete(self, name: str) -> None:
        kept = [p for p in self.profiles() if p.name != name]
        _write_private(self.path, json.dumps([asdict(p) for p in kept], indent=1))
        self.keys.delete(name)

    def api_key(self, name: str) -> str | None:
        return self.keys.get(name)
