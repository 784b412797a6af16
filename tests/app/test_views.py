"""Widgets on their own (qtbot.addWidget): a message's states, footer, code copy; the sidebar's day groups."""

from __future__ import annotations

import datetime as dt

from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication

from tessera.app.store import Conversation, Message
from tessera.app.views.message_widget import MessageWidget, footer_text
from tessera.app.views.sidebar import ConversationSidebar, day_group


def test_code_block_copy_link_copies_the_code(qtbot):
    w = MessageWidget(0, Message("assistant", "Try:\n\n```bash\nls -la\n```\n"))
    qtbot.addWidget(w)
    assert w.body.code_blocks() == ["ls -la"]
    with qtbot.waitSignal(w.body.copy_code) as sig:
        w.body.anchorClicked.emit(QUrl("copy-code:0"))
    assert sig.args == ["ls -la"] and QGuiApplication.clipboard().text() == "ls -la"


def test_interrupted_and_failed_replies_say_so(qtbot):
    w = MessageWidget(1, Message("assistant", "partial", state="interrupted"))
    qtbot.addWidget(w)
    assert "interrupted" in w.state_label.text()
    w.update_message(Message("assistant", "", state="error", metrics={"error": "session: is closed"}))
    assert w.state_label.text() == "failed: session: is closed"
    w.update_message(Message("assistant", "ok", state="done", metrics={"stop_reason": "eos"}))
    assert w.state_label.text() == "" and w.footer.text() == "stop: eos"


def test_footer_numbers():
    text = footer_text({"decode_tok_s": 12.345, "generated_tokens": 145, "ttft_s": 0.4213, "prefill_tok_s": 530.2,
                        "prefix_hit_rate": 0.6, "stop_reason": "eos", "backend": "AVX512"})
    assert text == ("12.3 tok/s · 145 tokens · 421 ms to first token · prefill 530 tok/s · 60% prefix reused · "
                    "stop: eos · AVX512")
    assert "3 ms to first token" in footer_text({"ttft_s": 0.0034})  # as the graph shows it (was "0.00 s")


def test_user_messages_can_be_edited_replies_regenerated(qtbot):
    u = MessageWidget(0, Message("user", "q"))
    a = MessageWidget(1, Message("assistant", "a"))
    for w in (u, a):
        qtbot.addWidget(w)
        w.set_actions(busy=False, last=w is a)
    assert not u.edit_button.isHidden() and u.regen_button.isHidden()
    assert a.edit_button.isHidden() and not a.regen_button.isHidden()
    a.set_actions(busy=True, last=True)
    assert not a.regen_button.isEnabled() and "being generated" in a.regen_button.toolTip()
    with qtbot.waitSignal(u.action) as sig:
        u.edit_button.click()
    assert sig.args == ["edit", 0]


def test_sidebar_groups_by_day(qtbot):
    today = dt.date(2026, 12, 2)
    ts = lambda d: dt.datetime.combine(d, dt.time(12)).timestamp()  # noqa: E731
    assert day_group(ts(today), today) == "Today"
    assert day_group(ts(today - dt.timedelta(days=1)), today) == "Yesterday"
    assert day_group(ts(today - dt.timedelta(days=3)), today) == "This week"
    assert day_group(ts(dt.date(2026, 3, 1)), today) == "March 2026"
    s = ConversationSidebar()
    qtbot.addWidget(s)
    now = dt.datetime.now().timestamp()
    s.set_conversations([Conversation(2, "b", now, now), Conversation(1, "a", now - 86400 * 30, now - 86400 * 30)], 2)
    assert s.ids() == [2, 1] and s.list.count() == 4  # two headers
    assert s.list.currentItem().text() == "b"
    with qtbot.waitSignal(s.open_requested) as sig:
        s.list.itemClicked.emit(s.list.item(3))
    assert sig.args == [1]
