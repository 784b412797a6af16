"""Bounds for rendering a downloaded chat template: time, output size, loop length, and the size of what `*`, `+` and
`**` may build. A template is code from the internet; the sandbox stops it from reaching Python, these limits stop it
from hanging a load or a request (nested `range()` loops), filling memory (`'x' * 10**9`) or overflowing.

`BoundedSandbox` checks a per-render deadline on every call, attribute lookup and loop step; `render_bounded` streams
the output and stops at `MAX_OUTPUT_CHARS`. Both raise TemplateLimitError, which chat_template turns into a named error.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_SECONDS = 5.0  # a real template renders a long chat in milliseconds
MAX_OUTPUT_CHARS = 16 * 1024 * 1024  # far beyond any context window's worth of text
MAX_RANGE = 100_000  # per range() call, as jinja2's sandbox
MAX_BUILT = 1 << 24  # elements or characters one `*`/`+` may produce
MAX_EXPONENT_BITS = 4096  # bits of a `**` result


class TemplateLimitError(jinja2.exceptions.TemplateError):
    """A chat template went past one of the limits above."""


_state = threading.local()  # deadline of the render running on this thread


def _check_time() -> None:
    deadline = getattr(_state, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimitError(f"rendering took longer than {RENDER_SECONDS:g} s (a runaway loop?)")


def _bounded_range(*args: int):
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise TemplateLimitError(f"range() of {len(r)} items is over the limit of {MAX_RANGE}")
    for n, i in enumerate(r):
        if not n & 1023:
            _check_time()
        yield i


def _size(x: Any) -> int | None:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else None


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus a deadline on calls and attribute lookups and size checks on `*`, `+`, `**`."""

    intercepted_binops = frozenset(["*", "+", "**"])

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.globals["range"] = _bounded_range

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's signature
        _check_time()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_time()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_time()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _check_time()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                n = _size(seq)
                if n is not None and isinstance(times, int) and n * max(times, 0) > MAX_BUILT:
                    raise TemplateLimitError(f"a sequence of {n} items repeated {times} times is over the limit")
        elif operator == "+":
            a, b = _size(left), _size(right)
            if a is not None and b is not None and a + b > MAX_BUILT:
                raise TemplateLimitError(f"joining {a} and {b} items is over the limit of {MAX_BUILT}")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and (
                    right * max(1, abs(left).bit_length()) > MAX_EXPONENT_BITS):
                raise TemplateLimitError(f"{left} ** {right} is too large a number")
        return super().call_binop(context, operator, left, right)


def render_bounded(template: jinja2.Template, **context: Any) -> str:
    """template.render(**context) within RENDER_SECONDS and MAX_OUTPUT_CHARS."""
    _state.deadline = time.monotonic() + RENDER_SECONDS
    try:
        parts: list[str] = []
        total = 0
        for piece in template.generate(**context):
            total += len(piece)
            if total > MAX_OUTPUT_CHARS:
                raise TemplateLimitError(f"the rendered prompt is over {MAX_OUTPUT_CHARS} characters")
            parts.append(piece)
            _check_time()
        return "".join(parts)
    finally:
        _state.deadline = None
