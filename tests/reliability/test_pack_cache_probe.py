"""Issue 13 items 1, 2, 4 and issue 12 item 5: the packed-weight cache under a generated corpus of damaged files,
replaced weights, read-only and full disks, budgets and leftovers (corpus_pack_cache.py, run in a child process with a
time limit). Every case must load the right weights, bit for bit as a fresh pack."""

from pathlib import Path

import pytest
from probe import assert_all_ok, run_corpus

from tessera.engine.backends import available_names

HERE = Path(__file__).parent


def test_every_hostile_cache_state_loads_the_right_weights():
    results = run_corpus(HERE / "corpus_pack_cache.py", timeout=300)
    assert_all_ok(results)
    assert len(results) >= 17, results


_LOAD_ONCE = """
import sys, torch
import tessera.engine.native as N
from corpus_pack_cache import MODEL_A
b = N.make_backend("AVX512Int8", MODEL_A, threads=1, cache_dir=sys.argv[1], model_id="/models/a.gguf")
print(sorted(set(b.load_stats.per_layer.values())))
"""


def test_int8_group_size_is_part_of_the_key(tmp_path):
    """TESSERA_INT8_GROUP changes AVX512Int8's packed bytes (read once per process): a cache filled with one group
    must not serve another (issue 12 item 5: the group size was missing from the key)."""
    import os
    import subprocess
    import sys

    if "AVX512Int8" not in available_names():
        pytest.skip("AVX512Int8 does not run on this CPU")

    def load(group: str) -> str:
        env = {**os.environ, "TESSERA_INT8_GROUP": group, "PYTHONPATH": str(HERE)}
        out = subprocess.run([sys.executable, "-c", _LOAD_ONCE, str(tmp_path)], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
        return out.stdout.strip()

    assert load("64") == "['packed']"
    assert load("128") == "['packed']"
    assert load("64") == "['cached']"
    assert load("128") == "['cached']"
