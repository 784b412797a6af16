"""Conversations sidebar: search, list (newest first, grouped by day), new / rename / delete / export."""

from __future__ import annotations

import datetime as dt

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from tessera.app.store import Conversation

ID_ROLE = Qt.ItemDataRole.UserRole
TITLE_ROLE = Qt.ItemDataRole.UserRole + 1


def day_group(timestamp: float, today: dt.date | None = None) -> str:
    today = today or dt.date.today()
    d = dt.date.fromtimestamp(timestamp)
    if d == today:
        return "Today"
    if d == today - dt.timedelta(days=1):
        return "Yesterday"
    if (today - d).days < 7:
        return "This week"
    return d.strftime("%B %Y")


class ConversationSidebar(QWidget):
    new_requested = Signal()
    open_requested = Signal(int)
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    export_requested = Signal(int, str)  # id, "markdown" | "json"
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search conversations")
        top.addWidget(self.search, 1)
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.setAccessibleName("New chat")
        self.new_button.clicked.connect(self.new_requested)
        top.addWidget(self.new_button)
        layout.addLayout(top)
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long titles are elided
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemActivated.connect(self._open)
        self.list.itemClicked.connect(self._open)
        layout.addWidget(self.list, 1)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(200)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search.text()))
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        self._current = 0

    def set_conversations(self, conversations: list[Conversation], current: int = 0,
                          snippets: dict[int, str] | None = None) -> None:
        """Fill the list; `snippets` (id -> matching text, while searching) adds a second line under each title."""
        self._current = current
        snippets = snippets or {}
        self.list.blockSignals(True)
        self.list.clear()
        group = None
        for c in conversations:
            g = day_group(c.updated)
            if g != group:
                header = QListWidgetItem(g)
                header.setFlags(Qt.ItemFlag.NoItemFlags)
                f = header.font()
                f.setBold(True)
                header.setFont(f)
                self.list.addItem(header)
                group = g
            snippet = snippets.get(c.id, "")
            item = QListWidgetItem(c.title + (f"\n    {snippet}" if snippet else ""))
            item.setData(ID_ROLE, c.id)
            item.setData(TITLE_ROLE, c.title)
            item.setToolTip(c.title + (f"\n{snippet}" if snippet else "") + (f"\nmodel: {c.model}" if c.model else ""))
            self.list.addItem(item)
            if c.id == current:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def set_current(self, conversation_id: int) -> None:
        self._current = conversation_id
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(ID_ROLE) == conversation_id:
                self.list.setCurrentItem(item)
                return
        self.list.clearSelection()

    def ids(self) -> list[int]:
        return [self.list.item(i).data(ID_ROLE) for i in range(self.list.count()) if self.list.item(i).data(ID_ROLE)]

    def _open(self, item: QListWidgetItem) -> None:
        cid = item.data(ID_ROLE)
        if cid:
            self.open_requested.emit(int(cid))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None or not item.data(ID_ROLE):
            return
        cid = int(item.data(ID_ROLE))
        menu = QMenu(self)
        title = item.data(TITLE_ROLE) or item.text()
        menu.addAction("Rename…", lambda: self._rename(cid, title))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(cid, "markdown"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self._delete(cid, title))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def _rename(self, cid: int, title: str) -> None:
        new, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=title)
        if ok and new.strip():
            self.rename_requested.emit(cid, new.strip())

    def _delete(self, cid: int, title: str) -> None:
        if QMessageBox.question(self, "Delete chat", f"Delete “{title}” for good?") == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(cid)
