"""Kernel knobs measured on this machine (`tessera-cli tune`, or a short calibration on the first load): the stored
record, and applying it to the native module.

A record is one JSON file in the tuning folder (TESSERA_TUNE_DIR, else <user cache dir>/tessera/tuning), named by the
CPU model string and the build of the native module, and holding both again, so a record is only ever applied to the
CPU and the kernels it was measured with. A record that cannot be read, is of another version, or names another CPU
or build is ignored with a message naming the file and the problem; the kernels' defaults are used until a calibration
has run. Knobs set by the environment (TESSERA_PF, TESSERA_SPIN_US, TESSERA_AMX_TILE_MIN_ROWS,
TESSERA_QUANT_MOE_CHUNK_T, TESSERA_VNNI_GEMM_MIN_T) always win over a record. A knob the record does not hold (the first
load's short calibration leaves out the slow ones: calibrate.Knob.on_load) keeps the kernels' default. The measuring
itself is tessera/engine/calibrate.py.

Record: {"tessera_tuning": 1, "cpu", "build", "measured_at" (UTC, ISO 8601), "seconds", "backend", "threads",
         "shape": {E, H, I, k, experts_timed[, quant_experts_timed]},
         "knobs": {NAME: {"value", "default", "workload", "median_ms": {candidate: ms}}}}
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path

RECORD_VERSION = 1
_DIR_ENV = "TESSERA_TUNE_DIR"
ON_LOAD_ENV = "TESSERA_TUNE_ON_LOAD"  # "0": a load never calibrates (tests set it; `tessera-cli tune` still runs)
ON_LOAD_SECONDS = 2.0  # timing budget of the first load's calibration (tessera-cli tune: --seconds, default 3)
# Runtime knobs a record may set (engine.native.set_tuning_knob) and the variable that overrides each.
KNOBS = {"prefetch_bytes": "TESSERA_PF", "spin_us": "TESSERA_SPIN_US", "amx_tile_min_rows": "TESSERA_AMX_TILE_MIN_ROWS",
         "quant_moe_chunk_tokens": "TESSERA_QUANT_MOE_CHUNK_T", "vnni_gemm_min_tokens": "TESSERA_VNNI_GEMM_MIN_T",
         "avx2_gemm_min_tokens": "TESSERA_AVX2_GEMM_MIN_T", "decode_streams": "TESSERA_DECODE_STREAMS"}


def default_dir() -> Path:
    """The tuning folder: TESSERA_TUNE_DIR, else <user cache dir>/tessera/tuning (beside the packed-weight cache)."""
    override = os.environ.get(_DIR_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("tessera")) / "tuning"


# A layer whose experts hold fewer weights than this (3 H I per expert) is too small for its timings to say anything
# about a real model's kernels (the demo model: 0.15 M; Qwen3-30B-A3B: 4.7 M): its first load does not calibrate, so
# the record a later real load measures is not pre-empted by one taken on the demo.
MIN_CALIBRATION_WEIGHTS = 1 << 20


def calibrate_on_load(H: int | None = None, I: int | None = None) -> bool:
    """Whether a load with no record for this CPU and build runs the short calibration: TESSERA_TUNE_ON_LOAD=0: never;
    =1: always; unset: for models whose experts are large enough to time (MIN_CALIBRATION_WEIGHTS), when H and I
    are given."""
    value = os.environ.get(ON_LOAD_ENV, "").strip().lower()
    if value in ("0", "no", "off", "false"):
        return False
    if value or H is None or I is None:
        return True
    return 3 * H * I >= MIN_CALIBRATION_WEIGHTS


def cpu_model() -> str:
    """The CPU's brand string (CPUID), as `check` shows it; the platform's name where CPUID has none."""
    from tessera.engine import native

    brand = str(native.cpu_features().get("brand") or "").strip()
    if not brand:
        import platform

        brand = platform.processor() or platform.machine() or "unknown CPU"
    return re.sub(r"\s+", " ", brand)


@functools.cache
def build_id() -> str:
    """The native module's build: the first 16 hex digits of its file's SHA-256 (a rebuilt kernel is another build)."""
    from tessera.engine import native

    h = hashlib.sha256()
    with open(native.module_file(), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def record_path(folder: str | os.PathLike | None = None, cpu: str | None = None, build: str | None = None) -> Path:
    """Where the record of `cpu` and `build` (default: this machine's) lives in `folder` (default: default_dir())."""
    cpu = cpu if cpu is not None else cpu_model()
    build = build if build is not None else build_id()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", cpu).strip("-").lower()[:60] or "cpu"
    digest = hashlib.sha256(f"{cpu}\n{build}".encode()).hexdigest()[:8]
    return Path(folder if folder is not None else default_dir()) / f"{slug}-{build}-{digest}.json"


def save(record: dict, folder: str | os.PathLike | None = None) -> Path:
    """Writes `record` (its own cpu and build name the file) atomically: a temporary file in the same folder, flushed,
    then renamed over the old one, so a reader sees the old record or the new one, never half of one."""
    path = record_path(folder, record["cpu"], record["build"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load(folder: str | os.PathLike | None = None, cpu: str | None = None,
         build: str | None = None) -> tuple[dict | None, str]:
    """(record, message) for `cpu` and `build` (default: this machine's). record is None when there is none or it
    cannot be used; message then says why, naming the file ("" when there is simply none yet)."""
    cpu = cpu if cpu is not None else cpu_model()
    build = build if build is not None else build_id()
    path = record_path(folder, cpu, build)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"tuning record {path}: cannot be read ({e.strerror or e}); ignored, the kernels' defaults are " \
                     "used"
    problem = _problem(text, cpu, build)
    if problem:
        return None, f"tuning record {path}: {problem}; ignored, the kernels' defaults are used"
    return json.loads(text), ""


def _problem(text: str, cpu: str, build: str) -> str:
    """Why a record's text cannot be applied here, or ""."""
    try:
        rec = json.loads(text)
    except ValueError as e:
        return f"not valid JSON ({e})"
    if not isinstance(rec, dict) or "tessera_tuning" not in rec:
        return "not a Tessera tuning record (no 'tessera_tuning' key)"
    if rec["tessera_tuning"] != RECORD_VERSION:
        return f"record version {rec['tessera_tuning']!r}, this build reads version {RECORD_VERSION}"
    if rec.get("cpu") != cpu:
        return f"measured on CPU {rec.get('cpu')!r}, this is {cpu!r}"
    if rec.get("build") != build:
        return f"measured with native build {rec.get('build')!r}, this is {build!r}"
    knobs = rec.get("knobs")
    if not isinstance(knobs, dict):
        return "no 'knobs' object"
    for name, k in knobs.items():
        if name not in KNOBS:
            return f"unknown knob {name!r} (this build tunes {', '.join(KNOBS)})"
        if not isinstance(k, dict) or not isinstance(k.get("value"), int) or isinstance(k.get("value"), bool):
            return f"knob {name!r}: 'value' must be a whole number"
    return ""


def apply(record: dict | None) -> dict:
    """Sets the record's knobs in the native module, except those the environment set. Returns, per runtime knob,
    {"value", "source"}: source "measured" (from the record), "environment" or "default"."""
    from tessera.engine import native

    env = set(native.tuning()["from_environment"])
    knobs = (record or {}).get("knobs", {})
    for name, var in KNOBS.items():
        if name in knobs and var not in env:
            native.set_tuning_knob(name, int(knobs[name]["value"]))
    return current(record)


def current(record: dict | None) -> dict:
    """Each runtime knob's value in this process and where it came from (see apply): for `check` and the wizard."""
    from tessera.engine import native

    now = native.tuning()
    env = set(now["from_environment"])
    knobs = (record or {}).get("knobs", {})
    out = {}
    for name, var in KNOBS.items():
        source = "environment" if var in env else "measured" if name in knobs else "default"
        out[name] = {"value": int(now[name]), "source": source}
    return out


# What a knob's value means where the number alone does not say: the kernels read these as "their own default".
# (knob, value) -> (short label for a list of candidates, the whole meaning).
VALUE_MEANINGS = {
    ("amx_tile_min_rows", 0): ("per weight format", "per weight format: bf16 2, int8 16 (amx_moe.h, measured on an "
                                                    "AMX Xeon)"),
    ("prefetch_bytes", -1): ("the kernel's default", "the kernel's default, 8192 bytes ahead"),
    ("vnni_gemm_min_tokens", 0): ("the kernels' default", "the kernels' default, 12 tokens"),
    ("avx2_gemm_min_tokens", 0): ("per type", "per type and dot: 2-4 tokens (quant_kernels.h avx2_gemm_min_tokens)"),
    ("quant_moe_chunk_tokens", 0): ("the kernels' default", "the kernels' default, 2048 tokens"),
    ("decode_streams", 0): ("per CPU vendor", "per CPU vendor: 2 on Intel, 1 elsewhere (tessera/tuning.h "
                                              "decode_streams)"),
}


def value_meaning(name: str, value: int) -> str:
    """What `value` of knob `name` stands for where it is a placeholder for the kernels' own default, else ""."""
    return VALUE_MEANINGS.get((name, int(value)), ("", ""))[1]


def status(folder: str | os.PathLike | None = None) -> dict:
    """What `check` and the hardware wizard show: {cpu, build, path, measured_at, backend, seconds, message, knobs}
    (knobs as `current` gives them, with the stored record's values where the environment does not set them, and then
    "median_ms": {candidate: ms}, the timings behind the value; every knob also has "meaning": value_meaning's text, ""
    for a plain number, "medians_text": measured_text's, and "detail": the source, meaning and medians as one text, the
    one check and the wizard's report show; nothing is applied or measured here)."""
    record, message = load(folder)
    path = record_path(folder)
    knobs = current(None)
    for name, k in (record or {}).get("knobs", {}).items():
        if knobs[name]["source"] != "environment":  # the value, and the medians that chose it
            knobs[name] = {"value": int(k["value"]), "source": "measured", "median_ms": k.get("median_ms", {})}
    return {"cpu": cpu_model(), "build": build_id(), "path": str(path), "stored": record is not None,
            "measured_at": (record or {}).get("measured_at"), "backend": (record or {}).get("backend"),
            "seconds": (record or {}).get("seconds"), "message": message or ("" if record else
                                                                             "not calibrated yet: defaults in use "
                                                                             "(tessera-cli tune)"),
            "knobs": {name: _shown(name, k) for name, k in knobs.items()}}


def _shown(name: str, knob: dict) -> dict:
    """A knob of `current` with what status() adds for display: meaning, medians_text and detail."""
    meaning, medians = value_meaning(name, knob["value"]), measured_text(knob, name)
    detail = knob["source"] + (f": {meaning}" if meaning else "") + medians
    return {**knob, "meaning": meaning, "medians_text": medians, "detail": detail}


def describe(st: dict) -> list[str]:
    """status() as lines for people (check's Markdown, the CLI)."""
    lines = []
    if st["stored"]:
        lines.append(f"Measured {st['measured_at']} on {st['backend']} in {st['seconds']:.1f} s ({st['path']})")
    else:
        lines.append(st["message"])
    for name, k in st["knobs"].items():
        lines.append(f"{name} = {k['value']} ({k['detail']})")
    return lines


def measured_text(knob: dict, name: str = "") -> str:
    """"; medians 0: 1.1 ms, 50: 1.2 ms, ..." for a measured knob of status() (each candidate's median; with the
    knob's `name`, a placeholder candidate says what it stands for: "0 (per weight format)"), else ""."""
    medians = knob.get("median_ms") or {}  # JSON keys: candidates as text, shown in numeric order
    order = sorted(medians, key=lambda c: int(c) if c.lstrip("-").isdigit() else 0)

    def label(c: str) -> str:
        short = VALUE_MEANINGS.get((name, int(c)), ("", ""))[0] if c.lstrip("-").isdigit() else ""
        return f"{c} ({short})" if short else c

    return ("; medians " + ", ".join(f"{label(c)}: {medians[c]:g} ms" for c in order)) if medians else ""


def prepare_for_load(backend: str, E: int, H: int, I: int, k: int, *, threads: int | None = None,
                     folder: str | os.PathLike | None = None, calibrate: bool | None = None,
                     progress=None) -> str:
    """What a model load does before it packs: applies this CPU's and build's record; with none, runs the short
    calibration first (about ON_LOAD_SECONDS of timing on a synthetic layer of the model's shape) unless `calibrate`
    is False (None: calibrate_on_load(), i.e. TESSERA_TUNE_ON_LOAD). Returns one line for the load's log; a record
    that cannot be stored (read-only folder) is said there and the measured values are still used."""
    from tessera.engine import calibrate as cal
    from tessera.engine.events import ProgressEvent

    def say(text: str) -> None:
        if progress is not None:
            progress(ProgressEvent("tune", 0, 1, text))

    record, message = load(folder)
    if record is not None and record.get("backend") != backend:  # its knobs were timed on another backend's kernels
        message = (f"tuning record {record_path(folder)} was measured on {record.get('backend')}, this load runs "
                   f"{backend}: defaults used (tessera-cli tune --backend {backend} measures it)")
        record, calibrate = None, False
    wanted = calibrate if calibrate is not None else calibrate_on_load(H, I)
    if record is None and wanted and backend != "Torch":
        say((message + "; " if message else "") + f"calibrating the kernels for this CPU (~{ON_LOAD_SECONDS:g} s, "
            f"once; {ON_LOAD_ENV}=0 skips it)")
        record = cal.run(backend, E, H, I, k, threads=threads, seconds=ON_LOAD_SECONDS, rounds=3, on_load=True,
                         progress=say)
        try:
            save(record, folder)
            message = f"kernels calibrated in {record['seconds']:.1f} s and stored"
        except OSError as e:
            message = f"kernels calibrated in {record['seconds']:.1f} s; not stored ({e})"
    elif record is not None:
        message = f"kernel tuning measured {record['measured_at']} applied"
    elif not message:
        message = "kernels not calibrated on this CPU yet: defaults used (tessera-cli tune)"
        if calibrate is None and not wanted and calibrate_on_load():
            message += "; this model's experts are too small to calibrate on"
    knobs = apply(record)
    line = message + ": " + ", ".join(f"{n} {k['value']} ({k['source']})" for n, k in knobs.items())
    say(line)
    return line
