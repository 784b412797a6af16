"""EngineWorker: the one object that owns the engine session, on its own QThread.

The UI calls the public methods (`load`, `generate`, `set_backend`, `unload`, `inspect`, `make_test_model`,
`query_backends`); each queues one call into the worker thread through the single `_call` signal, so the UI thread
never runs an engine call, a file scan or a repack. Results come back on the signals below, with dataclass payloads
from tessera/app/payloads.py. `stop()` and `cancel_load()` only set threading.Events, which is safe from any thread.

One of the app's two doors to the engine (the other is the wizards' tessera/app/wizards/jobs.py): it imports
engine.errors and engine.events (plain Python) at the top; the rest of the engine, and torch with it, is imported inside
the worker thread when a model loads. `worker_error` is the one error path of both doors.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from PySide6.QtCore import QObject, QThread, Signal, Slot

from tessera.app.payloads import (
    BackendList,
    GenerationResult,
    LoadProgress,
    ModelState,
    ModelSummary,
    PackCacheInfo,
    StepSample,
    TokenChunk,
    WorkerError,
)
from tessera.engine.errors import Cancelled, NotEnoughMemoryError, TesseraError
from tessera.engine.events import DoneEvent, ProgressEvent, StepMetrics

if TYPE_CHECKING:
    from tessera.engine.session import Session


def _kv_arg(kv_cache_type: str) -> dict:
    """The KV cache type as an EngineApi keyword, only when it is not the default (an API that predates the option,
    such as a test's fake, keeps working for bf16)."""
    return {} if kv_cache_type == "bf16" else {"kv_cache_type": kv_cache_type}


class _LoadArgs(NamedTuple):
    """What a model was loaded with, to load it again the same way (EngineWorker._reload_previous)."""

    path: str
    backend: str
    threads: int
    context_length: int
    gpu_use: str
    gpu_experts: int
    kv_cache_type: str = "bf16"


CHUNK_SECONDS = 0.03  # batch streamed tokens: at most ~33 UI updates per second
PROGRESS_SECONDS = 0.05


class EngineApi:
    """The real engine, behind the few calls the worker makes (tests pass a fake with the same methods)."""

    def load(self, path: str, *, backend: str, threads: int | None, context_length: int | None, progress, cancel,
             gpu_use: str = "off", gpu_experts: int = 0, kv_cache_type: str = "bf16") -> Session:
        """The engine clamps `context_length` to the model's trained context."""
        from tessera import engine
        from tessera.engine import preload

        if gpu_use not in ("cuda", "twin"):  # the model's torch-free load work overlaps the first `import torch`
            preload.start(path, backend=backend, cancel=cancel)  # (engine.preload; engine.load takes it)
        from tessera.engine.hybrid import PlacementSettings

        placement = None
        if gpu_use in ("cuda", "twin"):  # "twin": the GPU half runs on the CPU with the same code path
            placement = PlacementSettings(device="cuda", gpu_experts_per_layer=gpu_experts)
        import torch

        threads_before = torch.get_num_threads()  # engine.load sets torch's (process-wide) thread count
        try:
            return engine.load(path, backend=backend, threads=threads, context_length=context_length,
                               kv_cache_type=kv_cache_type, progress=progress, cancel=cancel, placement=placement,
                               twin=gpu_use == "twin")
        except BaseException:
            torch.set_num_threads(threads_before)  # the model that stays loaded keeps its threads
            raise
        finally:
            preload.discard(path)  # one that no load took (none: engine.load takes it first thing)

    def ram_available(self) -> int:
        """Bytes of RAM free now (psutil's `available`: what can be had without swapping)."""
        from tessera.app.fit import ram_available

        return ram_available()

    def inspect(self, path: str, *, context_length: int | None = None, backend: str = "Auto",
                kv_cache_type: str = "bf16") -> dict:
        """ModelInfo as a dict, with the type mix and the RAM of a load with these settings (engine.model_summary:
        `type_mix`, `ram` with `total_bytes`, `ram_text`). A backend that cannot run here is sized as Auto: the load
        itself names that error."""
        from tessera.engine.model_summary import facts, sized_for_load

        info = sized_for_load(path, context_length=context_length, backend=runnable_backend(backend),
                              kv_cache_type=kv_cache_type)
        return {**_as_dict(info), **facts(info)}

    def sampling_params(self, params: dict):
        from tessera.engine.sampling import SamplingParams

        fields = {f.name for f in dataclasses.fields(SamplingParams)}
        return SamplingParams(**{k: v for k, v in params.items() if k in fields})

    def backend_status(self) -> BackendList:
        from tessera.engine import backends

        status = backends.status()  # every name a user may choose, in the order to offer them
        choice, reason = backends.auto()
        device, free, total = "cpu", 0, 0
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            device = f"cuda:0 ({torch.cuda.get_device_name(0)})"
        return BackendList(status, choice, reason, device, int(free), int(total), self.cuda_missing())

    def cuda_missing(self) -> str:
        """Why GPU use = cuda cannot work here, in words ("" when a CUDA device is usable)."""
        import torch

        if torch.cuda.is_available():
            return ""
        if torch.version.cuda is None:
            return f"no CUDA device is available: torch {torch.__version__} is a CPU build"
        return (f"no CUDA device is available: torch {torch.__version__} (CUDA {torch.version.cuda}) finds no "
                "NVIDIA GPU or driver")

    def pack_cache(self, clear: bool) -> tuple[str, int, int, int, str]:
        """The packed-weight cache's folder and bytes held, after clearing it when asked (bytes freed, else -1; the
        packs a first load has not written yet are given up first), and its budget: bytes and where they come from
        (engine.pack_cache.PackCache.budget_explained; 0, "" when the folder is not usable)."""
        from tessera.engine.pack_cache import PackCache, default_root

        cache = PackCache(default_root())
        store = _pack_store()
        if clear and store is not None:  # a first load's packs still being written would land after the clear
            store.skip_all()
            store.finish_all()  # returns once the write in progress has given up (its temporary file removed)
        if not cache.usable:
            return str(cache.root), 0, 0 if clear else -1, 0, ""
        freed = cache.clear() if clear else -1
        budget, why = cache.budget_explained()
        return str(cache.root), cache.held_bytes(), freed, budget, why

    def pack_writes_left(self) -> int:
        """Bytes of freshly packed experts this process has still to write to the packed-weight cache
        (engine.pack_store; 0 while no model has loaded). Safe from any thread."""
        store = _pack_store()
        return int(store.pending_bytes()) if store is not None else 0

    def pack_hashing_left(self) -> int:
        """Of pack_writes_left, the bytes of the model file still to hash first (a new file version's keys)."""
        store = _pack_store()
        return int(store.pending_hash_bytes()) if store is not None else 0

    def skip_pack_writes(self) -> None:
        """Give up those writes (the next load packs the layers not written again). Safe from any thread."""
        store = _pack_store()
        if store is not None:
            store.skip_all()

    def make_test_model(self, out_path: str, progress) -> str:
        from tessera.engine.make_model import make_model

        return str(make_model(out_path, preset="tiny", fmt="gguf", dtype="f32", seed=0, progress=progress))


def _pack_store():
    """engine.pack_store when something has imported it (a native backend packed), else None: nothing to save."""
    return sys.modules.get("tessera.engine.pack_store")


def runnable_backend(name: str) -> str:
    """`name` when it is a backend that runs here, else Auto: what a RAM estimate is sized for when the setting names a
    backend this machine lacks (the load itself then says why it cannot use it)."""
    from tessera.engine import backends

    try:
        backends.resolve(name)
    except TesseraError:
        return backends.AUTO
    return name


def _as_dict(obj: Any) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return dict(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def worker_error(operation: str, exc: BaseException) -> WorkerError:
    """The one error path of both worker doors (this worker and the wizards' Job): a cancellation is not an error;
    user-fixable engine errors (TesseraError) keep their subject and message; anything else is an internal error that
    keeps its traceback for the details box."""
    if isinstance(exc, Cancelled):
        return WorkerError(operation, "", f"{operation} cancelled", cancelled=True)
    if isinstance(exc, TesseraError):
        return WorkerError(operation, exc.subject, exc.message)
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return WorkerError(operation, f"internal error ({type(exc).__name__})", str(exc) or type(exc).__name__, detail)


class EngineWorker(QObject):
    progress = Signal(object)  # LoadProgress
    state_changed = Signal(object)  # ModelState
    tokens = Signal(object)  # TokenChunk
    finished = Signal(object)  # GenerationResult
    failed = Signal(object)  # WorkerError
    inspected = Signal(object)  # ModelSummary
    backends = Signal(object)  # BackendList
    serving = Signal(object)  # app.serving.ServeState
    remote_checked = Signal(object)  # dict: {"ok", "url", "models", "seconds", "error"} from test_remote
    pack_cache = Signal(object)  # PackCacheInfo, from query_pack_cache / clear_pack_cache

    # the one command signal: a call (functools.partial of a _do_* method) queued into the worker thread
    _call = Signal(object)

    def __init__(self, api: Any | None = None):
        super().__init__()
        self._api = api if api is not None else EngineApi()
        self._session: Session | None = None
        self._server = None  # app.serving.LocalServer while "Serve this model" is on; the chat then goes through it
        self._remote = None  # engine.remote.RemoteClient when the Remote engine is chosen instead of a local model
        self._path = ""
        self._load_args: _LoadArgs | None = None  # how the loaded model was loaded (its backend kept current)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._cancels: dict[int, threading.Event] = {}  # request id -> stop flag
        self._load_cancel = threading.Event()
        self._thread = QThread()
        self._thread.setObjectName("tessera-engine")
        self.moveToThread(self._thread)
        self._call.connect(self._run)  # queued: this object lives in the worker thread

    # ---- lifecycle (UI thread)
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout_ms: int = 30000) -> None:
        """Stop whatever runs, end the thread, then close the session (the thread is gone, so this is safe)."""
        self.stop()
        self.cancel_load()
        self._thread.quit()
        self._thread.wait(timeout_ms)
        if not self._thread.isRunning():
            self._close_remote()
        if self._session is not None and not self._thread.isRunning():
            self._stop_serving()
            self._session.close()
            self._session = None

    @property
    def thread(self) -> QThread:
        return self._thread

    # ---- commands (any thread; they return at once)
    def _queue(self, method, *args) -> None:
        self._call.emit(functools.partial(method, *args))

    def load(self, path: str, backend: str = "Auto", threads: int = 0, context_length: int = 0,
             gpu_use: str = "off", gpu_experts: int = 0, kv_cache_type: str = "bf16") -> None:
        """Load a model; the loaded one stays until the new one has loaded, and stays for good if it fails or is
        cancelled (it is closed first only where both do not fit, _no_room_for_both). threads 0: one per physical
        core; context_length 0: the model's own, and a larger wish is clamped to it by the engine. gpu_use "off",
        "cuda" or "twin" (the GPU half on the CPU), with `gpu_experts` experts per layer in the hot-expert cache.
        kv_cache_type "bf16" or "q8_0" (engine.load's)."""
        self._load_cancel = threading.Event()
        self._queue(self._do_load, str(path), str(backend), int(threads), int(context_length), str(gpu_use),
                    int(gpu_experts), self._load_cancel, str(kv_cache_type))

    def cancel_load(self) -> None:
        self._load_cancel.set()

    def generate(self, messages: list[dict], params: dict, enable_thinking: bool = True,
                 allow_special_tokens: bool = False) -> int:
        """Queue a chat request; returns its id (the id on its TokenChunk and GenerationResult payloads).
        allow_special_tokens: the local engine reads control tokens typed in messages (`<|im_start|>`) as markup;
        off, they stay text. A remote server tokenizes by its own rules, so the flag does not travel there."""
        request_id = next(self._ids)
        with self._lock:
            self._cancels[request_id] = threading.Event()
        self._queue(self._do_generate, request_id, [dict(m) for m in messages], dict(params), bool(enable_thinking),
                    bool(allow_special_tokens))
        return request_id

    def stop(self) -> None:
        """Stop every queued or running request (checked by the decode loop between tokens)."""
        with self._lock:
            for event in self._cancels.values():
                event.set()

    def set_backend(self, name: str) -> None:
        self._queue(self._do_set_backend, str(name))

    def connect_remote(self, base_url: str, api_key: str = "", model: str = "") -> None:
        """Chat through an OpenAI-compatible server instead of a local model (the local one is unloaded). The
        connection is tested first (GET /v1/models); the result comes on `state_changed` (or `failed`)."""
        self._queue(self._do_connect_remote, str(base_url), str(api_key), str(model))

    def test_remote(self, base_url: str, api_key: str = "") -> None:
        """A connection test (GET /v1/models) for the Remote dialog; the result comes on `remote_checked`."""
        self._queue(self._do_test_remote, str(base_url), str(api_key))

    def serve(self, on: bool, network: bool = False, port: int = 8080) -> None:
        """Serve the loaded model over the OpenAI API (on 127.0.0.1, or every address when `network`), with a fresh
        random API key; or stop serving. The result comes on `serving`."""
        self._queue(self._do_serve, bool(on), bool(network), int(port))

    def unload(self) -> None:
        self._queue(self._do_unload)

    def inspect(self, path: str, context_length: int = 0, backend: str = "Auto", kv_cache_type: str = "bf16") -> None:
        """Read the model's header; its RAM is sized for a load with this context length (0: the model's own),
        expert backend and KV cache type, as `load` would make it."""
        self._queue(self._do_inspect, str(path), int(context_length or 0), str(backend), str(kv_cache_type))

    def make_test_model(self, out_path: str, backend: str = "Auto", threads: int = 0, context_length: int = 0,
                        gpu_use: str = "off", gpu_experts: int = 0) -> None:
        """Write a small random-weight model (engine make-model) to out_path, then load it as `load` does."""
        self._load_cancel = threading.Event()
        self._queue(self._do_make, str(out_path), str(backend), int(threads), int(context_length), str(gpu_use),
                    int(gpu_experts), self._load_cancel)

    def query_backends(self) -> None:
        self._queue(self._do_query_backends)

    def pack_writes_left(self) -> int:
        """Bytes of work left to save a first load's packs in the packed-weight cache (hashing, writing; any thread,
        answered at once: not queued behind a running request, which that work waits for)."""
        return self._api.pack_writes_left()

    def pack_hashing_left(self) -> int:
        """Of pack_writes_left, the bytes of the model file to hash before those packs are written (any thread)."""
        return self._api.pack_hashing_left()

    def pack_work_text(self) -> str:
        """pack_writes_left in words (engine.pack_store.work_left: "5.13 GB left to write[, after hashing ...]")."""
        from tessera.engine.pack_store import work_left

        return work_left(self.pack_writes_left(), self.pack_hashing_left())

    def skip_pack_writes(self) -> None:
        """Give up the packs not yet written (the close dialog's Skip); any thread."""
        self._api.skip_pack_writes()

    def query_pack_cache(self) -> None:
        """The packed-weight cache's size; the answer comes on `pack_cache`."""
        self._queue(self._do_pack_cache, False)

    def clear_pack_cache(self) -> None:
        """Delete every packed copy (each model packs again at its next load); the answer comes on `pack_cache`. A
        loaded model keeps running: its packed experts are in memory."""
        self._queue(self._do_pack_cache, True)

    # ---- the worker thread
    @Slot(object)
    def _run(self, call) -> None:
        call()

    def _progress_cb(self, operation: str):
        last = [0.0, None]  # time and stage of the last emitted event

        def report(event: ProgressEvent) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_SECONDS or event.done >= event.total or event.stage != last[1]:
                last[0], last[1] = now, event.stage
                self.progress.emit(LoadProgress(operation, event.stage, event.done, event.total, event.detail))

        return report

    def _state(self) -> ModelState:
        s = self._session
        if self._remote is not None:
            r = self._remote
            return ModelState(True, r.base_url, f"{r.model} (remote)", "remote",
                              f"an OpenAI-compatible server at {r.base_url}", "remote")
        if s is None:
            return ModelState(False)
        return ModelState(True, self._path, Path(self._path).name, s.backend_name, s.backend_reason, s.device,
                          int(s.threads or 0), s.context_length, _as_dict(s.info))

    def _do_load(self, path: str, backend: str, threads: int, context_length: int, gpu_use: str, gpu_experts: int,
                 cancel: threading.Event, kv_cache_type: str = "bf16", close_first: str = "") -> None:
        """Load `path`; the model loaded now (or the remote server) keeps working until the new one has loaded. A
        load that fails or is cancelled, whether before the first tensor or in the middle of them, leaves it as it
        was, so nothing changes in the window but the error. `close_first`: why the loaded model must be closed
        before, already known (otherwise _no_room_for_both decides)."""
        args = _LoadArgs(path, backend, threads, context_length, gpu_use, gpu_experts, kv_cache_type)
        old = self._session
        if old is not None:
            info = self._can_load(path, gpu_use, cancel, context_length, backend, kv_cache_type)
            if info is None:
                return  # the loaded model stays (the reason went out on `failed`)
            close_first = close_first or self._no_room_for_both(info, gpu_use)
            if close_first:  # said before the long wait, and again in the error if the load fails
                self.progress.emit(LoadProgress("load", close_first, 0, 0))
                self._stop_serving()
                self._close_session()
        else:
            close_first = ""
        try:
            if cancel.is_set():
                raise Cancelled()
            session = self._api.load(path, backend=backend, threads=threads or None,
                                     context_length=context_length or None, progress=self._progress_cb("load"),
                                     cancel=cancel, gpu_use=gpu_use, gpu_experts=gpu_experts,
                                     **_kv_arg(kv_cache_type))
        except Exception as exc:  # noqa: BLE001 - every failure must reach the UI, the thread must survive
            before_failure = self._state()
            error = worker_error("load", exc)
            if error.cancelled:
                error = dataclasses.replace(error, subject=path)
            if old is not None and not close_first:
                kept = Path(self._path).name
                self.failed.emit(dataclasses.replace(error, message=f"{error.message}; {kept} stays loaded"))
                return
            if old is not None:
                error = self._reload_previous(error)
            self.failed.emit(error)
            if self._state() != before_failure or not before_failure.loaded:  # a remote server stays, unsaid
                self.state_changed.emit(self._state())
            return
        # the new model is in: now the old one (or the remote server) goes, and what served it
        self._stop_serving()
        self._close_remote()
        self._close_session()
        self._session, self._path, self._load_args = session, path, args
        self.state_changed.emit(self._state())

    def _no_room_for_both(self, info: dict, gpu_use: str) -> str:
        """"" when the new model can load beside the loaded one; otherwise why the loaded one is closed first.

        Loading beside it means that for the length of the load RAM holds both: the loaded model as it is and the
        new one as `info["ram"]` sizes it (engine.model_info.estimate_ram: weights as held, packed experts, KV
        cache, loading peak). That is done only when the new one fits in the RAM free now (the loaded model is
        already counted as used). Otherwise, and whenever either model uses CUDA (two models in one GPU's memory
        would fail where one fits), the loaded model is closed first, the user is told so while the load runs, and
        if the new one then fails it is loaded again from its file (_reload_previous)."""
        previous = self._load_args
        old_name = Path(self._path).name
        if gpu_use == "cuda" or (previous is not None and previous.gpu_use == "cuda"):
            return f"closing {old_name} first: two models do not share the GPU's memory"
        ram = info.get("ram") or {}
        need = int(ram.get("total_bytes") or info.get("loaded_bytes") or 0)
        free = self._api.ram_available()
        if need <= free:
            return ""
        need_text = info.get("ram_text") or f"about {need / 1e9:.1f} GB"
        return (f"closing {old_name} first: both do not fit in RAM (this load needs {need_text}; "
                f"{free / 1e9:.1f} GB RAM free)")

    def _close_session(self) -> None:
        """Close the session; a first load's packs not yet written are written first (engine.pack_store), said on
        `progress` when there are any."""
        if self._session is not None:
            left = self._api.pack_writes_left()
            if left:
                self.progress.emit(LoadProgress("load", f"saving {Path(self._path).name}'s packed weights: "
                                                        f"{self.pack_work_text()}", 0, 0))
            session, self._session = self._session, None
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - report it; the next model loads anyway
                self.failed.emit(worker_error("unload", exc))

    def _reload_previous(self, error: WorkerError) -> WorkerError:
        """After a failed load for which the previous model was closed first (no room for both): load that one
        again, with the settings it had, and say so in `error`. Not cancellable: it is the way back."""
        previous, name = self._load_args, Path(self._path).name
        self.progress.emit(LoadProgress("load", f"loading {name} again", 0, 0))
        try:
            self._session = self._api.load(previous.path, backend=previous.backend,
                                           threads=previous.threads or None,
                                           context_length=previous.context_length or None,
                                           progress=self._progress_cb("load"), cancel=threading.Event(),
                                           gpu_use=previous.gpu_use, gpu_experts=previous.gpu_experts,
                                           **_kv_arg(previous.kv_cache_type))
        except Exception as exc:  # noqa: BLE001 - both failures are said
            self._path, self._load_args = "", None
            again = worker_error("load", exc)
            return dataclasses.replace(error, message=f"{error.message}; {name} could not be loaded again either "
                                                      f"({again.text})")
        return dataclasses.replace(error, message=f"{error.message}; {name} was loaded again")

    def _can_load(self, path: str, gpu_use: str, cancel: threading.Event, context_length: int = 0,
                  backend: str = "Auto", kv_cache_type: str = "bf16") -> dict | None:
        """Before the loaded model is touched: can `path` load at all (its header reads, CUDA is there when asked)?
        Its header facts, with the RAM this load needs; or None, when it cannot load: then why went out on
        `failed`, and the loaded model stays."""
        try:
            if cancel.is_set():
                raise Cancelled()
            info = self._api.inspect(path, context_length=context_length or None, backend=backend,
                                     **_kv_arg(kv_cache_type))
            if gpu_use == "cuda":
                reason = self._api.cuda_missing()
                if reason:
                    raise TesseraError("placement", reason)
        except Exception as exc:  # noqa: BLE001 - reported; the thread and the loaded model stay
            error = worker_error("load", exc)
            self.failed.emit(dataclasses.replace(error, subject=path) if error.cancelled else error)
            return None
        return info

    def _do_make(self, out_path: str, backend: str, threads: int, context_length: int, gpu_use: str,
                 gpu_experts: int, cancel: threading.Event) -> None:
        try:
            made = self._api.make_test_model(out_path, self._progress_cb("make"))
        except Exception as exc:  # noqa: BLE001
            self.failed.emit(worker_error("make", exc))
            return
        self._do_load(str(made), backend, threads, context_length, gpu_use, gpu_experts, cancel)

    def _do_generate(self, request_id: int, messages: list, params: dict, enable_thinking: bool,
                     allow_special_tokens: bool = False) -> None:
        with self._lock:
            cancel = self._cancels.get(request_id) or threading.Event()
        steps: list[StepSample] = []
        text: list[str] = []
        pending: list[str] = []
        count = [0, 0]  # total tokens, tokens pending emission
        last_emit = [0.0]
        t_last = [0.0]

        def on_step(m: StepMetrics) -> None:
            steps.append(StepSample(m.phase, m.tokens, m.seconds, m.expert_pairs, m.expert_pairs_on_gpu,
                                    m.expert_bytes))

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
            if self._session is None and self._remote is None:
                raise TesseraError("model", "no model is loaded: open one first")
            sampling = self._api.sampling_params(params)
            done = None
            if self._remote is not None:  # no step figures from a server: TTFT and tok/s come from stream timing
                remote = self._remote

                def chat(messages, sampling, *, enable_thinking, cancel, on_step):
                    last = None  # each streamed piece after the first is one decode step for the graphs
                    for event in remote.chat(messages, sampling, enable_thinking=enable_thinking, cancel=cancel):
                        if not isinstance(event, DoneEvent):
                            if last is not None:
                                on_step(StepMetrics("decode", 1, max(event.t - last, 0.0)))
                            last = event.t
                        yield event
            else:
                local = self._server.chat if self._server is not None else self._session.chat  # shared while serving
                chat = functools.partial(local, allow_special_tokens=allow_special_tokens)
            for event in chat(messages, sampling, enable_thinking=enable_thinking, cancel=cancel, on_step=on_step):
                if isinstance(event, DoneEvent):
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
            err = worker_error("generate", exc)
            if err.cancelled:
                self.finished.emit(GenerationResult(request_id, "".join(text),
                                                    {"generated_tokens": count[0], "stop_reason": "cancelled"}))
            else:
                self.failed.emit(err)
                self.finished.emit(GenerationResult(request_id, "".join(text),
                                                    {"generated_tokens": count[0], "stop_reason": "error"}, err.text))
        finally:
            with self._lock:
                self._cancels.pop(request_id, None)

    def _do_set_backend(self, name: str) -> None:
        if self._remote is not None:
            self.failed.emit(WorkerError("backend", "remote server", "its backend is chosen on the server"))
            return
        if self._session is None:
            return  # applied at the next load
        try:
            progress = self._progress_cb("repack")
            if self._server is not None:  # between the server's requests, not under one
                self._server.call(lambda session: session.set_backend(name, progress=progress))
            else:
                self._session.set_backend(name, progress=progress)
            if self._load_args is not None:
                self._load_args = self._load_args._replace(backend=name)
        except NotEnoughMemoryError as exc:
            if self._server is None and self._load_args is not None:
                self._load_again_with(name, exc)
                return
            self.failed.emit(worker_error("backend", exc))
        except Exception as exc:  # noqa: BLE001
            self.failed.emit(worker_error("backend", exc))
        self.state_changed.emit(self._state())

    def _load_again_with(self, name: str, refused: NotEnoughMemoryError) -> None:
        """A backend whose packs do not fit beside the one in use (the engine refused the switch before packing): the
        model is closed and loaded again with it, through _do_load, which loads the old one back if that fails. The
        conversation stays in the window; its next message is read in again by the new backend. (Not while serving:
        the server's clients would lose the model in the middle; the refusal is said instead.)"""
        args = self._load_args._replace(backend=name)
        old_backend, model = self._session.backend_name, Path(self._path).name
        self._load_cancel = threading.Event()
        self._do_load(*args[:6], self._load_cancel, args.kv_cache_type,
                      close_first=f"closing {model} first: {name}'s packs do not fit beside {old_backend}'s "
                                  f"({refused.shortfall}); loading it again with {name}")

    def _do_unload(self) -> None:
        self._stop_serving()
        self._close_remote()
        if self._session is not None:
            self._close_session()
            self._path = ""
        self.state_changed.emit(ModelState(False))

    def _do_serve(self, on: bool, network: bool, port: int) -> None:
        from tessera.app.serving import ServeState

        self._stop_serving()
        if not on:
            return
        if self._session is None:
            error = ("a remote model is served by its own server" if self._remote is not None
                     else "no model is loaded: open one first")
            self.serving.emit(ServeState(False, error=error))
            return
        try:
            from tessera.app.serving import LocalServer, new_api_key

            self._server = LocalServer(self._session, model_path=self._path, port=port, api_key=new_api_key(),
                                       host="0.0.0.0" if network else "127.0.0.1")
        except Exception as exc:  # noqa: BLE001 - e.g. the port is taken: said in the panel
            err = worker_error("serve", exc)
            self.serving.emit(ServeState(False, error=f"{err.subject}: {err.message}" if err.subject else err.message))
            return
        s = self._server
        self.serving.emit(ServeState(True, s.url, s.api_key or "", s.model_name))

    def _do_connect_remote(self, base_url: str, api_key: str, model: str) -> None:
        self._stop_serving()
        self._close_remote()
        if self._session is not None:  # one engine at a time
            self._do_unload()
        try:
            from tessera.engine.remote import RemoteClient

            client = RemoteClient(base_url, api_key or None, model=model or None)
            try:
                models = client.check()["models"]
                if model and model not in models:
                    raise TesseraError(f"model {model}", f"is not served there (it lists {', '.join(models)})")
                client.resolved_model()
            except BaseException:
                client.close()
                raise
        except Exception as exc:  # noqa: BLE001 - down, wrong key, not the OpenAI API: said in the UI
            self.failed.emit(worker_error("connect", exc))
            self.state_changed.emit(ModelState(False))
            return
        self._remote = client
        self.state_changed.emit(self._state())

    def _do_test_remote(self, base_url: str, api_key: str) -> None:
        try:
            from tessera.engine.remote import RemoteClient

            with RemoteClient(base_url, api_key or None, connect_timeout=5, read_timeout=15) as client:
                check = client.check()
            self.remote_checked.emit({"ok": True, "url": base_url, "models": check["models"],
                                      "seconds": check["seconds"], "error": ""})
        except Exception as exc:  # noqa: BLE001 - the reason goes to the dialog
            err = worker_error("connect", exc)
            self.remote_checked.emit({"ok": False, "url": base_url, "models": [], "seconds": 0.0,
                                      "error": f"{err.subject}: {err.message}" if err.subject else err.message})

    def _close_remote(self) -> None:
        if self._remote is not None:
            remote, self._remote = self._remote, None
            remote.close()

    def _stop_serving(self) -> None:
        if self._server is None:
            return
        from tessera.app.serving import ServeState

        server, self._server = self._server, None
        try:
            server.stop()
        except Exception as exc:  # noqa: BLE001
            self.failed.emit(worker_error("serve", exc))
        self.serving.emit(ServeState(False))

    def _do_inspect(self, path: str, context_length: int, backend: str, kv_cache_type: str = "bf16") -> None:
        try:
            info = self._api.inspect(path, context_length=context_length or None, backend=backend,
                                     **_kv_arg(kv_cache_type))
            self.inspected.emit(ModelSummary(path, info))
        except Exception as exc:  # noqa: BLE001
            self.failed.emit(worker_error("inspect", exc))

    def _do_pack_cache(self, clear: bool) -> None:
        try:
            from tessera.engine.pack_cache import human_bytes

            folder, held, freed, budget, why = self._api.pack_cache(clear)
            self.pack_cache.emit(PackCacheInfo(folder, held, human_bytes(held), freed, human_bytes(max(freed, 0)),
                                               budget_text=human_bytes(budget) if budget else "", budget_why=why))
        except Exception as exc:  # noqa: BLE001 - e.g. a read-only cache folder: said next to the button
            err = worker_error("cache", exc)
            self.pack_cache.emit(PackCacheInfo("", text="size unknown", error=err.text))

    def _do_query_backends(self) -> None:
        try:
            self.backends.emit(self._api.backend_status())
        except Exception as exc:  # noqa: BLE001 - reported like any failure; the thread survives
            self.failed.emit(worker_error("backends", exc))
