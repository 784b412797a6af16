"""engine.native.make_backend: the ExpertBackend the model calls, its async submit/sync, and the packed-weight disk
cache (engine.pack_cache: keyed by content and packing parameters; cold packs and stores, warm reads verified files)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from native_cases import native_backends, nmse, random_layer

import tessera.engine.backends as B
import tessera.engine.native as N
from tessera.engine.errors import BackendUnavailableError
from tessera.engine.experts import ExpertBackend, TorchExperts

LAYERS = {1: random_layer(6, 40, 24, seed=1), 3: random_layer(6, 40, 24, seed=3)}


def inputs(T=5, k=2, E=6, H=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g), torch.randint(0, E, (T, k), generator=g), torch.rand(T, k, generator=g)


@pytest.mark.parametrize("name", ["Reference"] + native_backends())
def test_make_backend_is_an_expert_backend_close_to_torch(name):
    b = N.make_backend(name, LAYERS, threads=2)
    assert isinstance(b, ExpertBackend) and b.name == name and b.reason
    ref = TorchExperts(LAYERS)
    for layer in LAYERS:
        x, ids, w = inputs(seed=layer)
        assert nmse(b.forward(layer, x, ids, w), ref.forward(layer, x, ids, w)) < 1e-3


def test_auto_resolves_to_the_best_available_non_emulated_backend():
    b = N.make_backend("Auto", LAYERS, threads=1)
    assert b.name == B.auto()[0]
    assert not next(x for x in B.compiled() if x["name"] == b.name)["emulated"]


def test_torch_name_gives_the_pure_torch_experts():
    assert isinstance(N.make_backend("Torch", LAYERS), TorchExperts)


def test_unavailable_backend_by_name_raises_and_names_it():
    missing = [n for n, (ok, _) in B.status().items() if not ok]
    if not missing:
        pytest.skip("every backend runs here")
    with pytest.raises(BackendUnavailableError, match=f"backend {missing[0]}: "):
        N.make_backend(missing[0], LAYERS)


def test_submit_then_sync_equals_forward():
    b = N.make_backend("Reference", LAYERS, threads=2)
    x, ids, w = inputs(T=7)
    want = b.forward(1, x, ids, w)
    b.submit(1, x, ids, w)
    with pytest.raises(RuntimeError, match="sync"):
        b.submit(1, x, ids, w)
    assert torch.equal(b.sync(), want)


def test_disk_cache_cold_then_warm(tmp_path):
    name = B.auto()[0]
    events = []
    cold = N.make_backend(name, LAYERS, threads=2, cache_dir=tmp_path, model_id="/m/model.gguf:123:456",
                          progress=events.append)
    assert cold.load_stats.packed_layers == 2 and cold.load_stats.cached_layers == 0
    assert [(e.done, e.total) for e in events] == [(1, 2), (2, 2)]
    files = sorted((tmp_path / "layers").glob("*.pack"))
    assert len(files) == 2
    warm = N.make_backend(name, LAYERS, threads=2, cache_dir=tmp_path, model_id="/m/model.gguf:123:456")
    assert warm.load_stats.cached_layers == 2 and warm.load_stats.packed_layers == 0
    # A cached pack is used in place from a map of its file (one copy, the page cache's), not read into a buffer.
    for layer in warm.layers.values():
        assert isinstance(layer.blob, np.memmap) and layer.blob.ctypes.data % 64 == 0
        assert Path(layer.blob.filename).parent == tmp_path / "layers"
    for layer in cold.layers.values():
        assert not isinstance(layer.blob, np.memmap)
    x, ids, w = inputs()
    assert torch.equal(warm.forward(3, x, ids, w), cold.forward(3, x, ids, w))
    # The key is the content: another model path with the same weights shares the files; a corrupt file is repacked
    # with a notice, never trusted (tests/reliability/corpus_pack_cache.py has the full corpus).
    other = N.make_backend(name, LAYERS, threads=1, cache_dir=tmp_path, model_id="/m/other.gguf:1:2")
    assert other.load_stats.cached_layers == 2
    files[0].write_bytes(b"garbage" * 100)
    again = N.make_backend(name, LAYERS, threads=1, cache_dir=tmp_path, model_id="/m/model.gguf:123:456")
    assert again.load_stats.packed_layers == 1 and again.load_stats.cached_layers == 1
    assert len(again.load_stats.notices) == 1
    assert torch.equal(again.forward(3, x, ids, w), cold.forward(3, x, ids, w))
