"""Issue 13 items 7, 8: hostile chat templates and placement-rules files (corpus_templates_rules.py, in a child with
per-case time limits) end in named errors within seconds; a catastrophic name pattern is matched in linear time."""

from pathlib import Path

from probe import assert_all_ok, run_corpus

HERE = Path(__file__).parent


def test_hostile_templates_and_rules_are_bounded():
    results = run_corpus(HERE / "corpus_templates_rules.py", timeout=300)
    assert_all_ok(results)
    assert len(results) >= 20, results
