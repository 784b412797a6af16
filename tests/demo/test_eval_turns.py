"""eval-demo --turns N: the scored question is the last turn of an N-turn chat whose earlier turns are other held-out
problems with their right answers (issue 15 item 7 measures the demo model's decline over long chats with it)."""

from __future__ import annotations

import json
import subprocess
import sys

from tessera.engine.demo import DEMO_GGUF
from tessera.engine.demo.evaluate import earlier_problems, earlier_turns
from tessera.engine.demo.skills import SKILLS
from tessera.engine.demo.split import is_heldout


def test_earlier_turns_are_fixed_held_out_exchanges_of_every_skill():
    turns = earlier_turns("addition", 0, 9)
    assert turns == earlier_turns("addition", 0, 9)  # the same on every run
    assert turns != earlier_turns("addition", 1, 9)  # another mix for the next problem
    assert [m["role"] for m in turns] == ["user", "assistant"] * 9
    assert earlier_turns("sort_list", 3, 0) == []
    problems = earlier_problems("addition", 0, 9)
    assert [m["content"] for m in turns] == [x for _s, p in problems for x in (p.prompt, p.answer)]
    assert {name for name, _p in problems} == set(SKILLS)  # 9 turns go round all 6 skills
    assert all(is_heldout(p.key) for _s, p in problems)  # nothing seen in training


def test_cli_turns(tmp_path):
    cmd = [sys.executable, "-m", "tessera.engine", "eval-demo", "--n", "1", "--turns", "3", "--threads", "1", "--json",
           "--skill", "tessera", "--skill", "reverse_list"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["turns"] == 3 and set(doc["skills"]) == {"tessera", "reverse_list"}
    assert DEMO_GGUF.is_file()
    bad = subprocess.run([sys.executable, "-m", "tessera.engine", "eval-demo", "--turns", "0"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--turns: must be >= 1, got 0" in bad.stderr
