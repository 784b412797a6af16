"""Issue 13 items 1, 2, 4 and issue 12 item 5: the packed-weight cache under a generated corpus of damaged files,
replaced weights, read-only and full disks, budgets and leftovers (corpus_pack_cache.py, run in a child process with a
time limit). Every case must load the right weights, bit for bit as a fresh pack."""

from pathlib import Path

import pytest

from probe import assert_all_ok, run_corpus

N = pytest.importorskip("engine.native")
HERE = Path(__file__).parent


def test_every_hostile_cache_state_loads_the_right_weights():
    if N._native is None:
        pytest.skip("native module not built")
    results = run_corpus(HERE / "corpus_pack_cache.py", timeout=300)
    assert_all_ok(results)
    assert len(results) >= 17, results
