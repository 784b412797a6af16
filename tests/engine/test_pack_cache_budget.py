"""The packed-weight cache's budget (issue 12 item 5): a model larger than the whole budget keeps the layers that fit
(so those load from the cache and only the rest pack again), says so with what to do, and `tessera-cli cache list`
shows it; the budget counts the cache itself as room, since a load may evict all of it."""

from __future__ import annotations

import json
import re

import torch

import tessera.engine.native as N
from tessera.engine.cli import main
from tessera.engine.experts import LayerExperts
from tessera.engine.pack_cache import HEADER_BYTES, PackCache, default_budget

BACKEND = "Reference"


def model(seed: int, n_layers: int = 4) -> dict[int, LayerExperts]:
    g = torch.Generator().manual_seed(seed)
    w = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    return {i: LayerExperts(w(4, 32, 64), w(4, 32, 64), w(4, 64, 32)) for i in range(n_layers)}


def layer_file_bytes(layers) -> int:
    return HEADER_BYTES + N.packed_nbytes(BACKEND, layers[0])


def load(layers, root, name):
    return N.make_backend(BACKEND, layers, threads=1, cache_dir=root, model_id=name)


def outputs(backend):
    g = torch.Generator().manual_seed(0)
    x, ids, w = torch.randn(3, 64, generator=g), torch.randint(0, 4, (3, 2), generator=g), torch.rand(3, 2, generator=g)
    return [backend.forward(n, x, ids, w) for n in sorted(backend.layers)]


def test_a_model_over_the_budget_caches_the_layers_that_fit(tmp_path, monkeypatch):
    a = model(1)
    one = layer_file_bytes(a)
    monkeypatch.setenv("TESSERA_PACK_CACHE_BUDGET", str(3 * one - 1))  # room for 2 of its 4 layers
    root = tmp_path / "packed"
    first = load(a, root, "/models/a.gguf")
    assert first.load_stats.packed_layers == 4
    notice = next(n for n in first.load_stats.notices if "over the cache budget" in n)
    assert "caching 2 of its 4 layers" in notice and "the other 2 are packed again at every load" in notice
    assert "set by TESSERA_PACK_CACHE_BUDGET" in notice
    want_gib = -(-4 * one * 10 // 2**30) / 10
    assert f"TESSERA_PACK_CACHE_BUDGET={want_gib:.1f}G" in notice
    assert len(list((root / "layers").glob("*.pack"))) == 2

    for _ in range(2):  # stable: the same two layers come from the cache, the two others pack each time
        again = load(a, root, "/models/a.gguf")
        assert again.load_stats.per_layer == {0: "cached", 1: "cached", 2: "packed", 3: "packed"}
        assert all(torch.equal(x, y) for x, y in zip(outputs(again), outputs(first)))
    assert PackCache(root).held_bytes() <= 3 * one - 1


def test_the_model_over_the_budget_evicts_older_models_first(tmp_path, monkeypatch):
    b, a = model(2, n_layers=2), model(1)
    one = layer_file_bytes(a)
    root = tmp_path / "packed"
    monkeypatch.setenv("TESSERA_PACK_CACHE_BUDGET", str(3 * one))
    load(b, root, "/models/b.gguf")  # 2 layers, fits
    loaded = load(a, root, "/models/a.gguf")  # 4 layers: over; b (least recently used) makes way for 3 of a's
    assert [m.model for m in PackCache(root).models() if m.bytes] == ["/models/a.gguf"]
    assert loaded.load_stats.notices and "caching 3 of its 4 layers" in loaded.load_stats.notices[-1]
    assert load(a, root, "/models/a.gguf").load_stats.cached_layers == 3


def test_cache_list_says_which_model_is_stored_in_part_and_where_the_budget_comes_from(tmp_path, monkeypatch, capsys):
    a = model(1)
    root = tmp_path / "packed"
    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(root))
    monkeypatch.setenv("TESSERA_PACK_CACHE_BUDGET", str(2 * layer_file_bytes(a)))
    load(a, root, "/models/a.gguf")
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert ("/models/a.gguf  (2 of 4 layers stored; the next load packs the others, and stores those the budget "
            "allows)") in out
    assert re.search(r"total .* of a .* budget \(set by TESSERA_PACK_CACHE_BUDGET\)", out)
    assert main(["cache", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["models"][0]["layers"] == 4 and listing["models"][0]["layers_stored"] == 2

    monkeypatch.delenv("TESSERA_PACK_CACHE_BUDGET")  # the default: says which limit decides
    assert main(["cache", "list", "--json"]) == 0
    why = json.loads(capsys.readouterr().out)["budget_from"]
    assert "(free disk space plus the cache)" in why


def test_the_default_budget_counts_the_cache_itself_as_room():
    # 10 GB free, 6 GB already cached (all of it evictable), a 5 GB model: 25 % of 16 GB = 4 GB < 2 x 5 GB
    assert default_budget(10 * 10**9, 6 * 10**9, 5 * 10**9) == 4 * 10**9
    assert default_budget(100 * 10**9, 0, 5 * 10**9) == 10 * 10**9  # roomy disk: twice the largest model
