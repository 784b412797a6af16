"""Reading files from a model folder without being stalled or crashed by them: only regular files are opened (a FIFO
would block the load forever, a device could stream without end), JSON is size-capped and its failures (deep nesting,
5000-digit numbers, bad UTF-8) become named errors."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tessera.engine.errors import ModelFormatError

MAX_JSON_BYTES = 256 * 1024 * 1024  # tokenizer.json of large-vocabulary models is tens of MB; config.json a few kB
# Names a model folder reader may open; anything else in the folder is left alone.
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".jinja", ".txt", ".model", ".gguf")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def require_regular_file(path: str | os.PathLike) -> os.stat_result:
    """stat(path) following links, or a named error when it is missing or not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelFormatError(str(path), "is missing") from None
    except OSError as e:
        raise ModelFormatError(str(path), f"cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelFormatError(str(path), f"is not a regular file ({_kind(st.st_mode)}); refusing to read it")
    return st


def check_model_folder(folder: str | os.PathLike) -> None:
    """Every file a reader of `folder` might open (by suffix) is a regular file: raises a named error otherwise."""
    try:
        entries = list(os.scandir(folder))
    except OSError as e:
        raise ModelFormatError(str(folder), f"cannot be listed: {e.strerror or e}") from None
    for entry in entries:
        if entry.name.endswith(MODEL_FILE_SUFFIXES):
            try:
                mode = os.stat(entry.path).st_mode
            except OSError:
                continue  # a dangling link: the reader says "missing" if it needs it
            if not stat.S_ISREG(mode):
                raise ModelFormatError(entry.path, f"is not a regular file ({_kind(mode)}); refusing to read it")


def load_json(path: str | os.PathLike, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in `path`, or a ModelFormatError naming the file and what is wrong."""
    path = Path(path)
    st = require_regular_file(path)
    if st.st_size > max_bytes:
        raise ModelFormatError(str(path), f"is {st.st_size} bytes; JSON files over {max_bytes} bytes are refused")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ModelFormatError(str(path), f"cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ModelFormatError(str(path), f"is not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelFormatError(str(path), f"is not valid JSON: {e}") from None
    except RecursionError:
        raise ModelFormatError(str(path), "is nested too deeply to be a model file") from None
    except ValueError as e:  # a number with more than sys.get_int_max_str_digits() digits
        raise ModelFormatError(str(path), f"holds a value that cannot be read: {e}") from None


MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # safetensors' own limit


def check_safetensors_header(path: str | os.PathLike) -> None:
    """A .safetensors header whose JSON names a tensor twice is refused (safetensors itself keeps the last entry, so
    two readers could disagree on what the file holds)."""
    path = Path(path)
    st = require_regular_file(path)
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > min(MAX_SAFETENSORS_HEADER, st.st_size - 8):
                return  # safetensors names this one itself (header larger than the file)
            raw = f.read(n)
    except OSError as e:
        raise ModelFormatError(str(path), f"cannot be read: {e.strerror or e}") from None

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise ModelFormatError(str(path), f"tensor {key} is named twice in the safetensors header")
            seen[key] = value
        return seen

    try:
        json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError):
        return  # not JSON: safetensors names the problem itself
