"""Split a streamed Qwen3 answer into reasoning, content and tool calls, as the OpenAI API returns them.

Qwen3 writes `<think>\\n...\\n</think>\\n\\n` before its answer (empty when thinking is off or the model skipped it);
that part becomes `reasoning_content`. With tools, each `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
in the answer becomes a `tool_calls` entry; a block that is not valid JSON stays in the content, unchanged.

`ChatOutputParser.feed(text)` returns the deltas that are certain so far, holding back text that might still turn out
to be the start of a tag; `finish()` returns the rest. The non-streaming answer is the concatenation of the same
deltas, so both ways agree. Leading and trailing whitespace of the reasoning and of the content are dropped.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Delta:
    kind: str  # "reasoning" | "content" | "tool_call"
    text: str = ""
    name: str = ""  # tool_call: the function's name
    arguments: str = ""  # tool_call: its arguments as a JSON string
    call_id: str = ""


def _partial_tag_tail(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `tag` (text that may become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_tool_call(block: str) -> tuple[str, str] | None:
    """(name, arguments JSON) from the inside of a <tool_call> block, or None when it is not a valid call."""
    try:
        call = json.loads(block)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except ValueError:
            return None
        return call["name"], arguments
    return call["name"], json.dumps(arguments, ensure_ascii=False)


class _Trimmed:
    """Emits text with leading whitespace dropped and trailing whitespace held until more text follows."""

    def __init__(self, kind: str):
        self.kind, self.started, self.held = kind, False, ""

    def add(self, text: str) -> list[Delta]:
        if not self.started:
            text = text.lstrip()
            if not text:
                return []
            self.started = True
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body):]
        return [Delta(self.kind, body)] if body else []

    def take_held(self) -> str:
        held, self.held = self.held, ""
        return held


class ChatOutputParser:
    """Streamed answer text -> reasoning / content / tool_call deltas.

    think_open: the prompt already opened the think block (templates that end the generation prompt with <think>).
    tools: parse <tool_call> blocks (only when the request had tools)."""

    def __init__(self, *, think_open: bool = False, tools: bool = False):
        self.state = "think" if think_open else "start"
        self.tools = tools
        self.buffer = ""
        self.reasoning = _Trimmed("reasoning")
        self.content = _Trimmed("content")
        self.calls = 0
        self.before_call = ""  # whitespace before an open <tool_call>: dropped if it parses, kept if it does not

    def feed(self, text: str) -> list[Delta]:
        self.buffer += text
        out: list[Delta] = []
        while True:
            before = (self.state, len(self.buffer))
            out += self._step(final=False)
            if (self.state, len(self.buffer)) == before:
                return out

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        while self.buffer or self.state == "start":
            before = (self.state, len(self.buffer))
            out += self._step(final=True)
            if (self.state, len(self.buffer)) == before:
                break
        if self.state == "call":  # an unclosed tool call: the model's text, as it wrote it
            out += self.content.add(self.before_call + CALL_OPEN + self.buffer)
            self.buffer = ""
        return out

    def _step(self, final: bool) -> list[Delta]:
        buf = self.buffer
        if self.state == "start":
            stripped = buf.lstrip()
            if stripped.startswith(THINK_OPEN):
                self.state, self.buffer = "think", stripped[len(THINK_OPEN):]
            elif stripped and (final or not THINK_OPEN.startswith(stripped)):
                self.state = "content"
            elif final:
                self.state, self.buffer = "content", ""
            return []
        if self.state == "think":
            end = buf.find(THINK_CLOSE)
            if end >= 0:
                self.state, self.buffer = "content", buf[end + len(THINK_CLOSE):]
                return self.reasoning.add(buf[:end])
            keep = 0 if final else _partial_tag_tail(buf, THINK_CLOSE)
            self.buffer = buf[len(buf) - keep:]
            return self.reasoning.add(buf[: len(buf) - keep])
        if self.state == "content":
            start = buf.find(CALL_OPEN) if self.tools else -1
            if start >= 0:
                self.state, self.buffer = "call", buf[start + len(CALL_OPEN):]
                out = self.content.add(buf[:start])
                self.before_call = self.content.take_held()  # layout, not content, if the call parses
                return out
            keep = 0 if final or not self.tools else _partial_tag_tail(buf, CALL_OPEN)
            self.buffer = buf[len(buf) - keep:]
            return self.content.add(buf[: len(buf) - keep])
        # state "call": wait for the closing tag
        end = buf.find(CALL_CLOSE)
        if end < 0:
            return []
        block, self.buffer, self.state = buf[:end], buf[end + len(CALL_CLOSE):], "content"
        parsed = parse_tool_call(block.strip())
        if parsed is None:
            return self.content.add(self.before_call + CALL_OPEN + block + CALL_CLOSE)
        self.calls += 1
        return [Delta("tool_call", name=parsed[0], arguments=parsed[1], call_id=f"call_{uuid.uuid4().hex[:24]}")]


def collect(deltas: list[Delta]) -> tuple[str | None, str | None, list[dict]]:
    """(reasoning or None, content or None, OpenAI tool_calls) from all of an answer's deltas."""
    reasoning = "".join(d.text for d in deltas if d.kind == "reasoning")
    content = "".join(d.text for d in deltas if d.kind == "content")
    calls = [tool_call_json(d) for d in deltas if d.kind == "tool_call"]
    return reasoning or None, content or None, calls


def tool_call_json(d: Delta, index: int | None = None) -> dict:
    out = {"id": d.call_id, "type": "function", "function": {"name": d.name, "arguments": d.arguments}}
    return out if index is None else {"index": index, **out}
