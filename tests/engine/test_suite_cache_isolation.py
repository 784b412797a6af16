"""The test suite keeps off the user's cache folder: tests/conftest.py moves platformdirs' user cache dir to a
throw-away folder, so the packed copies, scale-check records and tuning records tests make land there (a full run
used to leave gigabytes of packed test models and stray records in ~/.cache/tessera)."""

import os
import subprocess
import sys
from pathlib import Path

from tessera.engine import pack_cache, scale_record, tuned

USER_CACHE = Path.home() / ".cache"


def _outside_user_cache(folder: Path) -> bool:
    return not folder.resolve().is_relative_to(USER_CACHE.resolve())


def test_every_cache_folder_is_under_the_suites_throw_away_folder():
    test_cache = Path(os.environ["XDG_CACHE_HOME"]).resolve()
    for folder in (pack_cache.default_root(), scale_record.default_folder(), tuned.default_dir()):
        assert Path(folder).resolve().is_relative_to(test_cache), folder
        assert _outside_user_cache(Path(folder)), folder


def test_a_child_process_inherits_the_throw_away_folder():
    code = ("from tessera.engine import pack_cache, scale_record, tuned; "
            "print(pack_cache.default_root()); print(scale_record.default_folder()); print(tuned.default_dir())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    folders = [Path(line) for line in out.stdout.split()]
    assert len(folders) == 3 and all(_outside_user_cache(f) for f in folders), out.stdout
