"""Training conversations for the demo model, rendered with Qwen3's chat template and tokenized with a loss mask.

A conversation is one to three user/assistant exchanges of training-side problems, sometimes after a system prompt.
Qwen3's template renders earlier assistant turns as plain text and the last one after an empty think block
(`<think>\n\n</think>\n\n`), exactly as the app's prompts look with thinking off; the loss covers every assistant turn
from just after `<|im_start|>assistant\n` to its `<|im_end|>`, so with thinking on the model writes the empty think
block itself. Letters: N conversations, T tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from engine.demo.split import draw

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


def conversation(rng: random.Random, weights: dict[str, float] | None = None) -> list[dict[str, str]]:
    """One training conversation (messages in the engine's format) of training-side problems only; `weights`
    (default SKILL_WEIGHTS) says how often each skill is drawn."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.1:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = 1 if rng.random() < 0.8 else rng.randint(2, 3)
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
    for s, e in spans:
        starts = [i for i, (a, _) in enumerate(offsets) if a == s]
        if not starts:
            raise ValueError(f"assistant reply at character {s} does not start on a token boundary")
        for i in range(starts[0], len(ids)):
            a, b = offsets[i]
            if a >= e:
                break
            labels[i] = ids[i]
    return labels


def encode_conversations(tokenizer, render, convs: Sequence[list[dict]]) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) per conversation; `tokenizer` is a `tokenizers.Tokenizer`, `render` from `make_renderer`."""
    texts = [render(c) for c in convs]
    encs = tokenizer.encode_batch(texts, add_special_tokens=False)
    out = []
    for text, enc in zip(texts, encs):
        out.append((enc.ids, labels_for(enc.offsets, enc.ids, assistant_spans(text))))
    return out
