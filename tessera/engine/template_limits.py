"""Bounds for rendering a downloaded chat template: time, output size, loop length, and the size of what `*`, `+` and
`**` may build. A template is code from the internet; the sandbox stops it from reaching Python, these limits stop it
from hanging a load or a request (nested `range()` loops), filling memory (`'x' * 10**9`) or overflowing.

`BoundedSandbox` checks a per-render deadline on every call, attribute lookup and loop step; `render_bounded` streams
the output and stops at `MAX_OUTPUT_CHARS`. Both raise TemplateLimitError, which chat_template turns into a named error.
"""

from __future__ import annotations

import re
import sys
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


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")
MAX_WIDTH = 10_000  # of one formatted field


def _check_format(fmt: Any, args: tuple = ()) -> None:
    """Refuses printf/str.format fields wider than MAX_WIDTH (`'%2147483648d' % 1` allocates gigabytes)."""
    if not isinstance(fmt, str):
        return
    star = False
    for m in _PERCENT_SPEC.finditer(fmt):
        for g in m.groups():
            if g == "*":
                star = True
            elif g and int(g) > MAX_WIDTH:
                raise TemplateLimitError(f"a format field {m.group(0)!r} is wider than {MAX_WIDTH}")
    for m in _BRACE_SPEC.finditer(fmt):
        if any(int(d) > MAX_WIDTH for d in re.findall(r"\d+", m.group(1))):
            raise TemplateLimitError(f"a format field {m.group(0)!r} is wider than {MAX_WIDTH}")
    if star or "{" in fmt:
        flat = args[0] if len(args) == 1 and isinstance(args[0], tuple) else args
        if any(isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_WIDTH for a in flat):
            raise TemplateLimitError(f"a format width from the arguments is over {MAX_WIDTH}")


def _checked_format_filter(value: Any, *args: Any, **kwargs: Any) -> str:
    from jinja2.filters import do_format

    _check_format(value, args)
    return do_format(value, *args, **kwargs)


def _size(x: Any) -> int | None:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else None


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus a deadline on calls and attribute lookups and size checks on `*`, `+`, `**`."""

    intercepted_binops = frozenset(["*", "+", "**", "%"])

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.globals["range"] = _bounded_range
        self.filters["format"] = _checked_format_filter

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's signature
        _check_time()
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        if getattr(target, "__name__", "") in ("format", "format_map") and isinstance(
                getattr(target, "__self__", None), str):
            _check_format(target.__self__, args + tuple(kwargs.values()))
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
        elif operator == "%":
            _check_format(left, right if isinstance(right, tuple) else (right,))
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and (
                    right * max(1, abs(left).bit_length()) > MAX_EXPONENT_BITS):
                raise TemplateLimitError(f"{left} ** {right} is too large a number")
        return super().call_binop(context, operator, left, right)


def _line_tracer(frame, event, arg):
    """Checks the deadline every 4096 lines of template code: a loop over a list makes no call the sandbox sees."""
    if event == "line":
        _state.lines = getattr(_state, "lines", 0) + 1
        if not _state.lines & 4095:
            _check_time()
    return _line_tracer


def _call_tracer(frame, event, arg):
    return _line_tracer if frame.f_code.co_filename == "<template>" else None


def render_bounded(template: jinja2.Template, **context: Any) -> str:
    """template.render(**context) within RENDER_SECONDS and MAX_OUTPUT_CHARS. Template code runs under a line tracer
    (this thread only) so that even a loop without calls meets the deadline; a tracer already set (a debugger,
    coverage) is put back afterwards, and left alone: then only calls and output are timed."""
    _state.deadline = time.monotonic() + RENDER_SECONDS
    previous = sys.gettrace()
    if previous is None:
        sys.settrace(_call_tracer)
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
        if previous is None:
            sys.settrace(None)
        _state.deadline = None
