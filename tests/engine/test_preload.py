"""engine.preload: a load's torch-free work (the GGUF opened, the cached packs checked, the map's pages populated or
read ahead) begun before `import torch` so that it overlaps it (issue 12 item 3). The load takes what it did and
checks nothing less: a damaged pack is still refused and repacked, an unused preload is dropped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tessera.engine import pack_cache, preload, readahead

BACKEND = "Reference"


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory):
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("bf16") / "m.gguf", fmt="gguf", dtype="bf16", seed=3)


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "packed"
    monkeypatch.setenv("TESSERA_PACK_CACHE_DIR", str(root))
    return root


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    preload.discard()
    assert not preload._started and not preload._taken


def _answer(session) -> list[int]:
    from tessera.engine.sampling import SamplingParams

    events = list(session.generate([1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=3)))
    return events[-1].token_ids


def _load(path):
    from tessera import engine

    return engine.load(path, backend=BACKEND, threads=1)


@pytest.fixture
def cached(bf16_gguf, cache_root):
    """The bf16 file loaded once (its packs now in the cache) and its answer."""
    s = _load(bf16_gguf)
    try:
        assert s.model.experts.load_stats.packed_layers == s.config.num_hidden_layers
        return _answer(s)
    finally:
        s.close()


def _spy_open_checked(monkeypatch) -> list[tuple[str, str]]:
    """(thread name, file name) of every pack_cache.open_checked call from now on."""
    calls: list[tuple[str, str]] = []
    real = pack_cache.open_checked

    def spy(path, *a, **k):
        calls.append((threading.current_thread().name, os.path.basename(path)))
        return real(path, *a, **k)

    monkeypatch.setattr(pack_cache, "open_checked", spy)
    return calls


@pytest.mark.parametrize("preload_first", [True, False])
def test_a_load_takes_the_file_and_the_packs_the_preload_checked(bf16_gguf, cached, monkeypatch, preload_first):
    calls = _spy_open_checked(monkeypatch)
    if not preload_first:  # the load gets to every pack before the preload's thread: it checks them itself
        monkeypatch.setattr(preload.Preload, "_check_packs", lambda self: None)
    pre = preload.start(bf16_gguf, backend=BACKEND)
    assert pre is not None and preload.start(bf16_gguf, backend=BACKEND) is None  # one per file at a time
    if preload_first:
        assert pre.wait(60)
    s = _load(bf16_gguf)
    try:
        stats = s.model.experts.load_stats
        assert s._sources[0].start == pre._handed.files[0].mapping.ctypes.data  # the preload's map, not another
        assert stats.cached_layers == s.config.num_hidden_layers and not stats.notices
        files = [f for _, f in calls]
        assert len(files) == len(set(files)) == s.config.num_hidden_layers  # each checked once, by one of them
        assert {t for t, _ in calls} == ({"tessera-preload"} if preload_first else {"MainThread"})
        assert pre.error is None and pre.pages_done
        assert _answer(s) == cached
    finally:
        s.close()


def test_a_damaged_pack_found_by_the_preload_is_refused_and_repacked(bf16_gguf, cached, cache_root, monkeypatch):
    files = sorted((cache_root / "layers").glob("*.pack"))
    data = bytearray(files[0].read_bytes())
    data[pack_cache.HEADER_BYTES + (len(data) - pack_cache.HEADER_BYTES) // 2] ^= 0x10
    files[0].write_bytes(bytes(data))
    calls = _spy_open_checked(monkeypatch)
    assert preload.start(bf16_gguf, backend=BACKEND).wait(60)
    s = _load(bf16_gguf)
    try:
        stats = s.model.experts.load_stats
        assert stats.packed_layers == 1 and stats.cached_layers == s.config.num_hidden_layers - 1
        assert any("does not match its checksum" in n and files[0].name in n for n in stats.notices), stats.notices
        assert [c for c in calls if c[0] == "MainThread"] == [("MainThread", files[0].name)]  # checked again
        assert _answer(s) == cached
    finally:
        s.close()


def test_a_pack_of_another_size_than_expected_is_opened_again(tmp_path, monkeypatch):
    """PackCache.load checks the preloaded file's header against the size the backend expects, as for its own."""
    cache = pack_cache.PackCache(tmp_path)
    blob = np.arange(3 * pack_cache.PAGE, dtype=np.uint8)
    assert cache.store("a" * 40, blob)
    early, _ = pack_cache.open_checked(cache.layer_path("a" * 40), "a" * 40)
    monkeypatch.setattr(preload, "take_pack", lambda path: early)
    assert cache.load("a" * 40, blob.nbytes - 1, lambda b: None) is None
    assert "bytes of packed data" in cache.notices[-1]


def test_the_preload_needs_no_torch_and_the_cli_starts_it_before_torch(tiny_gguf_model, tmp_path):
    """In a fresh process: the preload opens the file without importing torch or anything else on its thread, and
    `tessera-cli generate` has it running when torch is first imported."""
    script = textwrap.dedent(f"""
        import sys
        from tessera.engine import preload
        pre = preload.start({str(tiny_gguf_model)!r}, backend="Reference")
        imported = set(sys.modules)
        pre.wait(60)
        assert pre.error is None and pre.gguf is not None and pre.pages_done, pre.error
        assert "torch" not in sys.modules
        # the thread imports nothing (start() did): imports on two threads at once can meet half-made modules
        assert set(sys.modules) == imported, sorted(set(sys.modules) - imported)
        preload.discard()
        assert pre.gguf is None and not preload._started

        class Spy:
            seen = None
            def find_spec(self, name, path=None, target=None):
                if name == "torch" and Spy.seen is None:
                    Spy.seen = list(preload._started)
                return None
        sys.meta_path.insert(0, Spy())
        from tessera.engine.cli import main
        rc = main(["generate", {str(tiny_gguf_model)!r}, "--prompt", "Hi", "--max-tokens", "1", "--backend",
                   "Reference", "--temperature", "0"])
        assert rc == 0 and Spy.seen and Spy.seen[0].endswith("tiny.gguf"), (rc, Spy.seen)
        assert not preload._started and not preload._taken
        print("ok")
    """)
    env = dict(os.environ, TESSERA_PACK_CACHE_DIR=str(tmp_path / "packed"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_an_unused_preload_is_dropped_and_the_switch_interval_restored(tiny_gguf_model):
    before = sys.getswitchinterval()
    pre = preload.start(tiny_gguf_model, backend=BACKEND)
    assert pre is not None
    pre.wait(60)
    assert sys.getswitchinterval() == before  # lowered only while the thread runs
    mapping = pre.gguf.files[0].mapping
    assert mapping is not None
    preload.discard(tiny_gguf_model)
    assert pre.gguf is None and preload.take(tiny_gguf_model) is None


def test_the_cli_drops_a_preload_no_load_took(tiny_gguf_model, capsys):
    from tessera.engine.cli import main

    assert main(["generate", str(tiny_gguf_model), "--prompt", "", "--backend", BACKEND]) == 2  # empty prompt
    assert not preload._started


@pytest.mark.parametrize("cached_share", [1.0, 0.0])
def test_the_preload_populates_a_cached_file_and_reads_a_cold_one_ahead(tiny_gguf_model, monkeypatch, cached_share):
    monkeypatch.setattr(readahead, "resident_fraction", lambda maps, ranges=None: cached_share)
    populated = []
    real = readahead.populate
    monkeypatch.setattr(readahead, "populate", lambda maps, cancel=None, ranges=None: populated.append(
        threading.current_thread().name) or real(maps, cancel, ranges))
    from tessera import engine

    pre = preload.start(tiny_gguf_model, backend="Torch")
    s = engine.load(tiny_gguf_model, backend="Torch")
    try:
        if cached_share:  # by the preload (readahead.SharedPopulate), not again by the load
            assert s.readahead is None and pre.populated and pre.pages_done and not populated
        else:
            assert not populated and s.readahead is pre.ahead and s.readahead is not None
    finally:
        s.close()
    if not cached_share:
        assert s.readahead._stop.is_set()


def test_a_preload_for_another_backend_leaves_the_pages_to_the_load(tiny_gguf_model, monkeypatch):
    monkeypatch.setattr(readahead, "resident_fraction", lambda maps, ranges=None: 1.0)
    populated = []
    real = readahead.populate
    monkeypatch.setattr(readahead, "populate", lambda maps, cancel=None, ranges=None: populated.append(
        threading.current_thread().name) or real(maps, cancel, ranges))
    pre = preload.start(tiny_gguf_model, backend="Torch")
    pre.wait(60)
    s = _load(tiny_gguf_model)  # Reference: other ranges than the preload worked on; the load does its own
    try:
        assert populated == ["MainThread"] and pre.populated
        assert pre.gguf is None
    finally:
        s.close()


def test_a_failed_load_releases_its_preload(tiny_gguf_model, monkeypatch):
    from tessera import engine
    from tessera.engine import weights

    def boom(*a, **k):
        raise RuntimeError("load failed")

    monkeypatch.setattr(weights, "load_weights", boom)
    pre = preload.start(tiny_gguf_model, backend=BACKEND)
    with pytest.raises(RuntimeError, match="load failed"):
        engine.load(tiny_gguf_model, backend=BACKEND)
    assert pre._stop.is_set() and pre.wait(60)


def test_a_file_that_is_not_gguf_gets_no_preload(tmp_path, tiny_hf_model):
    assert preload.start(tiny_hf_model) is None
    assert preload.start(tmp_path / "missing.gguf") is None
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    pre = preload.start(bad)
    assert pre is not None and pre.wait(60) and pre.error is not None
    from tessera import engine
    from tessera.engine.errors import ModelFormatError

    with pytest.raises(ModelFormatError):  # the load opens it again and says what is wrong
        engine.load(bad)


def test_recorded_keys_are_only_cache_keys(tmp_path):
    import json

    models = tmp_path / "models"
    models.mkdir()
    name = pack_cache.manifest_name("/m.gguf", "AVX512")
    (models / name).write_text(json.dumps({"keys": ["ab" * 20, "../../etc/passwd", 7, "ff"]}))
    assert pack_cache.recorded_keys(tmp_path, "/m.gguf", "AVX512") == ["ab" * 20, "ff"]
    assert pack_cache.recorded_keys(tmp_path, "/other.gguf", "AVX512") == []
    (models / name).write_text("{")
    assert pack_cache.recorded_keys(tmp_path, "/m.gguf", "AVX512") == []


@pytest.mark.parametrize("n", [1, pack_cache.PAGE * 5 + 3, pack_cache.PAGE * 8])
def test_the_fingerprint_on_several_threads_is_the_same(monkeypatch, n):
    monkeypatch.setattr(pack_cache, "_CHUNK", 2 * pack_cache.PAGE)
    blob = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    one = pack_cache.fingerprint(blob)
    assert pack_cache.fingerprint(blob, workers=3) == one
    bad = blob.copy()
    bad[-1] ^= 1
    assert pack_cache.fingerprint(bad, workers=3) != one


def test_a_shared_populate_maps_the_ranges_asked_on_every_thread_that_joins(tmp_path, monkeypatch):
    page = os.sysconf("SC_PAGE_SIZE")
    f = tmp_path / "m"
    f.write_bytes(os.urandom(64 * page))
    mapped = np.memmap(f, dtype=np.uint8, mode="c")
    asked: list[tuple[int, int, str]] = []
    monkeypatch.setattr(readahead, "madvise", lambda a, n, advice: asked.append(
        (a - mapped.ctypes.data, n, threading.current_thread().name)) or 0)
    work = readahead.SharedPopulate([mapped, None], [[(page + 5, 10 * page), (20 * page, 64 * page)], []],
                                    chunk=8 * page)
    helper = threading.Thread(target=work.work, name="helper")
    helper.start()
    work.work()
    helper.join()
    assert sorted((a, n) for a, n, _ in asked) == [(page, 8 * page), (9 * page, page)] + [
        (a, min(8 * page, 64 * page - a)) for a in range(20 * page, 64 * page, 8 * page)]
    assert work.failed is None
    monkeypatch.setattr(readahead, "madvise", lambda a, n, advice: 22)  # EINVAL: an old kernel
    failing = readahead.SharedPopulate([mapped])
    failing.work()
    assert failing.failed == "EINVAL"


def test_the_app_worker_s_load_starts_a_preload_and_leaves_none(tiny_gguf_model, monkeypatch):
    """EngineApi.load (the app's worker) starts the preload before its import of torch; engine.load takes it, and a
    load that fails before taking it drops it."""
    import torch

    from tessera import engine
    from tessera.app.worker import EngineApi

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # engine.load's is process-wide: not for the suite
    started = []
    real = preload.start
    monkeypatch.setattr(preload, "start", lambda *a, **k: started.append(real(*a, **k)) or started[-1])
    s = EngineApi().load(str(tiny_gguf_model), backend=BACKEND, threads=1, context_length=64, progress=None,
                         cancel=threading.Event())
    try:
        assert started and started[0] is not None and started[0].opened(started[0]._handed)
        assert not preload._started and not preload._taken
    finally:
        s.close()

    def boom(*a, **k):
        raise RuntimeError("no load")

    monkeypatch.setattr(engine, "load", boom)
    with pytest.raises(RuntimeError, match="no load"):
        EngineApi().load(str(tiny_gguf_model), backend=BACKEND, threads=1, context_length=64, progress=None,
                         cancel=threading.Event())
    assert len(started) == 2 and started[1] is not None and not preload._started and started[1]._stop.is_set()
