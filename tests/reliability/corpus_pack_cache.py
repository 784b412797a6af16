"""Hostile states of the packed-weight cache (issue 13 items 1, 2, 4; issue 12 item 5), run by test_pack_cache_probe.py
in a child process. Every case loads through engine.native.make_backend and compares the expert outputs bit for bit
with a fresh pack of the same weights: damaged files must be repacked (with a notice), never computed with."""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import tempfile
from pathlib import Path

import torch
from probe import Case, Tmpfs, can_mount, corpus_main

import tessera.engine.native as N
from tessera.engine.backends import auto
from tessera.engine.experts import LayerExperts
from tessera.engine.pack_cache import PackCache

E, H, I = 6, 64, 32
WORK = Path(tempfile.gettempdir()) / f"tessera-pack-probe-{os.getpid()}"  # made by cases(); removed by corpus_main
BACKENDS = ["Reference"] + ([auto()[0]] if auto()[0] not in ("Torch", "Reference") else [])


def layer(seed: int) -> LayerExperts:
    g = torch.Generator().manual_seed(seed)

    def w(*shape):  # [E, rows, cols] bf16
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16)

    return LayerExperts(gate_proj=w(E, I, H), up_proj=w(E, I, H), down_proj=w(E, H, I))


MODEL_A = {0: layer(1), 1: layer(2)}
MODEL_B = {0: layer(11), 1: layer(12)}


def inputs(T=5, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g), torch.randint(0, E, (T, k), generator=g), torch.rand(T, k, generator=g)


def outputs(backend) -> list[torch.Tensor]:
    x, ids, w = inputs()
    return [backend.forward(n, x, ids, w) for n in sorted(backend.layers)]


_REFERENCE: dict = {}


def reference(name: str, layers: dict) -> list[torch.Tensor]:
    """Outputs of a fresh pack without any cache."""
    key = (name, id(layers))
    if key not in _REFERENCE:
        _REFERENCE[key] = outputs(N.make_backend(name, layers, threads=1))
    return _REFERENCE[key]


def load(name: str, layers: dict, root: Path, model: str = "/models/a.gguf"):
    return N.make_backend(name, layers, threads=1, cache_dir=root, model_id=model)


def same(name: str, layers: dict, backend) -> bool:
    return all(torch.equal(a, b) for a, b in zip(outputs(backend), reference(name, layers), strict=True))


def fresh_root(tag: str) -> Path:
    root = WORK / tag
    shutil.rmtree(root, ignore_errors=True)
    return root


def layer_files(root: Path) -> list[Path]:
    return sorted((root / "layers").glob("*.pack"))


def damage_case(name: str, damage) -> Case:
    """Warm the cache, damage every layer file, load again: both layers repacked, a notice each, right outputs; the
    load after that is warm again (the damaged files were replaced)."""

    def run() -> bool:
        root = fresh_root(f"damage-{name}-{damage.__name__}")
        load(name, MODEL_A, root)
        files = layer_files(root)
        assert len(files) == 2, files
        for f in files:
            damage(f)
        again = load(name, MODEL_A, root)
        st = again.load_stats
        repaired = load(name, MODEL_A, root).load_stats
        return (st.packed_layers == 2 and len(st.notices) == 2 and same(name, MODEL_A, again)
                and repaired.cached_layers == 2)

    return Case(run, must_succeed=True)


def flip_64_blob_bytes(f: Path) -> None:
    data = bytearray(f.read_bytes())
    rng = random.Random(f.name)
    for pos in rng.sample(range(128, len(data)), 64):
        data[pos] ^= 0xFF
    f.write_bytes(bytes(data))


def flip_one_header_byte(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[20] ^= 0x01  # the blob length
    f.write_bytes(bytes(data))


def flip_one_blob_bit(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))


def truncate_half(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def append_bytes(f: Path) -> None:
    f.write_bytes(f.read_bytes() + b"\0" * 4096)


def empty(f: Path) -> None:
    f.write_bytes(b"")


def garbage(f: Path) -> None:
    f.write_bytes(os.urandom(f.stat().st_size))


def legacy_format(f: Path) -> None:  # what format 1 stored: the bare native blob, no checksum
    f.write_bytes(f.read_bytes()[128:])


def swap_layers(root: Path) -> None:
    a, b = layer_files(root)
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


def case_swapped(name: str) -> Case:
    def run() -> bool:
        root = fresh_root(f"swap-{name}")
        load(name, MODEL_A, root)
        swap_layers(root)
        again = load(name, MODEL_A, root)
        return again.load_stats.packed_layers == 2 and same(name, MODEL_A, again)

    return Case(run, must_succeed=True)


def case_replaced_weights(name: str) -> Case:
    """Other weights of the same shapes under the same model path (cp -p, rsync -a): never the old packed bytes."""

    def run() -> bool:
        root = fresh_root(f"replaced-{name}")
        load(name, MODEL_A, root, model="/models/same.gguf")
        b = load(name, MODEL_B, root, model="/models/same.gguf")
        return b.load_stats.packed_layers == 2 and same(name, MODEL_B, b)

    return Case(run, must_succeed=True)


def case_one_changed_expert(name: str) -> Case:
    """A fine-tune that changed one row of one expert: that layer repacks, the other is reused."""

    def run() -> bool:
        root = fresh_root(f"one-expert-{name}")
        load(name, MODEL_A, root)
        changed = {0: MODEL_A[0], 1: LayerExperts(MODEL_A[1].gate_proj.clone(), MODEL_A[1].up_proj,
                                                  MODEL_A[1].down_proj)}
        changed[1].gate_proj[3, 7, 0] += 1.0
        b = load(name, changed, root)
        return b.load_stats.per_layer == {0: "cached", 1: "packed"} and same(name, changed, b)

    return Case(run, must_succeed=True)


def case_file_in_place(name: str) -> Case:
    def run() -> bool:
        root = fresh_root(f"file-{name}")
        root.parent.mkdir(parents=True, exist_ok=True)
        root.write_text("not a folder")
        b = load(name, MODEL_A, root)
        b2 = load(name, MODEL_A, root)
        ok = root.read_text() == "not a folder" and b.load_stats.packed_layers == 2 and same(name, MODEL_A, b)
        return ok and any("not a folder" in n for n in b.load_stats.notices) and same(name, MODEL_A, b2)

    return Case(run, must_succeed=True)


def case_readonly_disk(name: str) -> Case:
    """A read-only filesystem: loads without storing, said once; files already there are read only when verified."""

    def run() -> bool:
        root = fresh_root(f"ro-{name}")
        with Tmpfs(root, "4m") as fs:
            warm = load(name, MODEL_A, root)
            (layer_files(root)[0]).write_bytes(b"damaged")
            fs.readonly()
            b = load(name, MODEL_A, root)
            c = load(name, MODEL_B, root)
            said = [n for n in b.load_stats.notices if "cannot be written" in n]
            ok = (len(said) == 1 and sorted(b.load_stats.per_layer.values()) == ["cached", "packed"]
                  and same(name, MODEL_A, b) and same(name, MODEL_B, c) and same(name, MODEL_A, warm))
        return ok

    return Case(run, must_succeed=True)


def case_full_disk(name: str) -> Case:
    """A disk that fills while storing: the load completes with right outputs and says the cache could not store."""

    def run() -> bool:
        root = fresh_root(f"full-{name}")
        need = N.packed_nbytes(name, MODEL_A[0])
        os.environ["TESSERA_PACK_CACHE_BUDGET"] = "1G"  # the budget would refuse first; fill the disk instead
        try:
            if MOUNTS:
                with Tmpfs(root, str(need + need // 2)):  # room for one layer file, not two
                    b = load(name, MODEL_A, root)
                    ok = same(name, MODEL_A, b) and any("cannot store" in n for n in b.load_stats.notices)
                    again = load(name, MODEL_A, root)
                    return ok and same(name, MODEL_A, again) and again.load_stats.cached_layers <= 1
        finally:
            del os.environ["TESSERA_PACK_CACHE_BUDGET"]
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        prev = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (need // 2, old[1]))
        try:
            b = load(name, MODEL_A, root)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, prev)
        return same(name, MODEL_A, b) and any("cannot store" in n for n in b.load_stats.notices)

    return Case(run, must_succeed=True)


def case_budget_lru(name: str) -> Case:
    """A budget for one model: loading B evicts A (least recently used); a model over the budget is not stored."""

    def run() -> bool:
        root = fresh_root(f"budget-{name}")
        one_model = 2 * (N.packed_nbytes(name, MODEL_A[0]) + 128)
        os.environ["TESSERA_PACK_CACHE_BUDGET"] = str(one_model + 1024)
        try:
            load(name, MODEL_A, root, model="/models/a.gguf")
            b = load(name, MODEL_B, root, model="/models/b.gguf")
            models = [m.model for m in PackCache(root).models()]
            only_b = models == ["/models/b.gguf"] and len(layer_files(root)) == 2
            os.environ["TESSERA_PACK_CACHE_BUDGET"] = str(one_model // 2)
            c = load(name, MODEL_A, root, model="/models/a.gguf")
            not_stored = any("over the cache budget" in n for n in c.load_stats.notices)
            return only_b and not_stored and same(name, MODEL_B, b) and same(name, MODEL_A, c)
        finally:
            del os.environ["TESSERA_PACK_CACHE_BUDGET"]

    return Case(run, must_succeed=True)


def case_default_budget_keeps_two_models(name: str) -> Case:
    """Default budget = min(25 % of disk, 2 x the largest model): on a roomy disk a third model evicts the first."""

    def run() -> bool:
        root = fresh_root(f"default-budget-{name}")
        for tag, seed in (("a", 21), ("b", 31), ("c", 41)):
            load(name, {0: layer(seed), 1: layer(seed + 1)}, root, model=f"/models/{tag}.gguf")
        return [m.model for m in PackCache(root).models()] == ["/models/b.gguf", "/models/c.gguf"]

    return Case(run, must_succeed=True)


def case_killed_writer_leftovers(name: str) -> Case:
    def run() -> bool:
        root = fresh_root(f"leftover-{name}")
        load(name, MODEL_A, root)
        dead = root / "layers" / f"{'0' * 40}.pack.tmp999999999"
        dead.write_bytes(b"half a layer")
        load(name, MODEL_A, root)
        return not dead.exists()

    return Case(run, must_succeed=True)


def case_hostile_manifest(name: str) -> Case:
    def run() -> bool:
        root = fresh_root(f"manifest-{name}")
        load(name, MODEL_A, root)
        for i, text in enumerate(("[" * 100000, "{}", "not json", '{"model": 1, "keys": 5}')):
            (root / "models" / f"bad{i}.json").write_text(text)
        b = load(name, MODEL_A, root)
        return b.load_stats.cached_layers == 2 and same(name, MODEL_A, b)

    return Case(run, must_succeed=True)


MOUNTS = can_mount()


def cases() -> dict[str, Case]:
    WORK.mkdir(exist_ok=True)
    out: dict[str, Case] = {}
    for name in BACKENDS:
        for damage in (flip_64_blob_bytes, flip_one_header_byte, flip_one_blob_bit, truncate_half, append_bytes,
                       empty, garbage, legacy_format):
            out[f"{name}/{damage.__name__}"] = damage_case(name, damage)
        out[f"{name}/swapped_layers"] = case_swapped(name)
        out[f"{name}/replaced_weights_same_name"] = case_replaced_weights(name)
        out[f"{name}/one_changed_expert"] = case_one_changed_expert(name)
        out[f"{name}/file_in_place_of_folder"] = case_file_in_place(name)
        if MOUNTS:
            out[f"{name}/readonly_disk"] = case_readonly_disk(name)
        out[f"{name}/full_disk"] = case_full_disk(name)
        out[f"{name}/budget_lru"] = case_budget_lru(name)
        out[f"{name}/default_budget"] = case_default_budget_keeps_two_models(name)
        out[f"{name}/killed_writer_leftovers"] = case_killed_writer_leftovers(name)
        out[f"{name}/hostile_manifest"] = case_hostile_manifest(name)
    return out


if __name__ == "__main__":
    corpus_main(cases, WORK)
