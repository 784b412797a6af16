"""ChatController without a thread: streamed chunks are written to the store in batches, thinking is split and timed
from the first token, the final result is authoritative."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from tessera.app.chat_controller import ChatController
from tessera.app.payloads import GenerationResult, TokenChunk
from tessera.app.settings import Settings
from tessera.app.store import ConversationStore


class StubWorker(QObject):
    tokens = Signal(object)
    finished = Signal(object)

    def __init__(self):
        super().__init__()
        self.requests = []

    def generate(self, messages, params, enable_thinking=True, allow_special_tokens=False):
        self.requests.append((messages, params, enable_thinking))
        return len(self.requests)

    def stop(self):
        pass


def make(tmp_path, flush_tokens=8):
    store = ConversationStore(tmp_path / "c.sqlite3")
    settings = Settings(tmp_path / "s.ini")
    worker = StubWorker()
    c = ChatController(store, worker, settings, flush_tokens=flush_tokens, flush_seconds=3600)
    c.set_model(True, "m.gguf", 1024)
    return c, store, worker


def stored_reply(store, c):
    return store.messages(c.conversation_id)[-1]


def test_tokens_are_persisted_in_batches(tmp_path):
    c, store, worker = make(tmp_path, flush_tokens=4)
    assert c.send("hi")
    assert worker.requests[0][0] == [{"role": "user", "content": "hi"}]
    assert worker.requests[0][1]["seed"] is None and worker.requests[0][1]["max_tokens"] == 2048
    for i in range(1, 4):
        c.on_tokens(TokenChunk(1, "a", 1, i, 0.1 * i))
    assert stored_reply(store, c).content == ""  # 3 tokens: not yet written
    c.on_tokens(TokenChunk(1, "b", 1, 4, 0.4))
    reply = stored_reply(store, c)
    assert (reply.content, reply.state) == ("aaab", "streaming")  # the 4th token completes a batch
    c.on_tokens(TokenChunk(1, "c", 1, 5, 0.5))
    assert stored_reply(store, c).content == "aaab"  # at most one batch behind
    c.on_tokens(TokenChunk(99, "zzz", 3, 3, 0.5))  # another request's chunk is ignored
    c.on_finished(GenerationResult(1, "aaabc!", {"stop_reason": "eos", "prompt_tokens": 9, "generated_tokens": 6}))
    reply = stored_reply(store, c)
    assert (reply.content, reply.state, reply.metrics["stop_reason"]) == ("aaabc!", "done", "eos")
    assert not c.busy


def test_thinking_is_split_and_timed_from_the_first_token(tmp_path):
    c, store, worker = make(tmp_path)
    c.send("think")
    c.on_tokens(TokenChunk(1, "<think>", 1, 1, 2.0))  # TTFT 2 s (prefill)
    c.on_tokens(TokenChunk(1, "\nhmm", 1, 2, 2.5))
    assert c.messages[-1].thinking == "hmm" and c.messages[-1].thinking_s == 0.5
    c.on_tokens(TokenChunk(1, "\n</think>\n\nYes", 2, 4, 3.5))
    c.on_tokens(TokenChunk(1, " indeed", 1, 5, 4.0))
    m = c.messages[-1]
    assert (m.thinking, m.content, m.thinking_s) == ("hmm", "Yes indeed", 1.5)
    c.on_finished(GenerationResult(1, "<think>\nhmm\n</think>\n\nYes indeed", {"stop_reason": "cancelled"}))
    reply = stored_reply(store, c)
    assert (reply.thinking, reply.content, reply.thinking_s, reply.state) == ("hmm", "Yes indeed", 1.5, "stopped")
    # the next request sends the answer without its thinking
    c.send("again")
    assert worker.requests[-1][0][1] == {"role": "assistant", "content": "Yes indeed"}


def test_send_refuses_without_a_model_or_while_busy(tmp_path):
    c, store, worker = make(tmp_path)
    notices = []
    c.notice.connect(notices.append)
    c.set_model(False)
    assert not c.send("hi") and "No model" in notices[-1] and c.conversation_id == 0
    c.set_model(True, "m", 1024)
    assert c.send("hi") and not c.send("again") and "stop it first" in notices[-1]
    assert len(worker.requests) == 1
