"""Training conversations for the demo model, rendered with Qwen3's chat template and tokenized with a loss mask.

A conversation is one exchange or a chat of up to MAX_TURNS user/assistant exchanges of training-side problems of any
skill, sometimes after a system prompt; chats too long for CONTEXT_TOKENS (the demo model's context, which the app
clamps its context length to) lose their last exchanges until they fit, so the longest fill the context. Qwen3's
template renders earlier assistant turns as plain text and the last one after an empty think block
(`<think>\n\n</think>\n\n`), exactly as the engine renders a chat whose history the app sends; the loss covers every
assistant turn from just after `<|im_start|>assistant\n` to its `<|im_end|>`, so with thinking on the model writes the
empty think block itself.
Letters: N conversations, T tokens.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

from tessera.engine.demo.split import draw

# How often each skill is drawn for a user turn. Column arithmetic (short local steps) is learned first; letter
# counting and sorting (comparisons and copies across the prompt) were the slowest in the first trained model, so they
# get the most practice.
SKILL_WEIGHTS: dict[str, float] = {
    "addition": 0.16,
    "subtraction": 0.15,
    "count_letters": 0.25,
    "reverse_list": 0.14,
    "sort_list": 0.22,
    "tessera": 0.08,
}
SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are Tessera's demo model.", "Answer briefly.")
ASSISTANT_OPEN = "<|im_start|>assistant\n"
IM_END = "<|im_end|>"
IGNORE = -100  # label of tokens without loss (the convention of torch's cross_entropy)
CONTEXT_TOKENS = 2048  # the demo model's max_position_embeddings: the longest chat the app can hold with it
MAX_TURNS = 40  # exchanges in the longest drawn chat (about 2,600 tokens: long chats fill CONTEXT_TOKENS)
# Exchanges per conversation: one (the first question of a chat), a short chat, or a long one.
TURN_MIX = ((0.35, 1, 1), (0.25, 2, 6), (0.40, 7, MAX_TURNS))


def draw_turns(rng: random.Random) -> int:
    """How many exchanges a conversation has, drawn from TURN_MIX."""
    r = rng.random()
    for share, low, high in TURN_MIX:
        if r < share:
            return rng.randint(low, high)
        r -= share
    return TURN_MIX[-1][2]


def conversation(rng: random.Random, weights: dict[str, float] | None = None,
                 max_turns: int | None = None) -> list[dict[str, str]]:
    """One training conversation (messages in the engine's format) of training-side problems only; `weights`
    (default SKILL_WEIGHTS) says how often each skill is drawn, `max_turns` caps the exchanges drawn from TURN_MIX."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.1:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = draw_turns(rng)
    if max_turns is not None:
        turns = min(turns, max_turns)
    skills, w = zip(*(weights or SKILL_WEIGHTS).items())
    for _ in range(turns):
        p = draw(rng.choices(skills, w)[0], rng, heldout=False)
        messages.append({"role": "user", "content": p.prompt})
        messages.append({"role": "assistant", "content": p.answer})
    return messages


def make_renderer(template: str):
    """A function messages -> text rendering `template` the way transformers does (sandboxed Jinja2)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    compiled = env.from_string(template)

    def render(messages: Sequence[dict], *, add_generation_prompt: bool = False, enable_thinking: bool = True) -> str:
        return compiled.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
        )

    return render


def assistant_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of every assistant reply in a rendered conversation, `<|im_end|>` included."""
    spans, pos = [], 0
    while (start := text.find(ASSISTANT_OPEN, pos)) >= 0:
        start += len(ASSISTANT_OPEN)
        end = text.find(IM_END, start)
        if end < 0:
            raise ValueError("assistant turn without <|im_end|>")
        end += len(IM_END)
        spans.append((start, end))
        pos = end
    return spans


def labels_for(offsets: Sequence[tuple[int, int]], ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[int]:
    """Next-token labels aligned with `ids` (label[i] is the target at position i, i.e. ids[i] itself; the model
    shifts), IGNORE outside the assistant spans. Every span must start on a token boundary."""
    labels = [IGNORE] * len(ids)
    token_starts = [a for a, _ in offsets]  # non-decreasing
    for s, e in spans:
        first = bisect.bisect_left(token_starts, s)
        if first == len(ids) or token_starts[first] != s:
            raise ValueError(f"assistant reply at character {s} does not start on a token boundary")
        for i in range(first, len(ids)):
            a, b = offsets[i]
            if a >= e:
                break
            labels[i] = ids[i]
    return labels


def fit_context(tokenizer, render, conv: list[dict], max_tokens: int) -> tuple[list[dict], str, object]:
    """`conv` less its last exchanges until its rendering is at most `max_tokens` tokens (one exchange is always
    kept), with that rendering and its encoding."""
    while True:
        text = render(conv)
        enc = tokenizer.encode(text, add_special_tokens=False)
        users = [i for i, m in enumerate(conv) if m["role"] == "user"]
        if len(enc.ids) <= max_tokens or len(users) <= 1:
            return conv, text, enc
        conv = conv[: users[-1]]


def encode_conversations(tokenizer, render, convs: Sequence[list[dict]],
                         max_tokens: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) per conversation; `tokenizer` is a `tokenizers.Tokenizer`, `render` from `make_renderer`. With
    `max_tokens`, a conversation longer than that loses its last exchanges until it fits (`fit_context`)."""
    texts = [render(c) for c in convs]
    encs = tokenizer.encode_batch(texts, add_special_tokens=False)
    out = []
    for conv, text, enc in zip(convs, texts, encs):
        if max_tokens is not None and len(enc.ids) > max_tokens:
            _conv, text, enc = fit_context(tokenizer, render, conv, max_tokens)
        out.append((enc.ids, labels_for(enc.offsets, enc.ids, assistant_spans(text))))
    return out
