"""Issue 13 items 3 and 8: the converter never writes over its source or an existing file without --force, cleans up
after a killed conversion, and turns read-only and full disks into named errors (corpus_convert.py, in a child)."""

from pathlib import Path

from probe import assert_all_ok, run_corpus

HERE = Path(__file__).parent


def test_the_converter_writes_only_where_it_may():
    results = run_corpus(HERE / "corpus_convert.py", timeout=300)
    assert_all_ok(results)
    assert len(results) >= 13, results
