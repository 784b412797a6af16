"""Split Qwen3's `<think>...</think>` from a streamed reply.

The model either writes `<think>` itself, or the chat template already opened the block and only `</think>` appears.
"""

from __future__ import annotations

from typing import NamedTuple

OPEN, CLOSE = "<think>", "</think>"


class Split(NamedTuple):
    thinking: str
    answer: str
    open: bool  # the thinking block has started and not yet ended


def split_thinking(raw: str) -> Split:
    stripped = raw.lstrip()
    if stripped.startswith(OPEN):
        body = stripped[len(OPEN):]
        end = body.find(CLOSE)
        if end < 0:
            return Split(body.strip("\n"), "", True)
        return Split(body[:end].strip("\n"), body[end + len(CLOSE):].lstrip("\n"), False)
    end = raw.find(CLOSE)
    if end >= 0:  # template opened the block: everything before </think> was thinking
        return Split(raw[:end].strip("\n"), raw[end + len(CLOSE):].lstrip("\n"), False)
    if OPEN.startswith(stripped) and stripped:  # a partial "<thi" at the very start: wait for more
        return Split("", "", True)
    return Split("", raw.lstrip("\n"), False)
