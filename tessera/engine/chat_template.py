"""Render a model's chat template (Jinja2, from `tokenizer.chat_template`) exactly as transformers'
`apply_chat_template` does, in Jinja2's immutable sandbox: templates come from downloaded files, so they must not be
able to reach Python internals.

Same environment as transformers: trim_blocks, lstrip_blocks, the loopcontrols extension, a `tojson` filter that does
not HTML-escape, `raise_exception`, `strftime_now`, and namespaces that refuse underscore names. Qwen3's template reads
`enable_thinking`: False appends an empty `<think></think>` block so the model answers directly.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext

from tessera.engine.errors import TesseraError
from tessera.engine.template_limits import BoundedSandbox, TemplateLimitError, render_bounded

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # aliases transformers fills for templates


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Dict:
    """`dict(...)` for templates without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (no route to dunders)."""

    def __init__(*args: Any, **kwargs: Any):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attribute {name!r}")


@lru_cache(maxsize=8)
def compile_template(template: str) -> jinja2.Template:
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TesseraError("chat template", f"syntax error at line {e.lineno}: {e.message}") from None
    except (RecursionError, MemoryError, OverflowError) as e:
        raise TesseraError("chat template", f"cannot be compiled ({type(e).__name__}: nested too deeply or too "
                                            "large)") from None


def render(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    **extra: Any,
) -> str:
    """The prompt text for `messages` ({"role", "content"} dicts). `extra` (e.g. bos_token, eos_token, tools) is
    passed to the template as transformers passes tokenizer special tokens and keyword arguments."""
    if not template:
        raise TesseraError("chat template", "the model has no chat template (tokenizer.chat_template); use raw prompts")
    chat = []
    for m in messages:
        m = dict(m)
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        chat.append(m)
    try:
        return render_bounded(compile_template(template), messages=chat, add_generation_prompt=add_generation_prompt,
                              enable_thinking=enable_thinking, **extra)
    except TemplateLimitError as e:
        raise TesseraError("chat template", f"stopped: {e}") from None
    except (RecursionError, MemoryError, OverflowError) as e:
        raise TesseraError("chat template", f"stopped: {type(e).__name__} ({e or 'too deep or too large'})") from None
    except jinja2.exceptions.SecurityError as e:
        raise TesseraError("chat template", f"refused by the sandbox: {e}") from None
    except jinja2.exceptions.TemplateError as e:
        raise TesseraError("chat template", str(e)) from None
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
        raise TesseraError("chat template", f"failed on these messages: {e}") from None


class ChatTemplate:
    """A tokenizer's template bound to its special tokens; `render(messages, add_generation_prompt, enable_thinking)`
    passes bos_token/eos_token/pad_token as transformers does."""

    def __init__(self, template: str | None, special_tokens: dict[str, str] | None = None):
        self.template = template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def of(cls, tokenizer: Any) -> ChatTemplate:
        return cls(tokenizer.chat_template, getattr(tokenizer, "special_tokens", {}))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               enable_thinking: bool = True, **extra: Any) -> str:  # fmt: skip
        kwargs = {**self.special_tokens, **extra}
        return render(self.template, messages, add_generation_prompt, enable_thinking, **kwargs)
