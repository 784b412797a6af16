"""Validate OpenAI request bodies into what the engine takes: messages, tools, SamplingParams, streaming options.

Everything a client can get wrong is an ApiError(400) naming the field (`messages[2].content`, `top_p`); what Tessera
cannot do (n > 1, logprobs, JSON-constrained output, forced tool choice) is refused by name rather than ignored.
Omitted sampling fields take Tessera's defaults (Qwen3's recommended values, as in the app and the CLI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera.engine.errors import TesseraError
from tessera.engine.sampling import SamplingParams
from tessera.engine.server.errors import ApiError, bad_request, from_engine_error

MAX_STOP_STRINGS = 4  # as OpenAI
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass
class ChatRequest:
    messages: list[dict]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    enable_thinking: bool = True
    tools: list[dict] | None = None  # rendered into the prompt (and <tool_call> output parsed) when not None


@dataclass
class CompletionRequest:
    prompt: str | list[int]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    extra: dict = field(default_factory=dict)


def _number(body: dict, name: str, *, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(name, f"must be a number, got {value!r}")
    if value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi):
        lo_b, hi_b = "(" if lo_open else "[", ")" if hi_open else "]"
        raise bad_request(name, f"must be in {lo_b}{lo:g}, {hi:g}{hi_b}, got {value}")
    return float(value)


def _integer(body: dict, name: str, *, lo: int, hi: int | None = None):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(name, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise bad_request(name, f"must be >= {lo}" + (f" and <= {hi}" if hi is not None else "") + f", got {value}")
    return value


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(name, f"must be true or false, got {value!r}")
    return value


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("n", "only n = 1 is supported (one engine, one answer per request)")
    if body.get("best_of") not in (None, 1):
        raise bad_request("best_of", "only best_of = 1 is supported")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise bad_request("logprobs", "log probabilities are not supported by Tessera")
    if body.get("logit_bias"):
        raise bad_request("logit_bias", "is not supported by Tessera")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad_request("response_format", "only {\"type\": \"text\"}: Tessera does not constrain output to JSON")


def sampling_params(body: dict, *, default_max_tokens: int) -> SamplingParams:
    """SamplingParams from the OpenAI fields (plus the top_k, min_p, repetition_penalty and ignore_eos extensions vLLM
    takes)."""
    d = SamplingParams()
    temperature = _number(body, "temperature", lo=0, hi=2)
    top_p = _number(body, "top_p", lo=0, hi=1, lo_open=True)
    top_k = _integer(body, "top_k", lo=-1)
    min_p = _number(body, "min_p", lo=0, hi=1, hi_open=True)
    repetition = _number(body, "repetition_penalty", lo=0, hi=math.inf, lo_open=True)
    presence = _number(body, "presence_penalty", lo=-2, hi=2)
    frequency = _number(body, "frequency_penalty", lo=-2, hi=2)
    seed = _integer(body, "seed", lo=0, hi=2**63 - 1)
    max_tokens = _integer(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", lo=1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("stop", "must be a non-empty string or a list of non-empty strings")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    try:
        return SamplingParams(
            temperature=d.temperature if temperature is None else temperature,
            top_k=d.top_k if top_k is None else max(top_k, 0),  # -1 (vLLM) and 0 both disable it
            top_p=d.top_p if top_p is None else top_p,
            min_p=d.min_p if min_p is None else min_p,
            repetition_penalty=d.repetition_penalty if repetition is None else repetition,
            presence_penalty=presence or 0.0,
            frequency_penalty=frequency or 0.0,
            seed=seed,
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            stop=tuple(stop),
            ignore_eos=_bool(body, "ignore_eos", False),  # vLLM's extension, for benchmarks
        )
    except TesseraError as e:
        raise from_engine_error(e) from None


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise bad_request("stream_options", "must be an object such as {\"include_usage\": true}")
    return stream, _bool(options, "include_usage", False)


def _text_content(content, where: str) -> str:
    """A message's content: a string, null, or a list of text parts (OpenAI's content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}[{j}]", f"only text parts are supported (this model reads text), got {kind}")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(where, f"must be a string or a list of text parts, got {type(content).__name__}")


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request(where, "must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}[{j}]", "needs a function with a name and arguments")
        arguments = fn.get("arguments", "{}")
        if not isinstance(arguments, (str, dict)):
            raise bad_request(f"{where}[{j}].function.arguments", "must be a JSON string")
        out.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": arguments}})
    return out


def chat_messages(raw) -> list[dict]:
    """OpenAI messages as the chat template takes them (developer -> system, content parts joined, tool calls kept)."""
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages", "must be a non-empty list of messages")
    messages = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(where, "must be an object with a role and a content")
        role = ROLES.get(m.get("role"))
        if role is None:
            raise bad_request(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        if "content" not in m and not (role == "assistant" and m.get("tool_calls")):
            raise bad_request(f"{where}.content", "is missing")
        message = {"role": role, "content": _text_content(m.get("content"), f"{where}.content")}
        if role == "assistant":
            if m.get("tool_calls"):
                message["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
            reasoning = m.get("reasoning_content")
            if isinstance(reasoning, str):
                message["reasoning_content"] = reasoning
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            message["tool_call_id"] = m["tool_call_id"]
        messages.append(message)
    return messages


def chat_tools(body: dict) -> list[dict] | None:
    """The tool definitions to render, or None when there are none or tool_choice is "none"."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad_request("tool_choice", "only \"auto\" and \"none\" are supported: Tessera does not force a call "
                                         "(no constrained decoding)")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", "must be a list of function definitions")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"tools[{i}]", "must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                                             "\"parameters\": {...}}}")
    return None if choice == "none" else tools


def enable_thinking(body: dict) -> bool:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return True
    if not isinstance(kwargs, dict):
        raise bad_request("chat_template_kwargs", "must be an object such as {\"enable_thinking\": false}")
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
        raise bad_request(f"chat_template_kwargs.{unknown[0]}", "is not supported (only enable_thinking)")
    return _bool(kwargs, "enable_thinking", True)


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model", f"is required: this server serves \"{served}\" (see GET /v1/models)")
    if model != served:
        raise ApiError(404, f"The model `{model}` does not exist: this server serves `{served}`", param="model",
                       code="model_not_found")


def parse_chat(body, *, served: str, context_length: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request(None, "the request body must be a JSON object")
    check_model(body, served)
    _refuse_unsupported(body)
    messages = chat_messages(body.get("messages"))
    tools = chat_tools(body)
    stream, include_usage = _stream_options(body)
    return ChatRequest(messages, sampling_params(body, default_max_tokens=context_length), stream, include_usage,
                       enable_thinking(body), tools)


def parse_completion(body, *, served: str, context_length: int) -> CompletionRequest:
    if not isinstance(body, dict):
        raise bad_request(None, "the request body must be a JSON object")
    check_model(body, served)
    _refuse_unsupported(body)
    if body.get("echo"):
        raise bad_request("echo", "is not supported by Tessera")
    if body.get("suffix"):
        raise bad_request("suffix", "is not supported (no fill-in-the-middle)")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad_request("prompt", "must be a string, or a list of token ids (one prompt per request)")
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt", "must be a non-empty string (one prompt per request)")
    stream, include_usage = _stream_options(body)
    # OpenAI's completions default is 16 tokens.
    return CompletionRequest(prompt, sampling_params(body, default_max_tokens=min(16, context_length)), stream,
                             include_usage)
