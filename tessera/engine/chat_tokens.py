"""Token ids of a rendered chat in which what people wrote stays text: a `<|im_start|>` pasted into a message is
tokenized as the characters it is, not as the special token that opens a turn, so message content cannot forge turns,
roles or a system prompt. The template's own markup keeps its special tokens.

How: the template is rendered with each protected content replaced by a unique marker; the rendered text is cut at the
markers, the template's pieces are tokenized with special tokens and each content without. Chat templates print the
content of user, system and tool messages as given (Qwen3's does), and Qwen's pre-tokenizer splits at the special
tokens and newlines that surround them, so the ids equal whole-prompt tokenization whenever the content holds no special
token (tests/engine/test_chat_tokens.py checks that). A template that transforms such content (the marker is not
found once, intact) falls back to whole-prompt tokenization after checking that no protected content holds a special
token string; one that does is then a named error.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from tessera.engine.errors import TesseraError

PROTECTED_ROLES = ("user", "system", "tool")


@dataclass(frozen=True)
class ChatPrompt:
    """A chat rendered once: the prompt text (what the template printed, contents included) and its token ids."""

    text: str
    ids: list[int]


def encode_chat(tokenizer, render, messages: list[dict[str, Any]], *, allow_special_tokens: bool = False) -> list[int]:
    """Ids for `render(messages)` (a function returning the prompt text); with allow_special_tokens, the plain
    whole-prompt tokenization (content may then contain control tokens on purpose)."""
    return prepare_chat(tokenizer, render, messages, allow_special_tokens=allow_special_tokens).ids


def prepare_chat(tokenizer, render, messages: list[dict[str, Any]], *,
                 allow_special_tokens: bool = False) -> ChatPrompt:
    """encode_chat's ids together with the prompt text, from one call of `render` (two only in the fallback for a
    template that rewrites content), so a caller that also needs the text (the server looks for an open <think>)
    does not render the template again."""
    if allow_special_tokens:
        text = render(messages)
        return ChatPrompt(text, tokenizer.encode(text))
    nonce = secrets.token_hex(8)
    markers: dict[str, str] = {}
    masked = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if m.get("role") in PROTECTED_ROLES and isinstance(content, str) and content:
            marker = f"\ue000{nonce}:{i}\ue001"
            markers[marker] = content
            m = {**m, "content": marker}
        masked.append(m)
    if not markers:
        text = render(messages)
        return ChatPrompt(text, tokenizer.encode(text))
    text = render(masked)
    if all(text.count(marker) == 1 for marker in markers):
        ids: list[int] = []
        rest = text
        first = True
        while rest:
            cut, marker = min(((rest.find(k), k) for k in markers if k in rest), default=(-1, ""))
            if cut < 0:
                ids += tokenizer.encode(rest, add_bos=first)
                break
            if cut:
                ids += tokenizer.encode(rest[:cut], add_bos=first)
                first = False
            ids += tokenizer.encode(markers[marker], parse_special=False, add_bos=first)
            first = False
            rest = rest[cut + len(marker):]
        for marker, content in markers.items():
            text = text.replace(marker, content)  # each marker occurs once, and no content can hold one (the nonce)
        return ChatPrompt(text, ids)
    specials = [t for t in getattr(tokenizer, "special_token_strings", lambda: [])() if t]
    for i, m in enumerate(messages):
        content = m.get("content")
        if m.get("role") in PROTECTED_ROLES and isinstance(content, str):
            hit = next((t for t in specials if t in content), None)
            if hit:
                raise TesseraError(f"messages[{i}]", f"contains the control token {hit!r}, which this model's chat "
                                                     "template would read as markup; remove it or allow special tokens")
    text = render(messages)
    return ChatPrompt(text, tokenizer.encode(text))
