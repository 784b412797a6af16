"""Engine work for the wizards, each call on its own QThread: the wizards' only door to the engine.

A `Job` runs `fn(progress, cancel)` in a QThread and reports back through queued signals, so the UI thread only draws.
The engine's heavy parts (and torch with them) are imported inside the job functions below, in the job's thread; no
wizard view imports the engine. `cancel()` sets a threading.Event the engine checks between steps. Errors take the
chat worker's path (app.worker.worker_error).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QThread, Signal

from tessera.app.worker import runnable_backend, worker_error
from tessera.engine.events import ProgressEvent


class Job(QThread):
    """Runs `fn(progress, cancel)` off the UI thread. Exactly one of succeeded / failed / cancelled is emitted."""

    progressed = Signal(int, int, str, str)  # done, total, stage, detail
    succeeded = Signal(object)  # fn's result
    failed = Signal(str, str)  # subject, message (TesseraError's fields; "internal error" + traceback otherwise)
    cancelled = Signal()

    def __init__(self, fn: Callable[[Callable, threading.Event], Any], parent=None):
        super().__init__(parent)
        self._fn = fn
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def run(self) -> None:  # in the job's thread
        def progress(ev: ProgressEvent) -> None:
            self.progressed.emit(ev.done, ev.total, ev.stage, ev.detail)

        try:
            result = self._fn(progress, self._cancel)
        except Exception as e:  # noqa: BLE001 - shown in the wizard instead of killing the app
            error = worker_error("job", e)  # the chat worker's error path too
            if error.cancelled:
                self.cancelled.emit()
            else:
                self.failed.emit(error.subject, f"{error.message}\n\n{error.detail}" if error.detail else error.message)
        else:
            if self._cancel.is_set():
                self.cancelled.emit()
            else:
                self.succeeded.emit(result)


def hardware_probe(*, seconds: float, model: str | None, preset: str | None, gpu: bool,
                   context_length: int | None = None, backend: str = "Auto"):
    """A job function: the hardware report plus its Markdown and JSON renderings. A model file's RAM is sized for the
    app's settings (`context_length`, default the check's; `backend`), as the model panel sizes it."""

    def fn(progress, cancel) -> dict:
        from tessera.engine import hardware

        report = hardware.probe(seconds=seconds, model=model, preset=preset, gpu=gpu,
                                context_length=context_length or hardware.MODEL_CONTEXT,
                                backend=runnable_backend(backend), progress=progress, cancel=cancel)
        return {"report": report, "markdown": hardware.to_markdown(report), "json": hardware.to_json(report)}

    return fn


def hardware_presets() -> list[tuple[str, str]]:
    """(name shown, preset key) of every published model the hardware check can size: engine.config.PUBLISHED, the
    one list (`tessera-cli check --preset` takes the same keys). Plain data, no torch: safe on the UI thread."""
    from tessera.engine.config import PUBLISHED

    return [(cfg.source, key) for key, cfg in PUBLISHED.items()]


def inspect_source(folder: str):
    """A job function: check a Hugging Face folder and summarise it for the conversion wizard."""

    def fn(progress, cancel) -> dict:
        from tessera.engine.convert import read_source

        src = read_source(folder)  # checks config, tokenizer and every tensor header; named errors
        shards = sorted(Path(src.folder).glob("*.safetensors"))
        size = sum(p.stat().st_size for p in shards)
        dtypes = sorted(set(src.dtypes.values()))
        cfg = src.config
        width = {"F32": 4, "F16": 2, "BF16": 2}.get(max(dtypes, key=list(src.dtypes.values()).count), 2)
        return {
            "folder": str(src.folder), "layers": cfg.num_hidden_layers, "experts": cfg.num_experts,
            "experts_per_token": cfg.num_experts_per_tok, "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size, "tensors": len(src.dtypes), "shards": len(shards),
            "bytes": size, "dtypes": dtypes, "params": size // width, "backends": _backends(),
        }

    return fn


def _backends() -> dict[str, tuple[bool, str]]:
    """Backends a converted model can be pre-packed for: {name: (available, reason)}, Auto and Torch left out."""
    from tessera.engine import backends

    return {k: v for k, v in backends.status().items() if k not in (backends.AUTO, backends.TORCH)}


def output_refusal(src: str, out: str) -> str | None:
    """Why the converter would refuse to write `out` even when asked to replace it (a file of the source model, not a
    regular file), as a sentence; None when replacing is allowed."""
    from tessera.engine.convert_guard import check_output
    from tessera.engine.errors import TesseraError

    try:
        check_output(src, out, force=True)
    except TesseraError as e:
        return f"{e.message[:1].upper()}{e.message[1:]}."
    return None


def convert_model(*, src: str, out: str, dtype: str, verify: bool, prepack: str | None = None, force: bool = False,
                  backend: str = "Auto"):
    """A job function: convert, then (optionally) verify the output as `convert --verify` does, through expert backend
    `backend` (Auto where it cannot run here), then (optionally) fill the packed-weight cache for one backend so the
    first load is fast."""

    def fn(progress, cancel) -> dict:
        from tessera.engine.convert import convert

        t0 = time.perf_counter()
        path = convert(src, out, dtype=dtype, progress=progress, cancel=cancel, force=force)
        result = {"path": str(path), "bytes": Path(path).stat().st_size, "seconds": time.perf_counter() - t0,
                  "dtype": dtype, "verify": None}
        if verify and not cancel.is_set():
            from tessera.engine.compare import verify_conversion
            from tessera.engine.events import ProgressEvent

            progress(ProgressEvent("verify", 0, 1, "running the same text through the source and the output"))
            rep, ok, rule = verify_conversion(src, path, dtype, backend=runnable_backend(backend))
            result["verify"] = {**rep.as_dict(), "passed": ok, "rule": rule}
            progress(ProgressEvent("verify", 1, 1, "passed" if ok else "outside the tolerance"))
        if prepack and not cancel.is_set():
            from tessera.engine.convert import prepack as do_prepack

            result["prepack"] = do_prepack(path, prepack, progress)
        return result

    return fn
