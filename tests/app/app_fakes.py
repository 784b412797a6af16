"""A test double of the engine calls EngineWorker makes (tessera/app/worker.py EngineApi), for the worker's own logic
and the window's wiring. Its events are the engine's real dataclasses (tessera/engine/events.py), so payload conversion
is exercised. The tests against a real tiny model live in test_real_engine.py."""

from __future__ import annotations

import threading
import time

from tessera.app.payloads import BackendList
from tessera.engine.errors import BackendUnavailableError, Cancelled, ModelFormatError, NotEnoughMemoryError
from tessera.engine.events import DoneEvent, ProgressEvent, RequestMetrics, StepMetrics, TokenEvent

BACKENDS = {"Auto": (True, ""), "Torch": (True, "pure torch"), "AVX512": (True, "CPU has avx512f/bw/vl"),
            "AVX2": (True, "CPU has avx2+fma"), "Reference": (True, "scalar C++"),
            "AMXInt8": (False, "CPU lacks amx_int8"), "AMXBF16": (False, "CPU lacks amx_bf16"),
            "AVX512Int8": (True, "CPU has avx512_vnni")}


class FakeSession:
    def __init__(self, path: str, backend: str, threads, context_length, token_delay: float):
        self.path = path
        self.backend_name = "AVX512" if backend == "Auto" else backend
        self.backend_reason = "best available on this CPU" if backend == "Auto" else "as asked"
        self.threads = threads or 2
        self.context_length = min(context_length or 2048, 2048)  # the engine clamps to the model's own context
        self.device = "cpu"
        self.info = {"architecture": "qwen3moe", "num_hidden_layers": 3, "num_experts": 8}
        self.token_delay = token_delay
        self.calls: list[dict] = []  # every chat request: messages, params, enable_thinking, backend
        self.closed = False
        self.reply_words = ["<think>", "\nlet", " me", " think", "\n</think>", "\n\nHello", " there", "!"]
        self.fail_next = False

    def chat(self, messages, params, *, enable_thinking=True, cancel=None, on_step=None, allow_special_tokens=False):
        self.calls.append({"messages": [dict(m) for m in messages], "params": params,
                           "enable_thinking": enable_thinking, "backend": self.backend_name,
                           "allow_special_tokens": allow_special_tokens})
        if self.fail_next:
            self.fail_next = False
            raise ModelFormatError("tensor blk.0.ffn_up_exps", "NaN in the weights")
        prompt_tokens = sum(len(m["content"].split()) + 4 for m in messages)
        reused = max(0, prompt_tokens - 8) if len(self.calls) > 1 else 0
        t0 = time.perf_counter()
        if on_step:
            on_step(StepMetrics("prefill", prompt_tokens - reused, 0.01, expert_pairs=10, expert_bytes=1_000_000))
        words = list(self.reply_words) if enable_thinking else self.reply_words[5:]
        n_max = params["max_tokens"]
        words = words[:n_max]
        out, stop = [], "eos"
        for i, w in enumerate(words):
            if cancel is not None and cancel.is_set():
                stop = "cancelled"
                break
            time.sleep(self.token_delay)
            if on_step:
                on_step(StepMetrics("decode", 1, max(self.token_delay, 1e-4), expert_pairs=4, expert_bytes=500_000))
            out.append(w)
            yield TokenEvent(i, w, i, time.perf_counter() - t0)
        else:
            stop = "max_tokens" if len(words) == n_max and n_max < len(self.reply_words) else "eos"
        m = RequestMetrics(prompt_tokens=prompt_tokens, reused_tokens=reused, generated_tokens=len(out), ttft_s=0.02,
                           prefill_s=0.01, decode_s=0.05, prefill_tok_s=1000.0, decode_tok_s=25.0,
                           prefix_hit_rate=reused / prompt_tokens, expert_cache_hit_rate=None, stop_reason=stop,
                           backend=self.backend_name)
        yield DoneEvent("".join(out), list(range(len(out))), m)

    refuse_switch = False  # a test sets it: the new backend's packs do not fit beside this one's

    def set_backend(self, name, progress=None):
        ok, reason = BACKENDS.get(name, (False, "unknown backend"))
        if not ok:
            raise BackendUnavailableError(f"backend {name}", reason)
        if self.refuse_switch:
            shortfall = "packing 3 layers of bfloat16 experts takes 9.70 GB of RAM and 4.00 GB are free"
            raise NotEnoughMemoryError(f"backend {name}", f"{shortfall}; the backend in use ({self.backend_name}) "
                                       "stays loaded", shortfall)
        for i in range(3):
            if progress:
                progress(ProgressEvent("repack", i + 1, 3, f"layer {i}"))
        self.backend_name, self.backend_reason = name, "as asked"

    def close(self):
        self.closed = True


class FakeApi:
    def __init__(self, token_delay: float = 0.002, load_delay: float = 0.0):
        self.token_delay = token_delay
        self.load_delay = load_delay
        self.sessions: list[FakeSession] = []
        self.threads_seen: list[str] = []
        self.placements_seen: list[tuple[str, int]] = []  # (gpu_use, gpu_experts) per load

    def load(self, path, *, backend, threads, context_length, progress, cancel, gpu_use="off", gpu_experts=0):
        self.threads_seen.append(threading.current_thread().name)
        self.placements_seen.append((gpu_use, gpu_experts))
        if "bad" in str(path):
            raise ModelFormatError(str(path), "not a GGUF file (bad magic)")
        for i in range(5):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            if "damaged" in str(path) and i == 3:  # passes inspect; fails while reading the tensors
                raise ModelFormatError(str(path), "tensor blk.1.ffn_up_exps.weight: block 37 has a NaN or Inf scale")
            time.sleep(self.load_delay / 5)
            if progress:
                progress(ProgressEvent("tensors", i + 1, 5, f"tensor {i}"))
        s = FakeSession(str(path), backend, threads, context_length, self.token_delay)
        self.sessions.append(s)
        return s

    def inspect(self, path, *, context_length=None, backend="Auto"):
        """The real one's keys (engine.model_summary adds type_mix, ram, ram_text); the sizing asked for is kept in
        `inspected_for`."""
        if "bad" in str(path):
            raise ModelFormatError(str(path), "not a GGUF file (bad magic)")
        self.inspected_for = (context_length, backend)
        ram = {"backend": "AVX512" if backend == "Auto" else backend, "context_length": context_length or 2048,
               "weights_bytes": 5_000_000, "packed_bytes": 2_000_000, "kv_bytes": 1_000_000, "transient_bytes": 0,
               "prefill_bytes": 0,
               "total_bytes": 8_000_000}
        return {"architecture": "qwen3moe", "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
                "num_key_value_heads": 2, "head_dim": 16, "total_bytes": 5_000_000, "loaded_bytes": 5_000_000,
                "context_length": 2048, "type_bytes": {"F32": 5_000_000}, "tensor_types": {"F32": 30},
                "type_mix": "F32 100 %", "ram": ram,
                "ram_text": "about 8.00 MB: weights 5.00 MB + packed experts 2.00 MB + KV cache 1.00 MB",
                "fit_share": 0.9}

    ram_free = 64_000_000_000  # what ram_available reports; a test lowers it to leave no room for two models

    def ram_available(self):
        return self.ram_free

    def sampling_params(self, params):
        return dict(params)

    def backend_status(self):
        return BackendList(dict(BACKENDS), "AVX512", "best available on this CPU", cuda_reason=self.cuda_missing())

    def cuda_missing(self):
        return "no CUDA device is available: torch 0.0+fake is a CPU build"

    def make_test_model(self, out_path, progress):
        return out_path

    pack_writes = 0  # bytes of packs still to write (engine.pack_store); a test sets it, the fake writer drains it
    writes_skipped = False

    pack_hashing = 0  # of pack_writes, bytes of the model file still to hash first

    def pack_writes_left(self):
        return self.pack_writes

    def pack_hashing_left(self):
        return self.pack_hashing

    def skip_pack_writes(self):
        self.writes_skipped = True
        self.pack_writes = 0

    pack_cache_bytes = 3_000_000_000  # what the packed-weight cache holds

    def pack_cache(self, clear):
        freed = self.pack_cache_bytes if clear else -1
        if clear:
            self.pack_cache_bytes = 0
        return "/home/user/.cache/tessera/packed", self.pack_cache_bytes, freed, 20_000_000_000, "set by the caller"


# ---- fixtures shared by the app tests (import them into a test module to use them)
import pytest  # noqa: E402


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A fresh app data dir (database, settings) per test."""
    d = tmp_path / "data"
    monkeypatch.setenv("TESSERA_DATA_DIR", str(d))
    return d


@pytest.fixture
def fake_api():
    return FakeApi()


@pytest.fixture
def worker(qtbot, fake_api):
    from tessera.app.worker import EngineWorker

    w = EngineWorker(fake_api)
    w.start()
    yield w
    w.shutdown()
