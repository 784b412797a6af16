"""The one error type the engine raises for anything a user can fix: bad files, bad arguments, bad settings.

Every message names its subject (a file, tensor, key, flag or backend) so the CLI can print
`error: <subject>: <what is wrong>` and the GUI can show it in a dialog without a traceback.
"""

from __future__ import annotations


class TesseraError(Exception):
    """A problem with user input, named by its subject.

    subject: what is wrong (a path, `tensor blk.3.ffn_up_exps`, `key qwen3moe.block_count`, `--top-p`, `backend
    AMXInt8`).
    message: what is wrong with it, in plain words.
    """

    def __init__(self, subject: str, message: str):
        super().__init__(f"{subject}: {message}")
        self.subject = subject
        self.message = message


class ModelFormatError(TesseraError):
    """A model file or folder is malformed, truncated, of the wrong architecture, or inconsistent."""


class BackendUnavailableError(TesseraError):
    """A kernel backend was asked for by name but cannot run on this machine (the message says why)."""


class NotEnoughMemoryError(TesseraError):
    """What a load or a backend switch would make in RAM exceeds what is free: refused before anything is made (the OS
    would otherwise kill the process half-way, and the chat with it). `shortfall`: the sizes alone, without the advice
    the message adds ("packing 8 layers of bfloat16 experts takes 9.70 GB of RAM and 4.00 GB are free")."""

    def __init__(self, subject: str, message: str, shortfall: str = ""):
        super().__init__(subject, message)
        self.shortfall = shortfall or message


class ContextOverflowError(TesseraError):
    """A prompt (plus the tokens asked for) does not fit in the context length."""


class Cancelled(Exception):
    """An operation (load, pack, convert, generate) stopped because the caller asked it to."""
