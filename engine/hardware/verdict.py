"""The verdict: which backends can run and which one Auto picks, whether a model fits, the bandwidth roofline for
decode speed, and remedies in plain words for what looks wrong.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from engine.errors import TesseraError
from engine.hardware.presets import BYTES_PER_WEIGHT, MoeShape, preset, shape_from_hf_config

GB = 1e9
BACKENDS = ("AMXInt8", "AMXBF16", "AVX512", "AVX512Int8", "AVX2", "Reference")
# Format of the routed-expert weights in RAM per backend (DESIGN §3); None = as loaded.
EXPERT_FORMAT = {"AMXInt8": "int8", "AMXBF16": "bf16", "AVX512": "bf16", "AVX512Int8": "int8", "AVX2": "bf16",
                 "Reference": None, "Torch": None}
RAM_HEADROOM = 0.9  # plan to use at most this share of available RAM / free VRAM (KV cache, activations, the OS)


def predicted_backend(name: str, flags: dict[str, bool], amx_usable: bool, amx_reason: str) -> tuple[bool, str]:
    """What the CPU flags alone say about a backend (DESIGN §3 'needs' column). (available, reason)."""
    need = {
        "AMXInt8": ("amx_tile", "amx_int8"), "AMXBF16": ("amx_tile", "amx_bf16"),
        "AVX512": ("avx512f", "avx512bw", "avx512vl"), "AVX512Int8": ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
        "AVX2": ("avx2", "fma"), "Reference": (),
    }[name]
    missing = [f for f in need if not flags.get(f)]
    if missing:
        return False, f"CPU lacks {', '.join(missing)}"
    if name.startswith("AMX") and not amx_usable:
        return False, amx_reason
    return True, "supported by this CPU"


def backends(cpu: dict) -> tuple[dict[str, dict], str, str, str]:
    """({name: {available, reason}}, auto pick, auto reason, source) from engine.native, else predicted from CPUID."""
    try:
        from engine import native  # optional until the native module is built
        status_fn, auto_fn = native.backend_status, native.auto_backend
    except (ImportError, AttributeError):
        why = "native module not built (engine.native has no backend_status)"
        out = {}
        for name in BACKENDS:
            ok, reason = predicted_backend(name, cpu["flags"], cpu["amx"]["usable"], cpu["amx"]["reason"])
            out[name] = {"available": False,
                         "reason": f"{why}; this CPU would {'support it' if ok else 'not support it: ' + reason}"}
        out["Torch"] = {"available": True, "reason": "pure-torch experts: always available, slowest"}
        return out, "Torch", "no native backend is built, so Auto falls back to the pure-torch experts", "predicted"
    out = {name: {"available": bool(ok), "reason": str(reason)} for name, (ok, reason) in status_fn().items()
           if name != "Auto"}
    out.setdefault("Torch", {"available": True, "reason": "pure-torch experts: always available, slowest"})
    auto, auto_reason = auto_fn()
    return out, str(auto), str(auto_reason), "native"


def model_shape(model: str | None, preset_name: str | None) -> tuple[MoeShape, str]:
    """(shape, dtype of the stored weights) for --model PATH or --preset NAME."""
    if preset_name:
        return preset(preset_name), "bf16"
    path = Path(model)
    if not path.exists():
        raise TesseraError(str(path), "no such file or folder")
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise TesseraError(str(path), "not a Hugging Face model folder (config.json missing)")
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise TesseraError(str(cfg_path), f"unreadable config.json: {e}") from e
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        return shape_from_hf_config(cfg, path.name), {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(
            dtype, "bf16")
    return _gguf_shape(path)


def _gguf_shape(path: Path) -> tuple[MoeShape, str]:
    """Shape and dominant expert type from a GGUF header (the gguf package reads the header; no weights are loaded)."""
    try:
        import gguf
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as e:  # any parse failure is a user-facing file problem
        raise TesseraError(str(path), f"not a readable GGUF file: {e}") from e

    def field(key: str, default=None):
        f = reader.fields.get(key)
        if f is None:
            if default is None:
                raise TesseraError(f"{path}: key {key}", "missing from the GGUF metadata")
            return default
        return f.contents()

    arch = field("general.architecture")
    if arch != "qwen3moe":
        raise TesseraError(str(path), f"architecture is {arch!r}, Tessera runs qwen3moe")
    vocab = len(field("tokenizer.ggml.tokens", []) or []) or int(field(f"{arch}.vocab_size", 0))
    names = {t.name for t in reader.tensors}
    expert_types = {t.tensor_type.name.lower() for t in reader.tensors if "_exps" in t.name}
    dtype = expert_types.pop() if len(expert_types) == 1 else "bf16"
    layers = int(field(f"{arch}.block_count"))
    heads = int(field(f"{arch}.attention.head_count"))
    hidden = int(field(f"{arch}.embedding_length"))
    shape = MoeShape(
        path.name, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=int(field(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(field(f"{arch}.attention.key_length", hidden // heads)),
        moe_intermediate_size=int(field(f"{arch}.expert_feed_forward_length")),
        num_experts=int(field(f"{arch}.expert_count")), num_experts_per_tok=int(field(f"{arch}.expert_used_count")),
        vocab_size=vocab, tie_word_embeddings="output.weight" not in names,
        dense_layers=sum(1 for i in range(layers) if f"blk.{i}.ffn_gate_exps.weight" not in names),
        intermediate_size=int(field(f"{arch}.feed_forward_length", 0)))
    return shape, (dtype if dtype in BYTES_PER_WEIGHT else "bf16")


def estimate(shape: MoeShape, stored: str, *, auto: str, memory: dict, gpus: list[dict]) -> dict:
    """Fit in RAM/VRAM and the decode roofline for the backend Auto picked."""
    expert_fmt = EXPERT_FORMAT.get(auto) or stored
    dense_bytes = shape.dense_params() * BYTES_PER_WEIGHT[stored]
    expert_bytes = shape.expert_params() * BYTES_PER_WEIGHT[expert_fmt]
    active = shape.active_expert_params() * BYTES_PER_WEIGHT[expert_fmt]
    # Per token the CPU also reads the non-expert weights when there is no GPU (all but the embedding table's rows).
    dense_per_token = (shape.dense_params() - shape.vocab_size * shape.hidden_size) * BYTES_PER_WEIGHT[stored]
    gpu = max(gpus, key=lambda g: g["vram_free_gb"]) if gpus else None
    ram_need = expert_bytes + (0 if gpu else dense_bytes)
    bw = memory["read_bandwidth_gbs"] * GB
    out = {
        "name": shape.name,
        "total_params": shape.dense_params() + shape.expert_params(),
        "active_params": shape.dense_params() - shape.vocab_size * shape.hidden_size + shape.active_expert_params(),
        "ram_needed_bytes": int(ram_need),
        "active_expert_bytes_per_token": int(active),
        "total_params_b": round((shape.dense_params() + shape.expert_params()) / 1e9, 2),
        "active_params_b": round((shape.dense_params() - shape.vocab_size * shape.hidden_size
                                  + shape.active_expert_params()) / 1e9, 2),
        "stored_dtype": stored,
        "expert_format": expert_fmt,
        "backend": auto,
        "ram_needed_gb": round(ram_need / GB, 2),
        "ram_available_gb": memory["available_gb"],
        "fits_ram": ram_need <= RAM_HEADROOM * memory["available_gb"] * GB,
        "placement": (f"experts in RAM on the CPU, the rest on {gpu['name']}" if gpu
                      else "everything on the CPU (no CUDA device)"),
        "active_expert_gb_per_token": round(active / GB, 3),
        "decode_tok_s_upper_bound": round(bw / active, 2) if bw > 0 else 0.0,
        "roofline": "upper bound = measured read bandwidth / routed-expert bytes read per token",
    }
    if gpu:
        out["vram_needed_gb"] = round(dense_bytes / GB, 2)
        out["vram_free_gb"] = gpu["vram_free_gb"]
        out["fits_vram"] = dense_bytes <= RAM_HEADROOM * gpu["vram_free_gb"] * GB
    else:
        out["decode_tok_s_upper_bound_cpu_only"] = round(bw / (active + dense_per_token), 2) if bw > 0 else 0.0
    return out


_AMX_GENERATION = re.compile(r"Xeon.*\b(\d[4-9]\d\d[A-Z+]*|w[3579]-[23][4-9]\d\d)", re.IGNORECASE)


def remedies(report: dict) -> list[dict]:
    """What looks wrong, in plain words: [{topic, problem, remedy}]."""
    out = []
    cpu, mem = report["cpu"], report["memory"]

    def add(topic: str, problem: str, remedy: str) -> None:
        out.append({"topic": topic, "problem": problem, "remedy": remedy})

    reason = cpu["amx"]["reason"]
    if cpu["flags"].get("amx_tile") and not cpu["amx"]["usable"]:
        if "too old" in reason or "XCR0" in reason:
            add("AMX", f"The CPU has AMX but it cannot be used: {reason}.",
                "Update to Linux 5.16 or newer (a distribution kernel from 2022 on) and remove any option that disables "
                "AMX from the kernel command line; Tessera uses AVX-512 meanwhile.")
        else:
            add("AMX", f"The CPU has AMX but Linux refused it to this process: {reason}.",
                "Check for a sandbox or seccomp profile that blocks arch_prctl; Tessera uses AVX-512 meanwhile.")
    elif not cpu["flags"].get("amx_tile") and cpu.get("vendor") == "GenuineIntel" and _AMX_GENERATION.search(
            cpu["model"]):
        add("AMX", "This Xeon generation normally has AMX, but the CPU does not report it.",
            "Enable AMX in the BIOS/UEFI setup (often under Processor > Advanced), or ask the hypervisor to pass it "
            "through to this virtual machine.")
    multi, single = mem["read_bandwidth_gbs"], mem["read_bandwidth_1t_gbs"]
    cores = cpu["physical_cores"]
    dimms, peak = mem.get("dimms") or [], mem.get("theoretical_gbs")
    slow = [d for d in dimms if d["rated_mts"] and d["configured_mts"] and d["configured_mts"] < 0.95 * d["rated_mts"]]
    if slow:
        d = slow[0]
        add("Memory speed", f"{len(slow)} memory module(s) run at {d['configured_mts']} MT/s although rated for "
            f"{d['rated_mts']} MT/s.", "Enable the XMP/EXPO memory profile in the BIOS (or set the rated speed): "
            "decode speed follows memory bandwidth.")
    if peak and cores >= 4 and multi < 0.3 * peak:
        add("Memory bandwidth", f"All cores together read {multi:.0f} GB/s, under a third of the {peak:.0f} GB/s that "
            f"{len(dimms)} module(s) give at one module per channel.",
            "Check that the modules sit in different channels (the board manual's slot order, matched pairs), that "
            "the XMP/EXPO profile is on, and that other programs are not busy.")
    elif not peak and cores >= 4 and single > 0 and multi < 1.5 * single:
        add("Memory bandwidth", f"All cores together read only {multi:.0f} GB/s, about what one core reads "
            f"({single:.0f} GB/s).",
            "Decode speed follows memory bandwidth: populate every memory channel (one DIMM per channel, matched "
            "pairs), enable the XMP/EXPO memory profile in the BIOS, and check that other programs are not busy.")
    if cpu.get("allowed_cpus", cores) < cpu["logical_cores"]:
        add("Threads", f"This process may use only {cpu['allowed_cpus']} of {cpu['logical_cores']} CPUs "
            "(CPU affinity or a container limit).",
            "Start Tessera without taskset/cgroup CPU limits, or set threads to the CPUs it may use.")
    if mem.get("bandwidth_threads", cores) < cores:
        add("Threads", f"The probe used {mem['bandwidth_threads']} threads on a CPU with {cores} physical cores.",
            "Set threads to the number of physical cores in Settings (the default) for full bandwidth.")
    if mem.get("thp_enabled") == "never":
        add("Huge pages", "Transparent huge pages are off.",
            "Set them to 'madvise' (echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled): large "
            "weight buffers then need fewer TLB misses.")
    m = report.get("model")
    if m and not m["fits_ram"]:
        add("Model size", f"{m['name']} needs about {m['ram_needed_gb']:.0f} GB of RAM, {m['ram_available_gb']:.0f} GB "
            "is available.", "Close other programs, add RAM, or convert the model to Q8_0 (half the bytes of BF16).")
    if m and m.get("fits_vram") is False:
        add("GPU memory", f"The non-expert weights need about {m['vram_needed_gb']:.1f} GB of VRAM, "
            f"{m['vram_free_gb']:.1f} GB is free.", "Close other GPU programs, or run attention on the CPU too.")
    return out
