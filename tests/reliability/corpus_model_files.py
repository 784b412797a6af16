"""Mutations of a tiny model (issue 13 items 6, 8, 9, 10): GGUF headers that lie, NaN/Inf/overflowing weights, hostile
tensor names, HF folders with duplicate keys, huge numbers, deep nesting, FIFOs, mixed dtypes and damaged merges, and
hostile command lines. Run by test_model_files_probe.py in a child process; a case is right when it ends in a named
error that says what is wrong, or (where marked) when it works."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from probe import Case, corpus_main

from tessera import engine
from tessera.engine.errors import TesseraError
from tessera.engine.gguf_reader import open_gguf
from tessera.engine.make_model import make_model
from tessera.engine.sampling import SamplingParams

WORK = Path(tempfile.mkdtemp(prefix="tessera-model-probe-"))
GGUF = make_model(WORK / "base.gguf", fmt="gguf", dtype="f32", seed=0)
HF = make_model(WORK / "base-hf", fmt="hf", dtype="f32", seed=0)
CLI = [sys.executable, "-m", "tessera.engine"]


def copy_gguf(tag: str) -> Path:
    p = WORK / f"{tag}.gguf"
    shutil.copy(GGUF, p)
    return p


def copy_hf(tag: str) -> Path:
    p = WORK / f"hf-{tag}"
    shutil.rmtree(p, ignore_errors=True)
    shutil.copytree(HF, p)
    return p


def tensor_span(path: Path, name: str) -> tuple[int, int]:
    with open_gguf(path) as f:
        info = f.info(name)
        return info.offset, info.nbytes


def poke_f32(path: Path, name: str, index: int, value: float, count: int = 1) -> None:
    start, nbytes = tensor_span(path, name)
    assert (index + count) * 4 <= nbytes
    with open(path, "r+b") as f:
        f.seek(start + index * 4)
        f.write(np.full(count, value, dtype=np.float32).tobytes())


def run_greedy(path: Path, prompt: str = "Hello world, this is a test", backend: str = "Torch") -> str:
    session = engine.load(path, backend=backend, threads=1)
    try:
        ids = session.tokenizer.encode(prompt)
        events = list(session.generate(ids, SamplingParams(temperature=0.0, max_tokens=6)))
        return events[-1].text
    finally:
        session.close()


def named(run, *words: str) -> Case:
    return Case(run, named_must_mention=words)


# ---- GGUF headers that lie -------------------------------------------------------------------------------------------


def tensor_count_one_too_low() -> bool:
    p = copy_gguf("count-low")
    with open(p, "r+b") as f:
        f.seek(8)
        (count,) = struct.unpack("<Q", f.read(8))
        f.seek(8)
        f.write(struct.pack("<Q", count - 1))
    run_greedy(p)
    return False  # loaded with every tensor shifted


def tensor_count_one_too_high() -> bool:
    p = copy_gguf("count-high")
    with open(p, "r+b") as f:
        f.seek(8)
        (count,) = struct.unpack("<Q", f.read(8))
        f.seek(8)
        f.write(struct.pack("<Q", count + 1))
    run_greedy(p)
    return False


def trailing_garbage() -> bool:
    p = copy_gguf("trailing")
    with open(p, "ab") as f:
        f.write(os.urandom(4096))
    run_greedy(p)
    return False


# ---- NaN, Inf, overflow ----------------------------------------------------------------------------------------------


def nan_in_an_expert() -> bool:
    p = copy_gguf("nan-expert")
    with open_gguf(p) as f:
        E, I, H = f.info("blk.1.ffn_up_exps.weight").shape
    poke_f32(p, "blk.1.ffn_up_exps.weight", 0, float("nan"), count=E * I * H)  # every expert of the layer
    run_greedy(p)
    return False  # generated from NaN


def nan_in_an_expert_native() -> bool:
    """Through a native backend (the packed copy is what runs; the source tensor is what gets named)."""
    from tessera.engine.errors import BackendUnavailableError

    p = copy_gguf("nan-expert-native")
    with open_gguf(p) as f:
        E, I, H = f.info("blk.0.ffn_down_exps.weight").shape
    poke_f32(p, "blk.0.ffn_down_exps.weight", 0, float("inf"), count=E * I * H)
    try:
        run_greedy(p, backend="Reference")
    except BackendUnavailableError:
        run_greedy(p)
    return False


def inf_in_attention() -> bool:
    p = copy_gguf("inf-attn")
    poke_f32(p, "blk.0.attn_q.weight", 5, float("inf"))
    run_greedy(p)
    return False


def nan_embedding() -> bool:
    p = copy_gguf("nan-embd")
    _, nbytes = tensor_span(p, "token_embd.weight")
    poke_f32(p, "token_embd.weight", 0, float("nan"), count=nbytes // 4)
    run_greedy(p)
    return False


def overflowing_norm() -> bool:
    p = copy_gguf("overflow")
    _, nbytes = tensor_span(p, "blk.0.attn_norm.weight")
    poke_f32(p, "blk.0.attn_norm.weight", 0, 3e38, count=nbytes // 4)
    run_greedy(p)
    return False


# ---- HF folders ------------------------------------------------------------------------------------------------------


def config_edit(tag: str, edit) -> Path:
    p = copy_hf(tag)
    cfg = (p / "config.json").read_text()
    (p / "config.json").write_text(edit(cfg))
    return p


def huge_int_in_config() -> bool:
    p = config_edit("huge-int", lambda s: s.replace('"hidden_size": ', '"hidden_size": ' + "9" * 5000 + ", \"x\": "))
    run_greedy(p)
    return False


def deep_json_in_config() -> bool:
    p = config_edit("deep", lambda s: s[:-1].rstrip().rstrip("}") + ', "deep": ' + "[" * 100000 + "]" * 100000 + "}")
    run_greedy(p)
    return False


def duplicate_key_in_safetensors_header() -> bool:
    p = copy_hf("dup-key")
    shard = next(p.glob("*.safetensors"))
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].decode()
    name = next(k for k in json.loads(header) if k != "__metadata__")
    entry = json.dumps(json.loads(header)[name])
    dup = header.replace("{", "{" + json.dumps(name) + ": " + entry + ", ", 1)
    dup = dup + " " * ((8 - len(dup) % 8) % 8)
    shard.write_bytes(len(dup).to_bytes(8, "little") + dup.encode() + raw[8 + n :])
    run_greedy(p)
    return False


def fifo_in_folder() -> bool:
    p = copy_hf("fifo")
    (p / "model.safetensors").unlink()
    os.mkfifo(p / "model.safetensors")
    run_greedy(p)  # a blocking open would hang here: the harness's alarm calls it a hang
    return False


def fifo_config() -> bool:
    p = copy_hf("fifo-config")
    (p / "config.json").unlink()
    os.mkfifo(p / "config.json")
    run_greedy(p)
    return False


def damaged_merges() -> bool:
    p = copy_hf("merges")
    tok = json.loads((p / "tokenizer.json").read_text())
    merges = tok["model"]["merges"]
    merges[: len(merges) // 2] = ["\u0120 \u0120 \u0120 x"] * (len(merges) // 2) if merges and isinstance(
        merges[0], str) else [["\u0120", "\u0120", "x"]] * (len(merges) // 2)
    (p / "tokenizer.json").write_text(json.dumps(tok))
    run_greedy(p)
    return False


def mixed_dtypes_in_one_expert() -> bool:
    import torch
    from safetensors.torch import load_file, save_file

    p = copy_hf("mixed")
    for shard in p.glob("*.safetensors"):
        t = load_file(shard)
        for name in list(t):
            if ".mlp.experts.0.up_proj" in name:
                t[name] = t[name].to(torch.bfloat16)
            elif ".mlp.experts.0.down_proj" in name:
                t[name] = t[name].to(torch.float16)
        save_file(t, shard, metadata={"format": "pt"})
    run_greedy(p)
    return True  # either it works (each expert widened) or it is a named error


# ---- command lines ---------------------------------------------------------------------------------------------------


def cli(*args: str | bytes, timeout: float = 120, address_space: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:
        if address_space is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([*CLI, *args], capture_output=True, timeout=timeout, env={**os.environ}, preexec_fn=limit)


def expect_cli_named(*args, words: tuple[str, ...] = (), address_space: int | None = None) -> bool:
    r = cli(*args, address_space=address_space)
    err = r.stderr.decode("utf-8", "replace")
    if r.returncode == 0 or "Traceback" in err or not err.startswith("error: "):
        raise AssertionError(f"exit {r.returncode}: {err[-600:]}")
    if b"\x1b" in r.stderr or b"\x1b" in r.stdout:
        raise AssertionError(f"raw escape sequence reached the terminal: {r.stderr[-300:]!r}")
    missing = [w for w in words if w.lower() not in err.lower()]
    if missing:
        raise AssertionError(f"the error does not say {missing}: {err}")
    raise TesseraError("cli", err.strip())


def escape_in_tensor_name() -> bool:
    p = copy_gguf("escape-name")
    raw = bytearray(p.read_bytes())
    old = b"blk.0.attn_q.weight"
    new = b"blk.0.\x1b]0;p\x07.weight"
    assert len(new) == len(old)
    i = raw.index(old)
    raw[i : i + len(old)] = new
    p.write_bytes(bytes(raw))
    return expect_cli_named("generate", str(p), "--prompt", "hi", "--max-tokens", "2", words=("\\x1b",))


def threads_100000() -> bool:
    return expect_cli_named("generate", str(GGUF), "--prompt", "hi", "--max-tokens", "2", "--threads", "100000",
                            words=("--threads",))


def invalid_utf8_prompt() -> bool:
    return expect_cli_named("generate", str(GGUF), "--prompt", b"caf\xe9 \xff", "--max-tokens", "2",
                            words=("--prompt", "UTF-8"))


def ulimit_v(kib: int):
    def run() -> bool:
        return expect_cli_named("generate", str(GGUF), "--prompt", "hi", "--max-tokens", "2",
                                words=("ulimit",), address_space=kib * 1024)

    return run


def cases() -> dict[str, Case]:
    return {
        "gguf/tensor_count_one_too_low": named(tensor_count_one_too_low, "tensor_count"),
        "gguf/tensor_count_one_too_high": named(tensor_count_one_too_high),
        "gguf/trailing_garbage": named(trailing_garbage, "belong to no tensor"),
        "weights/nan_in_an_expert": named(nan_in_an_expert, "up_proj", "expert"),
        "weights/inf_in_an_expert_native": named(nan_in_an_expert_native, "down_proj", "expert"),
        "weights/inf_in_attention": named(inf_in_attention, "q_proj"),
        "weights/nan_embedding": named(nan_embedding, "embed_tokens"),
        "weights/overflowing_norm": named(overflowing_norm, "layer"),
        "hf/huge_int_in_config": named(huge_int_in_config, "config.json"),
        "hf/deep_json_in_config": named(deep_json_in_config, "config.json"),
        "hf/duplicate_key_in_safetensors_header": named(duplicate_key_in_safetensors_header, "twice"),
        "hf/fifo_shard": Case(fifo_in_folder, seconds=30, named_must_mention=("not a regular file",)),
        "hf/fifo_config": Case(fifo_config, seconds=30, named_must_mention=("not a regular file",)),
        "hf/damaged_merges": named(damaged_merges, "tokenizer.json"),
        "hf/mixed_dtypes_in_one_expert": named(mixed_dtypes_in_one_expert),
        "cli/escape_in_tensor_name": named(escape_in_tensor_name),
        "cli/threads_100000": named(threads_100000),
        "cli/invalid_utf8_prompt": named(invalid_utf8_prompt),
        "cli/ulimit_v_300MB": named(ulimit_v(300_000)),
        "cli/ulimit_v_700MB": named(ulimit_v(700_000)),
    }


if __name__ == "__main__":
    corpus_main(cases, WORK)
