"""Issue 13 items 6, 8, 9, 10: mutations of a tiny model and hostile command lines (corpus_model_files.py, in a child
with per-case time limits) end in a named error that says what is wrong, never a traceback, hang or wrong output."""

from pathlib import Path

from probe import assert_all_ok, run_corpus

HERE = Path(__file__).parent


def test_every_damaged_model_is_named(tmp_path):
    results = run_corpus(HERE / "corpus_model_files.py", timeout=400,
                         env={"TESSERA_PACK_CACHE_DIR": str(tmp_path / "packed")})
    assert_all_ok(results)
    assert len(results) >= 18, results
