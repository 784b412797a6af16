"""All user settings: ONE table of keys and defaults, persisted through QSettings (only here).

A `Settings` object is created once in `tessera/app/__main__.py` and passed to whoever needs it (never a global
instance). The settings dialog is generated from `TABLE`; `changed(key, value)` tells the window what to apply live.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, Signal


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


@dataclass(frozen=True)
class Setting:
    key: str
    default: Any
    label: str
    group: str
    help: str = ""
    choices: tuple = ()  # fixed choices (a combo box)
    runtime_choices: bool = False  # a combo box whose choices the engine lists at run time (the worker's BackendList)
    minimum: float | None = None
    maximum: float | None = None
    reload: bool = False  # takes effect at the next model load
    hidden: bool = False  # kept but not shown in the dialog (window state, recents)

    @property
    def kind(self) -> type:
        return type(self.default)


# key, default, label, group ... — the whole schema. `None` defaults are resolved by `_dynamic_default`.
TABLE: tuple[Setting, ...] = (
    Setting("model/backend", "Auto", "Expert backend", "Model",
            "CPU kernel for the routed experts. Changing it while a model is loaded repacks the experts and keeps the "
            "chat.",
            runtime_choices=True),
    Setting("model/threads", 0, "CPU threads", "Model", "0 means one per physical core.", minimum=0, maximum=1024,
            reload=True),
    Setting("model/context_length", 4096, "Context length", "Model", "Tokens of context (prompt + reply).",
            minimum=256, maximum=262144, reload=True),
    Setting("model/kv_cache_type", "bf16", "KV cache type", "Model",
            "bf16: 2 bytes a value. q8_0: int8 with a scale per 32 values (as llama.cpp's -ctk/-ctv q8_0): about half "
            "the RAM, and faster replies at long contexts; CPU attention only.", choices=("bf16", "q8_0"), reload=True),
    Setting("model/reopen_last", True, "Reopen the last model at start", "Model",
            "Start with the model loaded last (if its file is still there); otherwise start on the demo model."),
    Setting("gpu/use", "off", "GPU use", "Model",
            "off: everything on the CPU. cuda: attention, norms, router and lm_head on the GPU, routed experts on the "
            "CPU backend, hot experts cached on the GPU. twin: the same plan with the CPU standing in for the GPU "
            "(to try the expert cache without a GPU).", choices=("off", "cuda", "twin"), reload=True),
    Setting("gpu/expert_cache", 0, "GPU expert cache (experts per layer)", "Model",
            "How many of each MoE layer's experts stay resident on the GPU (or its CPU twin); 0 disables the cache.",
            minimum=0, maximum=512, reload=True),
    Setting("sampling/temperature", 0.6, "Temperature", "Sampling", "0 is greedy.", minimum=0.0, maximum=5.0),
    Setting("sampling/top_k", 20, "Top-k", "Sampling", "0 disables.", minimum=0, maximum=1000),
    Setting("sampling/top_p", 0.95, "Top-p", "Sampling", "1 disables.", minimum=0.0, maximum=1.0),
    Setting("sampling/min_p", 0.0, "Min-p", "Sampling", "0 disables.", minimum=0.0, maximum=1.0),
    Setting("sampling/repetition_penalty", 1.0, "Repetition penalty", "Sampling", "1 disables.", minimum=0.5,
            maximum=3.0),
    Setting("sampling/seed", -1, "Seed", "Sampling", "-1 picks a new seed each reply.", minimum=-1, maximum=2**31 - 1),
    Setting("sampling/max_tokens", 2048, "Max reply tokens", "Sampling", "", minimum=1, maximum=262144),
    Setting("chat/system_prompt", "", "System prompt", "Chat", "Sent first in every new conversation."),
    Setting("chat/thinking", True, "Thinking on by default", "Chat", "Qwen3 thinking mode (<think> blocks)."),
    Setting("chat/allow_special_tokens", False, "Read control tokens in my messages", "Chat",
            "Off: a control token typed or pasted in a message (<|im_start|>, <|im_end|>, <think>…) is plain text "
            "and cannot open a turn or forge a system prompt. On: the local model reads it as markup, for people who "
            "write raw turns on purpose. A remote server tokenizes by its own rules (Tessera's own server keeps this "
            "off for its clients)."),
    Setting("ui/theme", "system", "Theme", "Appearance", "system: follow the desktop's light or dark setting.",
            choices=("system", "light", "dark")),
    Setting("ui/font_size", 0, "Font size (points)", "Appearance", "0 keeps the desktop's size.", minimum=0,
            maximum=32),
    Setting("hardware/bandwidth_gbs", 0.0, "Measured memory bandwidth (GB/s)", "Hardware",
            "Filled in by the hardware wizard; 0 means not measured. Used by the bandwidth readout.",
            minimum=0.0, maximum=10000.0),
    Setting("recent/models", [], "Recent models", "State", hidden=True),
    Setting("window/geometry", b"", "Window geometry", "State", hidden=True),
    Setting("window/state", b"", "Window state", "State", hidden=True),
)

BY_KEY = {s.key: s for s in TABLE}


class Settings(QObject):
    """Typed get/set over one QSettings INI file; emits `changed(key, value)` when a value really changes."""

    changed = Signal(str, object)

    def __init__(self, path: str | Path, parent: QObject | None = None):
        super().__init__(parent)
        self._qs = QSettings(str(path), QSettings.Format.IniFormat)

    def default(self, key: str) -> Any:
        spec = BY_KEY[key]
        if key == "model/threads":
            return physical_cores()
        return spec.default

    def get(self, key: str) -> Any:
        spec = BY_KEY[key]  # KeyError names an unknown key: a programming error
        raw = self._qs.value(key, None)
        if raw is None:
            return self.default(key)
        value = _coerce(raw, spec.default)
        if key == "model/threads" and value <= 0:
            return physical_cores()
        return value

    def set(self, key: str, value: Any) -> None:
        spec = BY_KEY[key]
        value = _coerce(value, spec.default)
        if spec.choices and value not in spec.choices:
            raise ValueError(f"setting {key}: {value!r} is not one of {', '.join(map(str, spec.choices))}")
        old = self.get(key)
        self._qs.setValue(key, value)
        if old != value:
            self.changed.emit(key, value)

    def reset(self, key: str) -> None:
        self.set(key, self.default(key))

    def sync(self) -> None:
        self._qs.sync()

    def add_recent_model(self, path: str, keep: int = 10) -> None:
        recent = [p for p in self.get("recent/models") if p != path]
        self.set("recent/models", [path, *recent][:keep])


def _coerce(raw: Any, default: Any) -> Any:
    """QSettings INI files give strings back; turn them into the default's type."""
    if isinstance(default, bool):
        if isinstance(raw, str):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        return bool(raw)
    if isinstance(default, int):
        return int(float(raw))
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, list):
        if raw in ("", None):
            return []
        return [str(x) for x in raw] if isinstance(raw, (list, tuple)) else [str(raw)]
    if isinstance(default, bytes):
        if isinstance(raw, (bytes, bytearray)):
            return bytes(raw)
        try:
            return bytes(raw.data())  # QByteArray
        except AttributeError:
            return str(raw).encode()
    return str(raw)
