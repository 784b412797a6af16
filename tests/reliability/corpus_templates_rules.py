"""Hostile chat templates and placement-rules files (issue 13 items 7, 8): runaway loops, huge strings and numbers,
recursion, billion-laughs aliases, catastrophic regexes, oversized and non-UTF-8 files, FIFOs. Run by
test_templates_rules_probe.py in a child; every case must end in a named error (or the right plan) within its limit."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from probe import Case, corpus_main

from tessera.engine.chat_template import render
from tessera.engine.placement import load_plan, load_rules, plan_from_rules

WORK = Path(tempfile.mkdtemp(prefix="tessera-rules-probe-"))
MESSAGES = [{"role": "user", "content": "hi"}]
LAYERS = 48


def template_case(template: str, *words: str, seconds: float = 20) -> Case:
    def run() -> bool:
        render(template, MESSAGES)
        return False  # rendered without complaint: the bound did not hold

    return Case(run, seconds=seconds, named_must_mention=("chat template", *words))


NESTED_LOOPS = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                "{% endfor %}{% endfor %}{% endfor %}")
LOOP_NO_CALLS = "{% set xs = range(100000) | list %}{% for a in xs %}{% for b in xs %}{% endfor %}{% endfor %}"
HUGE_OUTPUT = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"
HUGE_STRING = "{{ 'x' * 1000000000 }}"
HUGE_POWER = "{{ 10 ** 100000000 }}"
RECURSION = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
DEEP_IFS = "{% if true %}" * 5000 + "x" + "{% endif %}" * 5000
FORMAT_OVERFLOW = "{{ '%2147483648d' % 1 }}"
FORMAT_FILTER = "{{ '%*d'|format(2000000000, 1) }}"
FORMAT_METHOD = "{{ '{:>2000000000}'.format(1) }}"
LIST_GROWTH = ("{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}{% endfor %}"
               "{{ ns.x|length }}")


def rules_file(name: str, data: bytes) -> Path:
    p = WORK / name
    p.write_bytes(data)
    return p


def rules_case(make, *words: str, seconds: float = 20) -> Case:
    def run() -> bool:
        load_plan(make(), LAYERS, [True] * LAYERS)
        return False

    return Case(run, seconds=seconds, named_must_mention=words)


def billion_laughs() -> Path:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]")
    lines.append("- match: {name: '.*'}\n  replace: {class: default}")
    return rules_file("laughs.yaml", "\n".join(lines).encode())


def aliases_in_a_list() -> Path:
    text = "- &r\n  match: {name: 'experts'}\n  replace: {class: default}\n- *r\n"
    return rules_file("alias.yaml", text.encode())


def fifty_mb() -> Path:
    rule = b"- match: {name: 'model\\.layers\\.1\\.'}\n  replace: {class: default}\n"
    return rules_file("big.yaml", rule * (50 * 1024 * 1024 // len(rule)))


def not_utf8() -> Path:
    return rules_file("latin1.yaml", "- match: {name: 'caf\u00e9'}\n  replace: {class: default}\n".encode("latin-1"))


def deep_nesting() -> Path:
    return rules_file("deep.yaml", b"- " + b"[" * 100000 + b"]" * 100000 + b"\n")


def fifo() -> Path:
    p = WORK / "rules.fifo"
    if not p.exists():
        os.mkfifo(p)
    return p


def backreference() -> Path:
    return rules_file("backref.yaml", b"- match: {name: '(layers)\\1'}\n  replace: {class: default}\n")


def catastrophic_regex() -> bool:
    """`^(.+)+X$` against every part name of 48 layers: RE2 answers at once (Python's re: minutes)."""
    p = rules_file("catastrophic.yaml", b"- match: {name: '^(.+)+X$'}\n  replace: {class: default}\n")
    t0 = time.monotonic()
    plan = plan_from_rules(load_rules(p), LAYERS, [True] * LAYERS, source=str(p))
    return time.monotonic() - t0 < 5 and all(p.generate_device == "cpu" for p in plan.parts.values())


def a_normal_rules_file_still_works() -> bool:
    p = rules_file("normal.yaml", b"- match: {name: 'model\\\\.layers\\\\.(1|2)\\\\.mlp\\\\.experts$'}\n"
                                  b"  replace: {class: default}\n")
    plan = plan_from_rules(load_rules(p), LAYERS, [True] * LAYERS, source=str(p))
    return len(plan.parts) > 0


def cases() -> dict[str, Case]:
    return {
        "template/nested_range_loops": template_case(NESTED_LOOPS, "s"),
        "template/nested_loops_without_calls": template_case(LOOP_NO_CALLS),
        "template/huge_output": template_case(HUGE_OUTPUT, "characters"),
        "template/huge_string": template_case(HUGE_STRING),
        "template/huge_power": template_case(HUGE_POWER),
        "template/recursion": template_case(RECURSION),
        "template/deep_ifs": template_case(DEEP_IFS),
        "template/format_overflow": template_case(FORMAT_OVERFLOW),
        "template/list_doubling": template_case(LIST_GROWTH),
        "template/format_filter": template_case(FORMAT_FILTER),
        "template/format_method": template_case(FORMAT_METHOD),
        "rules/billion_laughs": rules_case(billion_laughs, "alias"),
        "rules/alias_in_a_list": rules_case(aliases_in_a_list, "alias"),
        "rules/fifty_megabytes": rules_case(fifty_mb, "bytes"),
        "rules/not_utf8": rules_case(not_utf8, "UTF-8"),
        "rules/deep_nesting": rules_case(deep_nesting, "deeper"),
        "rules/fifo": rules_case(fifo, "regular file"),
        "rules/backreference": rules_case(backreference, "RE2"),
        "rules/catastrophic_regex": Case(catastrophic_regex, must_succeed=True, seconds=20),
        "rules/normal_file": Case(a_normal_rules_file_still_works, must_succeed=True),
    }


if __name__ == "__main__":
    corpus_main(cases, WORK)
