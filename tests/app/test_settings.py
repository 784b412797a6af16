"""Settings: one table, typed values, persisted; the dialog is generated from the table and round-trips."""

from __future__ import annotations

import pytest
from app_fakes import BACKENDS
from PySide6.QtCore import Qt

from tessera.app.payloads import BackendList
from tessera.app.settings import BY_KEY, TABLE, Settings, physical_cores
from tessera.app.views.settings_dialog import SettingsDialog


def test_defaults_and_round_trip(tmp_path):
    path = tmp_path / "settings.ini"
    s = Settings(path)
    assert s.get("model/threads") == physical_cores()
    assert s.get("sampling/temperature") == 0.6 and s.get("chat/thinking") is True
    changes = []
    s.changed.connect(lambda k, v: changes.append((k, v)))
    s.set("sampling/temperature", 0.25)
    s.set("sampling/top_k", 7)
    s.set("chat/thinking", False)
    s.set("chat/system_prompt", "Be brief, = and ; are fine")
    s.set("model/backend", "AVX512")
    s.add_recent_model("/m/a.gguf")
    s.add_recent_model("/m/b")
    s.add_recent_model("/m/a.gguf")
    s.set("sampling/top_k", 7)  # unchanged: no signal
    s.sync()
    assert ("sampling/top_k", 7) in changes and len([c for c in changes if c[0] == "sampling/top_k"]) == 1
    t = Settings(path)  # a new process reading the same file
    assert t.get("sampling/temperature") == 0.25 and isinstance(t.get("sampling/top_k"), int)
    assert t.get("chat/thinking") is False and t.get("chat/system_prompt") == "Be brief, = and ; are fine"
    assert t.get("model/backend") == "AVX512" and t.get("recent/models") == ["/m/a.gguf", "/m/b"]
    with pytest.raises(ValueError, match="ui/theme"):
        t.set("ui/theme", "purple")
    with pytest.raises(KeyError):
        t.get("no/such/key")


def test_table_is_the_only_schema():
    assert len(BY_KEY) == len(TABLE)
    import pathlib

    app_dir = pathlib.Path(__file__).resolve().parents[2] / "tessera" / "app"
    users = [p for p in app_dir.rglob("*.py") if "QSettings(" in p.read_text()]
    assert [p.name for p in users] == ["settings.py"]


def test_dialog_round_trip_and_disabled_backends(qtbot, tmp_path):
    path = tmp_path / "settings.ini"
    s = Settings(path)
    backends = BackendList(dict(BACKENDS), "AVX512", "best available on this CPU")
    d = SettingsDialog(s, backends)
    qtbot.addWidget(d)
    assert not d.backend_enabled("AMXInt8") and d.backend_enabled("AVX512")
    combo = d.editors["model/backend"]
    assert combo.itemData(combo.findText("AMXInt8"), Qt.ItemDataRole.ToolTipRole) == "CPU lacks amx_int8"
    assert "AVX512" in combo.itemData(combo.findText("Auto"), Qt.ItemDataRole.ToolTipRole)
    d.set_value("model/backend", "Reference")
    d.set_value("sampling/top_p", 0.8)
    d.set_value("model/context_length", 8192)
    d.set_value("chat/system_prompt", "You are terse.")
    d.set_value("ui/theme", "dark")
    d.accept()
    t = Settings(path)
    assert (t.get("model/backend"), t.get("sampling/top_p"), t.get("model/context_length")) == ("Reference", 0.8, 8192)
    assert t.get("chat/system_prompt") == "You are terse." and t.get("ui/theme") == "dark"
    d2 = SettingsDialog(t, None)  # shows the stored values
    qtbot.addWidget(d2)
    assert d2.value("sampling/top_p") == 0.8 and d2.value("model/backend") == "Reference"
    d2.restore_defaults()
    assert d2.value("sampling/top_p") == 0.95
