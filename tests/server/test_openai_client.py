"""The server through the official `openai` client: models, chat (streaming and not), completions, usage with
cached_tokens, thinking on/off and tools rendered by the template. Greedy answers equal the in-process Session's."""

from __future__ import annotations

import openai
import pytest
from server_support import NAME

from tessera.engine.kv_cache import common_prefix
from tessera.engine.sampling import SamplingParams

GREEDY = {"temperature": 0, "max_tokens": 120}
SUM = [{"role": "user", "content": "What is 347 + 589?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def local_chat(session, messages, *, enable_thinking=True, tools=None, max_tokens=120):
    events = list(session.chat(messages, SamplingParams(temperature=0, max_tokens=max_tokens),
                               enable_thinking=enable_thinking, tools=tools))
    return events[-1]


def answer_of(text: str) -> str:
    """The content part of a Qwen3 answer: what follows the think block."""
    return text.split("</think>")[-1].strip()


def prompt_len(session, messages, **kw) -> int:
    return len(session.tokenizer.encode(session.render_chat(messages, **kw)))


def test_models_lists_the_served_model(client, served_session):
    models = client.models.list().data
    assert [m.id for m in models] == [NAME]
    assert models[0].model_extra["max_model_len"] == served_session.context_length


def test_chat_greedy_equals_in_process_session(client, reference_session):
    done = local_chat(reference_session, SUM)
    reply = client.chat.completions.create(model=NAME, messages=SUM, **GREEDY)
    choice = reply.choices[0]
    assert choice.message.content == answer_of(done.text)
    assert "936" in choice.message.content  # the demo model's right answer, so the comparison is not of two blanks
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens == done.metrics.prompt_tokens
    assert reply.usage.completion_tokens == len(done.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_chat_equals_non_streaming_and_reports_usage(client, reference_session):
    messages = [{"role": "user", "content": "Sort [3, 14, 1, 59]."}]
    whole = client.chat.completions.create(model=NAME, messages=messages, **GREEDY)
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content == answer_of(local_chat(reference_session, messages).text)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # streamed, not one blob
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_streaming_without_include_usage_sends_no_usage(client):
    chunks = list(client.chat.completions.create(model=NAME, messages=SUM, stream=True, **GREEDY))
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)


def test_second_turn_reports_cached_tokens_from_the_prefix_cache(client, server, reference_session):
    server.scheduler.call(lambda s: s.reset_cache()).result(30)
    first = client.chat.completions.create(model=NAME, messages=SUM, **GREEDY)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = SUM + [{"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "Subtract 289 from 734."}]
    second = client.chat.completions.create(model=NAME, messages=turn2, **GREEDY)
    # What the prefix cache holds after turn 1 (prompt + answer tokens) against turn 2's prompt. The last token of the
    # answer (<|im_end|>) was sampled but never fed back through the model, so it has no KV entry: when the whole
    # first exchange is a prefix of turn 2's prompt, the cache reuses all of it but that token.
    tok = reference_session.tokenizer
    first_ids = tok.encode(reference_session.render_chat(SUM)) + local_chat(reference_session, SUM).token_ids
    second_ids = tok.encode(reference_session.render_chat(turn2))
    expected = min(common_prefix(first_ids, second_ids), len(first_ids) - 1, len(second_ids) - 1)
    assert second.usage.prompt_tokens == len(second_ids)
    assert second.usage.prompt_tokens_details.cached_tokens == expected >= first.usage.prompt_tokens - 1
    assert second.choices[0].message.content == answer_of(local_chat(reference_session, turn2).text)


def test_thinking_switch_changes_the_prompt_not_the_answer(client, reference_session):
    off = client.chat.completions.create(model=NAME, messages=SUM, extra_body={
        "chat_template_kwargs": {"enable_thinking": False}}, **GREEDY)
    on = client.chat.completions.create(model=NAME, messages=SUM, **GREEDY)
    assert off.usage.prompt_tokens == prompt_len(reference_session, SUM, enable_thinking=False)
    assert on.usage.prompt_tokens == prompt_len(reference_session, SUM, enable_thinking=True)
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the empty think block is in the prompt
    assert off.choices[0].message.content == answer_of(local_chat(reference_session, SUM, enable_thinking=False).text)
    # The demo model writes an empty think block itself when thinking is on: no reasoning to report.
    assert on.choices[0].message.model_extra.get("reasoning_content") is None


def test_tools_are_rendered_by_the_template_and_tool_turns_accepted(client, reference_session):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, **GREEDY)
    assert reply.usage.prompt_tokens == prompt_len(reference_session, messages, tools=TOOLS)
    assert reply.usage.prompt_tokens > prompt_len(reference_session, messages) + 50  # the <tools> block is there
    assert reply.choices[0].message.content == answer_of(local_chat(reference_session, messages, tools=TOOLS).text)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    reply = client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, **GREEDY)
    rendered = reference_session.render_chat(
        [history[0], {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": '{"temp_c": 21}'}], tools=TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert "<tool_response>\n{\"temp_c\": 21}\n</tool_response>" in rendered
    assert reply.usage.prompt_tokens == len(reference_session.tokenizer.encode(rendered))
    none = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, tool_choice="none", **GREEDY)
    assert none.usage.prompt_tokens == prompt_len(reference_session, messages)


def test_completions_greedy_equals_session_generate(client, reference_session):
    prompt = "<|im_start|>user\nReverse the list [3, 14, 1, 59].<|im_end|>\n<|im_start|>assistant\n"
    ids = reference_session.tokenizer.encode(prompt)
    done = list(reference_session.generate(ids, SamplingParams(temperature=0, max_tokens=40)))[-1]
    whole = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=40)
    assert whole.choices[0].text == done.text and "[59, 1, 14, 3]" in done.text
    assert whole.usage.prompt_tokens == len(ids)
    streamed = list(client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=40, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == done.text
    # a chunk per generated token, then the finish (clients can time every token, whatever it decodes to)
    assert [c.choices[0].finish_reason is None for c in streamed] == [True] * done.metrics.generated_tokens + [False]
    by_ids = client.completions.create(model=NAME, prompt=ids, temperature=0, max_tokens=40)
    assert by_ids.choices[0].text == done.text


def test_max_tokens_ends_with_length(client):
    reply = client.chat.completions.create(model=NAME, messages=SUM, temperature=0, max_completion_tokens=3)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3


def test_seeded_sampling_is_reproducible_and_penalties_are_accepted(client):
    kw = dict(model=NAME, messages=SUM, temperature=1.2, top_p=0.9, seed=7, max_tokens=30, presence_penalty=0.5,
              frequency_penalty=0.3, extra_body={"top_k": 40, "min_p": 0.01, "repetition_penalty": 1.1})
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_stop_strings_cut_the_answer(client):
    reply = client.chat.completions.create(model=NAME, messages=SUM, stop=["carry"], **GREEDY)
    assert reply.choices[0].message.content == "ones: 7 + 9 = 16,"
    assert reply.choices[0].finish_reason == "stop"


def test_errors_reach_the_client_as_openai_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=SUM)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=SUM, top_p=1.5)
    assert e.value.body["param"] == "top_p"
