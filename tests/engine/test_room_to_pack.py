"""A load or a backend switch whose fresh packs (the layers the packed-weight cache does not hold) exceed the RAM free
now is refused before anything is packed, with the sizes and what to do (engine.native._check_room_to_pack): a BF16
file's experts packed beside a backend still loaded could otherwise outgrow RAM half-way, and the OS would kill the
app with its chat. Layers the cache holds are mapped from it and do not count; a refused switch keeps the backend in
use, and the chat goes on."""

from __future__ import annotations

import pytest

import tessera.engine.native as N
from tessera import engine
from tessera.engine.errors import NotEnoughMemoryError
from tessera.engine.events import TokenEvent
from tessera.engine.model import layer_experts
from tessera.engine.sampling import SamplingParams
from tessera.engine.weights import load_weights

BACKEND = "Reference"


def opened(path):
    w = load_weights(path)
    return w, layer_experts(w.config, w.tensors)


def test_packs_larger_than_the_free_ram_are_refused_before_anything_is_packed(tiny_gguf_model, tmp_path, monkeypatch):
    w, layers = opened(tiny_gguf_model)
    need = sum(N.packed_nbytes(BACKEND, e, BACKEND) for e in layers.values())
    monkeypatch.setattr(N, "free_ram", lambda: need - 1)
    packed = []
    monkeypatch.setattr(N, "pack_layer", lambda *a, **k: packed.append(1))
    with pytest.raises(NotEnoughMemoryError) as err:
        N.make_backend(BACKEND, layers, threads=1, cache_dir=tmp_path / "packed", model_id="m", sources=w.sources)
    assert err.value.subject == f"backend {BACKEND}"
    assert f"packing {len(layers)} layers of float32 experts takes {need / 1e9:.2f} GB" in err.value.message
    assert not packed and not list((tmp_path / "packed").rglob("*.pack"))


def test_layers_the_cache_holds_do_not_count(tiny_gguf_model, tmp_path, monkeypatch):
    root = tmp_path / "packed"
    w, layers = opened(tiny_gguf_model)
    N.make_backend(BACKEND, layers, threads=1, cache_dir=root, model_id="m", sources=w.sources)  # packs, stores
    monkeypatch.setattr(N, "free_ram", lambda: 0)
    w, layers = opened(tiny_gguf_model)
    again = N.make_backend(BACKEND, layers, threads=1, cache_dir=root, model_id="m", sources=w.sources)
    assert again.load_stats.cached_layers == len(layers)


def test_a_bf16_keeping_backend_names_its_int8_twin(tiny_gguf_model, monkeypatch):
    _, layers = opened(tiny_gguf_model)
    monkeypatch.setattr(N, "free_ram", lambda: 0)
    with pytest.raises(NotEnoughMemoryError, match="AMXInt8-emulated packs them into about half of that"):
        N.make_backend("AMXBF16-emulated", layers, threads=1)


def test_a_refused_switch_keeps_the_backend_in_use_and_the_chat(tiny_gguf_model, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(tmp_path / "packed"))
    session = engine.load(tiny_gguf_model, backend=BACKEND, threads=1)
    try:
        ids, params = session.tokenizer.encode("hello"), SamplingParams(temperature=0, max_tokens=4)
        before = [e.token_id for e in session.generate(ids, params) if isinstance(e, TokenEvent)]
        assert before
        monkeypatch.setattr(N, "free_ram", lambda: 0)
        with pytest.raises(NotEnoughMemoryError) as err:
            session.set_backend("AMXBF16-emulated")
        assert f"the backend in use ({BACKEND}) stays loaded: load the model again with AMXBF16-emulated" \
            in err.value.message
        assert err.value.message.startswith(err.value.shortfall + ";")  # the sizes alone, for the app's own words
        assert err.value.shortfall.endswith("GB are free")
        assert session.backend_name == BACKEND
        assert [e.token_id for e in session.generate(ids, params) if isinstance(e, TokenEvent)] == before
    finally:
        session.close()
