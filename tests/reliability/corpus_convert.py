"""Hostile outputs for the converter (issue 13 items 3 and 8): over the source model, over unrelated files, through
links, on read-only and full disks, beside leftovers of a killed conversion. Run by test_convert_probe.py in a child.

A case is correct when the converter either writes a valid GGUF where it was allowed to or refuses with a named error,
and in both cases every source file and every unrelated file is byte for byte what it was."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import tempfile
from pathlib import Path

from probe import Case, Tmpfs, can_mount, corpus_main

from tessera.engine.convert import convert
from tessera.engine.errors import TesseraError
from tessera.engine.make_model import make_model

WORK = Path(tempfile.mkdtemp(prefix="tessera-convert-probe-"))
SRC = make_model(WORK / "src" / "model", fmt="hf", dtype="f32", seed=0)
MOUNTS = can_mount()


def digest_tree(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


SRC_DIGEST = digest_tree(SRC)


def source_intact() -> bool:
    return digest_tree(SRC) == SRC_DIGEST


def valid_gguf(path: Path) -> bool:
    import gguf

    return path.is_file() and len(gguf.GGUFReader(path).tensors) > 0


def refuses(out_of: callable, *, force: bool, mention: str) -> Case:
    """Converting to the path `out_of()` returns must be a named error mentioning `mention`, with the source and the
    path's old content intact."""

    def run() -> bool:
        out = out_of()
        before = out.read_bytes() if out.is_file() else None
        try:
            convert(SRC, out, dtype="bf16", force=force)
        except TesseraError as e:
            after = out.read_bytes() if out.is_file() else None
            if mention.lower() not in str(e).lower():
                raise AssertionError(f"the error does not say {mention!r}: {e}") from e
            return source_intact() and before == after and not list(out.parent.glob("*.partial"))
        return False  # wrote over it: silently wrong

    return Case(run)


def writes(out_of: callable, *, force: bool) -> Case:
    def run() -> bool:
        out = out_of()
        path = Path(convert(SRC, out, dtype="bf16", force=force))
        ok = valid_gguf(path) and not list(path.parent.glob(".*.partial"))
        if path.parent == SRC:
            path.unlink()  # the source folder is compared file by file afterwards
        return ok and source_intact()

    return Case(run, must_succeed=True)


def scratch(name: str) -> Path:
    d = WORK / "out" / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def notes() -> Path:
    p = scratch("notes") / "notes.txt"
    p.write_text("my notes, not a model")
    return p


def symlink_to_shard() -> Path:
    p = scratch("symlink") / "model.gguf"
    p.symlink_to(SRC / "model.safetensors")
    return p


def hardlink_to_shard() -> Path:
    p = scratch("hardlink") / "model.gguf"
    os.link(SRC / "model.safetensors", p)
    return p


def symlink_folder_into_source() -> Path:
    link = scratch("dirlink") / "alias"
    link.symlink_to(SRC, target_is_directory=True)
    return link / "config.json"


def existing_gguf() -> Path:
    p = scratch("existing") / "model.gguf"
    p.write_bytes(b"an older conversion")
    return p


def leftovers() -> Path:
    d = scratch("leftovers")
    (d / ".model.gguf.999999999.partial").write_bytes(b"killed half-way")
    return d / "model.gguf"


def case_sweeps_dead_partials() -> Case:
    def run() -> bool:
        out = leftovers()
        live = out.parent / f".model.gguf.{os.getppid()}.partial"  # a live process's: kept
        live.write_bytes(b"still being written")
        convert(SRC, out, dtype="bf16")
        left = sorted(p.name for p in out.parent.iterdir())
        return left == sorted([out.name, live.name]) and valid_gguf(out)

    return Case(run, must_succeed=True)


def case_readonly_disk() -> Case:
    def run() -> bool:
        d = scratch("ro")
        with Tmpfs(d, "128m") as fs:  # room for the free-space check; writing is what fails
            fs.readonly()
            try:
                convert(SRC, d / "model.gguf", dtype="bf16")
            except TesseraError as e:
                if "cannot write" not in str(e) and "read-only" not in str(e).lower():
                    raise AssertionError(f"unclear: {e}") from e
                return source_intact()
        return False

    return Case(run, named_must_mention=(str(WORK),))


def case_full_disk_before() -> Case:
    def run() -> bool:
        d = scratch("full")
        with Tmpfs(d, "256k"):
            try:
                convert(SRC, d / "model.gguf", dtype="bf16")
            finally:
                leftover = list(d.iterdir())
            return not leftover and source_intact()

    return Case(run, named_must_mention=("space",))


def case_disk_fills_mid_write() -> Case:
    """The free-space check passes, then writing fails (a quota, another writer, ulimit -f): a named error, no
    partial file left, the source intact."""

    def run() -> bool:
        d = scratch("fills")
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        prev = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, old[1]))
        try:
            convert(SRC, d / "model.gguf", dtype="bf16")
        except TesseraError:
            if list(d.iterdir()) or not source_intact():
                return False
            raise
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, prev)
        return False  # a complete file cannot fit under the limit

    return Case(run, named_must_mention=("disk full",))


def cases() -> dict[str, Case]:
    out = {
        "over_the_source_shard": refuses(lambda: SRC / "model.safetensors", force=False, mention="model being"),
        "over_the_source_shard_forced": refuses(lambda: SRC / "model.safetensors", force=True, mention="model being"),
        "over_the_source_config_forced": refuses(lambda: SRC / "config.json", force=True, mention="model being"),
        "onto_the_source_folder": refuses(lambda: SRC, force=True, mention="folder"),
        "symlink_to_a_source_shard": refuses(symlink_to_shard, force=True, mention="model being"),
        "hard_link_to_a_source_shard": refuses(hardlink_to_shard, force=True, mention="model being"),
        "through_a_folder_symlink_into_the_source": refuses(symlink_folder_into_source, force=True,
                                                            mention="model being"),
        "over_unrelated_notes": refuses(notes, force=False, mention="--force"),
        "over_an_older_gguf_without_force": refuses(existing_gguf, force=False, mention="--force"),
        "over_an_older_gguf_with_force": writes(existing_gguf, force=True),
        "new_file_in_the_source_folder": writes(lambda: SRC / "converted.gguf", force=False),
        "sweeps_partials_of_a_killed_conversion": case_sweeps_dead_partials(),
        "disk_fills_mid_write": case_disk_fills_mid_write(),
    }
    if MOUNTS:
        out["read_only_disk"] = case_readonly_disk()
        out["full_disk"] = case_full_disk_before()
    return out


if __name__ == "__main__":
    corpus_main(cases, WORK)
