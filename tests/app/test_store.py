"""Conversation store (SQLite WAL), export, thinking split and Markdown rendering."""

from __future__ import annotations

import json

from tessera.app.export import to_json, to_markdown, write_atomic
from tessera.app.store import ConversationStore, Message
from tessera.app.thinking import split_thinking
from tessera.app.views.markdown_html import render


def test_store_crud_search_and_wal(tmp_path):
    s = ConversationStore(tmp_path / "c.sqlite3")
    assert s.journal_mode == "wal"
    a = s.create_conversation("Rust lifetimes")
    b = s.create_conversation("Cooking")
    s.add_message(a.id, Message("user", "what is a borrow?"))
    s.add_message(b.id, Message("user", "pasta 100% al dente"))
    assert [c.id for c in s.conversations("borrow")] == [a.id]
    assert [c.id for c in s.conversations("100%")] == [b.id]  # LIKE wildcards are escaped
    assert [c.id for c in s.conversations("_")] == []
    s.rename(a.id, "Borrowing")
    assert s.conversation(a.id).title == "Borrowing"
    s.delete(b.id)
    assert [c.id for c in s.conversations()] == [a.id]
    assert s.messages(b.id) == []  # cascade


def test_messages_update_truncate_and_recover(tmp_path):
    path = tmp_path / "c.sqlite3"
    s = ConversationStore(path)
    c = s.create_conversation()
    u = s.add_message(c.id, Message("user", "hi"))
    r = s.add_message(c.id, Message("assistant", state="streaming"))
    assert (u.seq, r.seq) == (0, 1)
    r.content, r.thinking, r.thinking_s = "Hel", "hmm", 0.5
    s.update_message(r)
    s.close()
    s2 = ConversationStore(path)  # a restart after a crash
    assert s2.recovered == 1
    msgs = s2.messages(c.id)
    assert [(m.role, m.content, m.state) for m in msgs] == [("user", "hi", "done"), ("assistant", "Hel", "interrupted")]
    assert msgs[1].thinking == "hmm" and msgs[1].thinking_s == 0.5
    s2.delete_messages_from(c.id, 1)
    assert len(s2.messages(c.id)) == 1
    assert ConversationStore(path).recovered == 0


def test_export_markdown_and_json(tmp_path):
    s = ConversationStore(tmp_path / "c.sqlite3")
    c = s.create_conversation("Greeting", model="tiny.gguf")
    s.add_message(c.id, Message("user", "hello"))
    s.add_message(c.id, Message("assistant", "**Hi**", thinking="be nice", thinking_s=1.25, state="stopped",
                                metrics={"decode_tok_s": 3.5}))
    md = to_markdown(c, s.messages(c.id))
    assert md.startswith("# Greeting\n") and "## User\n\nhello" in md and "**Hi**" in md
    assert "Thinking (1.2 s)" in md or "Thinking (1.3 s)" in md
    assert "_(stopped)_" in md
    doc = json.loads(to_json(c, s.messages(c.id)))
    assert doc["format"] == "tessera-conversation" and doc["messages"][1]["metrics"] == {"decode_tok_s": 3.5}
    out = tmp_path / "chat.md"
    write_atomic(out, md)
    assert out.read_text() == md and not list(tmp_path.glob(".chat.md.*"))


def test_split_thinking():
    assert split_thinking("<think>\nplan\n</think>\n\nAnswer") == ("plan", "Answer", False)
    assert split_thinking("<think>\nplan so far") == ("plan so far", "", True)
    assert split_thinking("plan</think>\n\nAnswer") == ("plan", "Answer", False)  # template opened the block
    assert split_thinking("<thi") == ("", "", True)
    assert split_thinking("Just an answer") == ("", "Just an answer", False)


def test_markdown_code_blocks_are_highlighted_with_copy_links():
    html, codes = render("Use:\n\n```python\ndef f():\n    return 1\n```\n\nthen `x`.")
    assert codes == ["def f():\n    return 1"]
    assert 'href="copy-code:0"' in html and "<span style=" in html and "<code>x</code>" in html
    html, _ = render("use <vector> & <img src=x>, not `<b>`")  # text stays text; no tag reaches the renderer
    assert "&lt;vector&gt;" in html and "<img" not in html and "<code>&lt;b&gt;</code>" in html
    html, codes = render("```js\nlet a = 1")  # an unterminated fence while streaming is still code
    assert codes == ["let a = 1"] and "copy-code:0" in html
