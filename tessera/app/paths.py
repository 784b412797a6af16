"""Where the app keeps its files, decided in one place.

TESSERA_DATA_DIR overrides the platform's user data directory (tests point it at a temporary folder).
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "Tessera"


def data_dir() -> Path:
    """The user data directory (conversations database, settings file, test-drive models). Created on demand."""
    override = os.environ.get("TESSERA_DATA_DIR")
    if override:
        path = Path(override)
    else:
        import platformdirs

        path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_path() -> Path:
    return data_dir() / "conversations.sqlite3"


def settings_path() -> Path:
    return data_dir() / "settings.ini"


def test_drive_dir() -> Path:
    """Folder for the small random-weight models made from the welcome page."""
    path = data_dir() / "test-drive"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resources_dir() -> Path:
    """The repository's (or installed bundle's) tessera/resources/ folder."""
    return Path(__file__).resolve().parent.parent / "resources"


def app_icon_files() -> list[Path]:
    """The app icon in every size shipped (tessera/resources/icons/tessera-*.png), smallest first."""
    icons = resources_dir() / "icons"
    found = list(icons.glob("tessera-*.png")) if icons.is_dir() else []
    return sorted(found, key=lambda p: int(p.stem.rsplit("-", 1)[-1]) if p.stem.rsplit("-", 1)[-1].isdigit() else 0)


def demo_model() -> Path | None:
    """The built-in demo model (tessera/resources/demo/*.gguf), or None when it is not shipped."""
    demo = resources_dir() / "demo"
    if not demo.is_dir():
        return None
    found = sorted(demo.glob("*.gguf"))
    return found[0] if found else None


def demo_model_card() -> Path | None:
    """The demo model's card (Markdown beside the GGUF), when there is one."""
    model = demo_model()
    if model is None:
        return None
    for name in (model.with_suffix(".md"), model.parent / "MODEL_CARD.md", model.parent / "README.md"):
        if name.is_file():
            return name
    return None


def startup_model(recent: list[str], reopen_last: bool) -> Path | None:
    """The model to open at start when none is named: the last one loaded (still on disk) when reopen_last, else the
    demo model (None when neither exists)."""
    if reopen_last and recent and Path(recent[0]).exists():
        return Path(recent[0])
    return demo_model()


def demo_examples() -> dict:
    """The demo model's introduction (tessera/resources/demo/examples.json: title, summary, example prompts that it
    answers right), or {} when it is not shipped or unreadable."""
    import json

    model = demo_model()
    path = model.parent / "examples.json" if model is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
