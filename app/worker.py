"""EngineWorker: the one object that owns the engine, on its own QThread.

The UI calls the public methods (`load`, `generate`, `set_backend`, `unload`, `inspect`, `make_test_model`,
`query_backends`); each emits a private command signal that Qt queues into the worker thread, so the UI thread never runs
an engine call, a file scan or a repack. Results come back on the signals below, with dataclass payloads from
app/payloads.py. `stop()` and `cancel_load()` only set threading.Events, which is safe from any thread.

This is the only app module that may import the engine (lazily, inside the worker thread) or torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.payloads import (BackendList, GenerationResult, LoadProgress, ModelState, ModelSummary, StepSample,
                          TokenChunk, WorkerError)

CHUNK_SECONDS = 0.03  # batch streamed tokens: at most ~33 UI updates per second
PROGRESS_SECONDS = 0.05


class EngineApi:
    """The real engine, behind the few calls the worker makes (tests pass a fake with the same methods)."""

    def load(self, path: str, *, backend: str, threads: int, context_length: int, progress, cancel,
             gpu_use: str = "off", gpu_experts: int = 0):
        import engine
        from engine.hybrid import PlacementSettings

        placement = None
        if gpu_use in ("cuda", "twin"):  # "twin": the GPU half runs on the CPU with the same code path
            placement = PlacementSettings(device="cuda", gpu_experts_per_layer=gpu_experts, twin=gpu_use == "twin")
        return engine.load(path, backend=backend, threads=threads, context_length=context_length, progress=progress,
                           cancel=cancel, placement=placement)

    def inspect(self, path: str) -> dict:
        import engine

        return _as_dict(engine.inspect_model(path))

    def sampling_params(self, params: dict):
        from engine.sampling import SamplingParams

        fields = {f.name for f in dataclasses.fields(SamplingParams)}
        return SamplingParams(**{k: v for k, v in params.items() if k in fields})

    def backend_status(self) -> BackendList:
        from engine import backends

        status = backends.status()  # every name a user may choose, in the order to offer them
        choice, reason = backends.auto()
        device, free, total = "cpu", 0, 0
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            device = f"cuda:0 ({torch.cuda.get_device_name(0)})"
        return BackendList(status, choice, reason, device, int(free), int(total))

    def make_test_model(self, out_path: str, progress) -> str:
        from engine.make_model import make_model

        return str(make_model(out_path, preset="tiny", fmt="gguf", dtype="f32", seed=0, progress=progress))


def _as_dict(obj: Any) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return dict(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def _error(operation: str, exc: BaseException) -> WorkerError:
    """User-fixable engine errors carry subject/message; anything else keeps its traceback for the details box."""
    subject = getattr(exc, "subject", None)
    if subject is not None:
        return WorkerError(operation, str(subject), str(getattr(exc, "message", exc)))
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return WorkerError(operation, type(exc).__name__, str(exc) or type(exc).__name__, detail)


def _is_cancelled(exc: BaseException) -> bool:
    return any(cls.__name__ == "Cancelled" for cls in type(exc).__mro__)


class EngineWorker(QObject):
    progress = Signal(object)  # LoadProgress
    state_changed = Signal(object)  # ModelState
    tokens = Signal(object)  # TokenChunk
    finished = Signal(object)  # GenerationResult
    failed = Signal(object)  # WorkerError
    inspected = Signal(object)  # ModelSummary
    backends = Signal(object)  # BackendList

    # private command signals, queued into the worker thread
    _load_cmd = Signal(str, str, int, int, object)
    _generate_cmd = Signal(int, object, object, bool)
    _backend_cmd = Signal(str)
    _unload_cmd = Signal()
    _inspect_cmd = Signal(str)
    _make_cmd = Signal(str, str, int, int, object)
    _backends_cmd = Signal()

    def __init__(self, api: Any | None = None):
        super().__init__()
        self._api = api if api is not None else EngineApi()
        self._session = None
        self._path = ""
        self._threads = 0
        self._context_length = 0
        self._placement = ("off", 0)  # (GPU use, experts per layer) for the next load; see set_placement
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._cancels: dict[int, threading.Event] = {}  # request id -> stop flag
        self._load_cancel = threading.Event()
        self._thread = QThread()
        self._thread.setObjectName("tessera-engine")
        self.moveToThread(self._thread)
        self._load_cmd.connect(self._do_load)
        self._generate_cmd.connect(self._do_generate)
        self._backend_cmd.connect(self._do_set_backend)
        self._unload_cmd.connect(self._do_unload)
        self._inspect_cmd.connect(self._do_inspect)
        self._make_cmd.connect(self._do_make)
        self._backends_cmd.connect(self._do_query_backends)

    # ---- lifecycle (UI thread)
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout_ms: int = 30000) -> None:
        """Stop whatever runs, end the thread, then close the session (the thread is gone, so this is safe)."""
        self.stop()
        self.cancel_load()
        self._thread.quit()
        self._thread.wait(timeout_ms)
        if self._session is not None and not self._thread.isRunning():
            _close(self._session)
            self._session = None

    @property
    def thread(self) -> QThread:
        return self._thread

    # ---- commands (any thread; they return at once)
    def set_placement(self, gpu_use: str, gpu_experts: int) -> None:
        """GPU use ("off", "cuda", "twin") and hot-expert cache size for the next load (set before calling load)."""
        self._placement = (str(gpu_use), int(gpu_experts))

    def load(self, path: str, backend: str = "Auto", threads: int = 0, context_length: int = 0) -> None:
        self._load_cancel = threading.Event()
        self._load_cmd.emit(str(path), backend, int(threads), int(context_length), self._load_cancel)

    def cancel_load(self) -> None:
        self._load_cancel.set()

    def generate(self, messages: list[dict], params: dict, enable_thinking: bool = True) -> int:
        """Queue a chat request; returns its id (the id on its TokenChunk and GenerationResult payloads)."""
        request_id = next(self._ids)
        with self._lock:
            self._cancels[request_id] = threading.Event()
        self._generate_cmd.emit(request_id, [dict(m) for m in messages], dict(params), bool(enable_thinking))
        return request_id

    def stop(self) -> None:
        """Stop every queued or running request (checked by the decode loop between tokens)."""
        with self._lock:
            for event in self._cancels.values():
                event.set()

    def set_backend(self, name: str) -> None:
        self._backend_cmd.emit(name)

    def unload(self) -> None:
        self._unload_cmd.emit()

    def inspect(self, path: str) -> None:
        self._inspect_cmd.emit(str(path))

    def make_test_model(self, out_path: str, backend: str = "Auto", threads: int = 0, context_length: int = 0) -> None:
        """Write a small random-weight model (engine make-model) to out_path, then load it."""
        self._load_cancel = threading.Event()
        self._make_cmd.emit(str(out_path), backend, int(threads), int(context_length), self._load_cancel)

    def query_backends(self) -> None:
        self._backends_cmd.emit()

    # ---- slots (worker thread)
    def _progress_cb(self, operation: str):
        last = [0.0, None]  # time and stage of the last emitted event

        def report(event) -> None:
            now = time.monotonic()
            done, total = int(getattr(event, "done", 0)), int(getattr(event, "total", 0))
            stage = str(getattr(event, "stage", ""))
            if now - last[0] >= PROGRESS_SECONDS or done >= total or stage != last[1]:
                last[0], last[1] = now, stage
                self.progress.emit(LoadProgress(operation, str(getattr(event, "stage", "")), done, total,
                                                str(getattr(event, "detail", ""))))

        return report

    def _state(self) -> ModelState:
        s = self._session
        if s is None:
            return ModelState(False)
        info = _as_dict(getattr(s, "info", None))
        config = getattr(s, "config", None)
        ctx = self._context_length or int(getattr(config, "max_position_embeddings", 0) or 0)
        ctx = int(getattr(s, "context_length", 0) or ctx)
        return ModelState(True, self._path, Path(self._path).name, str(getattr(s, "backend_name", "")),
                          str(getattr(s, "backend_reason", "")), str(getattr(s, "device", "cpu")),
                          int(getattr(s, "threads", 0) or self._threads), ctx, info)

    @Slot(str, str, int, int, object)
    def _do_load(self, path: str, backend: str, threads: int, context_length: int, cancel: threading.Event) -> None:
        if self._session is not None:  # one model at a time: the old one goes first
            session, self._session = self._session, None
            try:
                _close(session)
            except Exception as exc:  # noqa: BLE001 - report it, and load the new model anyway
                self.failed.emit(_error("unload", exc))
        try:
            if cancel.is_set():
                raise _LoadCancelled()
            context_length = self._clamp_context(path, context_length)
            self._threads, self._context_length = threads, context_length
            gpu_use, gpu_experts = self._placement
            self._session = self._api.load(path, backend=backend, threads=threads or None,
                                           context_length=context_length or None,
                                           progress=self._progress_cb("load"), cancel=cancel,
                                           gpu_use=gpu_use, gpu_experts=gpu_experts)
            self._path = path
        except Exception as exc:  # noqa: BLE001 - every failure must reach the UI, the thread must survive
            self._session = None
            if _is_cancelled(exc):
                self.failed.emit(WorkerError("load", path, "loading cancelled", cancelled=True))
            else:
                self.failed.emit(_error("load", exc))
            self.state_changed.emit(ModelState(False))
            return
        self.state_changed.emit(self._state())

    def _clamp_context(self, path: str, wanted: int) -> int:
        """The setting is a wish: a model with a shorter trained context gets its own limit."""
        if wanted <= 0:
            return 0
        try:
            info = self._api.inspect(path)
        except Exception:  # noqa: BLE001 - the load itself will report what is wrong with the file
            return wanted
        limit = int(info.get("context_length") or info.get("max_position_embeddings") or 0)
        return min(wanted, limit) if limit > 0 else wanted

    @Slot(str, str, int, int, object)
    def _do_make(self, out_path: str, backend: str, threads: int, context_length: int,
                 cancel: threading.Event) -> None:
        try:
            made = self._api.make_test_model(out_path, self._progress_cb("make"))
        except Exception as exc:  # noqa: BLE001
            self.failed.emit(_error("make", exc))
            return
        self._do_load(str(made), backend, threads, context_length, cancel)

    @Slot(int, object, object, bool)
    def _do_generate(self, request_id: int, messages: list, params: dict, enable_thinking: bool) -> None:
        with self._lock:
            cancel = self._cancels.get(request_id) or threading.Event()
        steps: list[StepSample] = []
        text: list[str] = []
        pending: list[str] = []
        count = [0, 0]  # total tokens, tokens pending emission
        last_emit = [0.0]
        t_last = [0.0]

        def on_step(m) -> None:
            steps.append(StepSample(m.phase, int(m.tokens), float(m.seconds), int(getattr(m, "expert_pairs", 0)),
                                    int(getattr(m, "expert_pairs_on_gpu", 0)), int(getattr(m, "expert_bytes", 0))))

        def flush() -> None:
            if not pending and not steps:
                return
            chunk = TokenChunk(request_id, "".join(pending), count[1], count[0], t_last[0], tuple(steps))
            pending.clear()
            steps.clear()
            count[1] = 0
            last_emit[0] = time.monotonic()
            self.tokens.emit(chunk)

        try:
            if self._session is None:
                raise _NoModel()
            sampling = self._api.sampling_params(params)
            done = None
            for event in self._session.chat(messages, sampling, enable_thinking=enable_thinking, cancel=cancel,
                                            on_step=on_step):
                if hasattr(event, "metrics"):  # DoneEvent
                    done = event
                    break
                text.append(event.text)
                pending.append(event.text)
                count[0] += 1
                count[1] += 1
                t_last[0] = float(event.t)
                if count[0] == 1 or time.monotonic() - last_emit[0] >= CHUNK_SECONDS:
                    flush()
            flush()
            if done is not None:
                metrics = _as_dict(done.metrics)
                result_text = done.text
            else:
                metrics = {"generated_tokens": count[0], "stop_reason": "cancelled" if cancel.is_set() else ""}
                result_text = "".join(text)
            self.finished.emit(GenerationResult(request_id, result_text, metrics))
        except Exception as exc:  # noqa: BLE001
            flush()
            if _is_cancelled(exc):
                self.finished.emit(GenerationResult(request_id, "".join(text),
                                                    {"generated_tokens": count[0], "stop_reason": "cancelled"}))
            else:
                err = _error("generate", exc)
                self.failed.emit(err)
                self.finished.emit(GenerationResult(request_id, "".join(text),
                                                    {"generated_tokens": count[0], "stop_reason": "error"}, err.text))
        finally:
            with self._lock:
                self._cancels.pop(request_id, None)

    @Slot(str)
    def _do_set_backend(self, name: str) -> None:
        if self._session is None:
            return  # applied at the next load
        try:
            self._session.set_backend(name, progress=self._progress_cb("repack"))
        except Exception as exc:  # noqa: BLE001
            self.failed.emit(_error("backend", exc))
        self.state_changed.emit(self._state())

    @Slot()
    def _do_unload(self) -> None:
        if self._session is not None:
            try:
                _close(self._session)
            except Exception as exc:  # noqa: BLE001
                self.failed.emit(_error("unload", exc))
            self._session = None
            self._path = ""
        self.state_changed.emit(ModelState(False))

    @Slot(str)
    def _do_inspect(self, path: str) -> None:
        try:
            self.inspected.emit(ModelSummary(path, self._api.inspect(path)))
        except Exception as exc:  # noqa: BLE001
            self.failed.emit(_error("inspect", exc))

    @Slot()
    def _do_query_backends(self) -> None:
        try:
            self.backends.emit(self._api.backend_status())
        except Exception as exc:  # noqa: BLE001 - no native module yet: say so, keep the pure-torch path
            reason = f"native kernels unavailable ({type(exc).__name__}: {exc})"
            status = {"Auto": (True, ""), "Torch": (True, "pure PyTorch experts")}
            for name in ("AMXInt8", "AMXBF16", "AVX512", "AVX512Int8", "AVX2", "Reference"):
                status[name] = (False, reason)
            self.backends.emit(BackendList(status, "Torch", reason))


class _LoadCancelled(Exception):
    """Raised when a load was cancelled before it started (name matches the engine's Cancelled check)."""


_LoadCancelled.__name__ = "Cancelled"


class _NoModel(Exception):
    subject = "model"
    message = "no model is loaded: open one first"

    def __str__(self) -> str:
        return self.message


def _close(session) -> None:
    close = getattr(session, "close", None)
    if close is not None:
        close()
