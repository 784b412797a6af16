"""Qwen3 output split into reasoning / content / tool calls, whole and streamed in arbitrary pieces."""

from __future__ import annotations

import json
import random

import pytest

from tessera.engine.server.chat_output import ChatOutputParser, collect

ANSWER = ("<think>\nThe user wants the weather.\nI should call the tool.\n</think>\n\nLet me check.\n"
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>")


def parse(text: str, pieces: list[int] | None = None, **kw):
    parser = ChatOutputParser(**kw)
    deltas = []
    if pieces is None:
        deltas += parser.feed(text)
    else:
        at = 0
        for n in pieces:
            deltas += parser.feed(text[at:at + n])
            at += n
        deltas += parser.feed(text[at:])
    return deltas + parser.finish()


def test_reasoning_content_and_tool_calls():
    reasoning, content, calls = collect(parse(ANSWER, tools=True))
    assert reasoning == "The user wants the weather.\nI should call the tool."
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize("seed", range(20))
def test_any_split_into_pieces_gives_the_same_answer(seed):
    rng = random.Random(seed)
    pieces = [rng.randint(1, 6) for _ in range(len(ANSWER))]
    streamed = collect(parse(ANSWER, pieces, tools=True))
    whole = collect(parse(ANSWER, tools=True))
    assert streamed[:2] == whole[:2]
    assert [c["function"] for c in streamed[2]] == [c["function"] for c in whole[2]]


def test_without_tools_a_tool_call_is_plain_content():
    _, content, calls = collect(parse(ANSWER, tools=False))
    assert calls == [] and content.startswith("Let me check.\n<tool_call>")


def test_malformed_tool_call_stays_in_the_content_unchanged():
    text = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call>"
    _, content, calls = collect(parse(text, tools=True))
    assert calls == [] and content == text
    unclosed = "Sure.\n<tool_call>\n{\"name\": \"f\""
    _, content, calls = collect(parse(unclosed, [3] * 20, tools=True))
    assert calls == [] and content == unclosed


def test_empty_think_block_gives_no_reasoning():
    reasoning, content, _ = collect(parse("<think>\n\n</think>\n\n[1, 3, 14, 59]"))
    assert reasoning is None and content == "[1, 3, 14, 59]"


def test_answer_without_think_block_is_all_content_even_if_it_mentions_tags():
    reasoning, content, _ = collect(parse("Use a <think> tag like </think> this", [1] * 40))
    assert reasoning is None and content == "Use a <think> tag like </think> this"


def test_prompt_that_opened_the_think_block():
    reasoning, content, _ = collect(parse("pondering\n</think>\n\nanswer", [2] * 20, think_open=True))
    assert reasoning == "pondering" and content == "answer"


def test_unfinished_thinking_is_reasoning():
    reasoning, content, _ = collect(parse("<think>\nstill going", [1] * 30))
    assert reasoning == "still going" and content is None


def test_content_is_never_held_back_beyond_a_possible_tag():
    parser = ChatOutputParser(tools=True)
    assert collect(parser.feed("<think>\n\n</think>\n\nHello wor"))[1] == "Hello wor"
    assert collect(parser.feed("ld <tool"))[1] == "ld"  # " <tool" may start a call: held
    assert collect(parser.feed("box> yes"))[1] == " <toolbox> yes"
