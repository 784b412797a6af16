"""MainWindow: layout, menus, shortcuts — and the one place where views are connected to the worker."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QApplication, QDockWidget, QFileDialog, QMainWindow, QMessageBox, QStackedWidget, QWidget

from tessera.app import paths
from tessera.app.chat_controller import ChatController
from tessera.app.export import to_json, to_markdown, write_atomic
from tessera.app.fit import estimate, ram_available
from tessera.app.payloads import BackendList, GenerationResult, ModelState, ModelSummary, WorkerError
from tessera.app.settings import Settings
from tessera.app.store import ConversationStore
from tessera.app.theme import apply_theme, is_dark, set_font_size
from tessera.app.views.chat_view import ChatView
from tessera.app.views.graphs import GraphsPanel
from tessera.app.views.model_panel import ModelPanel
from tessera.app.views.pack_writes_dialog import PackWritesDialog
from tessera.app.views.serve_panel import ServePanel
from tessera.app.views.settings_dialog import SettingsDialog
from tessera.app.views.sidebar import ConversationSidebar
from tessera.app.views.status_bar import TesseraStatusBar
from tessera.app.views.welcome import WelcomePage
from tessera.app.wizards.convert_wizard import ConvertWizard
from tessera.app.wizards.hardware_wizard import HardwareWizard

# Below this window height the graphs dock starts hidden (View > Graphs shows it): at 1024x700 it took 250 px and left
# the transcript about 230. Above it, a dock hidden for that reason comes back.
SMALL_WINDOW_HEIGHT = 760

def _first_paragraph(markdown_text: str, limit: int = 400) -> str:
    """The first paragraph of a model card that is not a heading (the demo button's tooltip)."""
    for block in markdown_text.split("\n\n"):
        block = block.strip()
        if block and not block.startswith(("#", "---", "|", "```")):
            return " ".join(block.split())[:limit]
    return ""


class MainWindow(QMainWindow):
    model_ready = Signal(bool)  # emitted once per load attempt (True: loaded); used by --screenshot

    def __init__(self, settings: Settings, store: ConversationStore, worker, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings
        self.store = store
        self.worker = worker
        self.state = ModelState(False)
        self.backend_list: BackendList | None = None
        self.settings_dialog: SettingsDialog | None = None
        self.error_box: QMessageBox | None = None
        self.pack_writes_dialog: PackWritesDialog | None = None  # shown by closeEvent while packs are being written
        self.last_error: WorkerError | None = None
        self._loading = False
        self.fits: dict[str, object] = {}  # path -> FitEstimate of the last inspection
        self._export_folder = ""  # where the last export went (the next export dialog starts there)
        self.setWindowTitle("Tessera")
        self.setAcceptDrops(True)
        dark = is_dark(settings.get("ui/theme"))

        self.controller = ChatController(store, worker, settings, parent=self)
        self.chat = ChatView(dark)
        self.welcome = WelcomePage()
        self.pages = QStackedWidget()
        self.pages.addWidget(self.welcome)
        self.pages.addWidget(self.chat)
        self.setCentralWidget(self.pages)

        self.sidebar = ConversationSidebar()
        self.model_panel = ModelPanel()
        self.graphs = GraphsPanel(dark)
        self.graphs.set_measured_bandwidth(settings.get("hardware/bandwidth_gbs"))
        self.sidebar_dock = self._dock("Conversations", self.sidebar, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.model_dock = self._dock("Model", self.model_panel, Qt.DockWidgetArea.RightDockWidgetArea)
        self.serve_panel = ServePanel()
        self.serve_dock = self._dock("Serve", self.serve_panel, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tabifyDockWidget(self.model_dock, self.serve_dock)
        self.model_dock.raise_()
        self.graphs_dock = self._dock("Graphs", self.graphs, Qt.DockWidgetArea.BottomDockWidgetArea)
        self._graphs_auto_hidden = False  # hidden by fit_docks_to_window, not by the user
        self._graphs_chosen = False  # the user showed or hid it: the window size no longer decides
        self.graphs_dock.toggleViewAction().triggered.connect(self._graphs_toggled_by_user)
        self.status = TesseraStatusBar()
        self.setStatusBar(self.status)

        self._menus()
        self._connect()
        icons = [p for p in paths.app_icon_files() if p.stem.endswith("-128")] or paths.app_icon_files()[-1:]
        if icons:
            self.welcome.set_logo(str(icons[0]))
        demo = paths.demo_model()
        self.welcome.set_available("demo", demo is not None, "not shipped in this build")
        card = paths.demo_model_card()
        if card is not None:
            self.welcome.buttons["demo"].setToolTip(_first_paragraph(card.read_text(encoding="utf-8")))
        self.model_panel.set_recent(settings.get("recent/models"))
        self.chat.set_thinking(self.controller.thinking)
        self.refresh_conversations()
        self._update_page()
        if store.recovered:  # in the chat, where it stays until the next message (a load replaces status messages)
            n = store.recovered
            self.chat.show_notice(f"{n} {'reply was' if n == 1 else 'replies were'} interrupted when the app last "
                                  f"stopped; {'it is' if n == 1 else 'they are'} kept and marked \"interrupted\".")

        self._memory_timer = QTimer(self)
        self._memory_timer.timeout.connect(self._update_memory)
        self._memory_timer.start(2000)
        self._update_memory()
        self.resize(1280, 820)
        self.resizeDocks([self.graphs_dock], [250], Qt.Orientation.Vertical)
        self.resizeDocks([self.sidebar_dock, self.model_dock], [230, 300], Qt.Orientation.Horizontal)
        geometry = settings.get("window/geometry")
        if geometry:
            self.restoreGeometry(geometry)
        state = settings.get("window/state")
        if state:
            self.restoreState(state)
        worker.query_backends()

    # ---- construction
    def _dock(self, title: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock-{title.lower()}")
        dock.setWidget(widget)
        dock.setAccessibleName(f"{title} panel")
        self.addDockWidget(area, dock)
        return dock

    def open_remote(self) -> None:
        """The Remote engine: chat through an OpenAI-compatible server (profiles, keys, connection test)."""
        from tessera.app.remote_profiles import ProfileStore
        from tessera.app.views.remote_dialog import RemoteDialog

        dialog = RemoteDialog(ProfileStore(paths.data_dir()), self)
        dialog.test_requested.connect(lambda url, key: self.worker.test_remote(url, key))
        self.worker.remote_checked.connect(dialog.show_check)
        dialog.connect_requested.connect(lambda url, key, model: self.worker.connect_remote(url, key, model))
        self.remote_dialog = dialog  # tests drive it while it is open
        try:
            dialog.exec()
        finally:
            self.worker.remote_checked.disconnect(dialog.show_check)
            self.remote_dialog = None

    def _action(self, menu, text: str, slot, shortcut: str | None = None) -> QAction:
        action = QAction(text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _menus(self) -> None:
        bar = self.menuBar()
        m = bar.addMenu("&File")
        self.new_action = self._action(m, "&New chat", self.controller.new_conversation, "Ctrl+N")
        self._action(m, "&Open model…", self.model_panel.choose_file, "Ctrl+O")
        self._action(m, "Open model &folder…", self.model_panel.choose_folder)
        self.demo_action = self._action(m, "Open the &demo model", self.open_demo)
        self.demo_action.setEnabled(paths.demo_model() is not None)
        self._action(m, "Make a &test-drive model", self.make_test_drive)
        m.addSeparator()
        self._action(m, "Export chat as &Markdown…", lambda: self.export(self.controller.conversation_id, "markdown"))
        self._action(m, "Export chat as &JSON…", lambda: self.export(self.controller.conversation_id, "json"))
        m.addSeparator()
        self._action(m, "&Quit", self.close, "Ctrl+Q")
        m = bar.addMenu("&Model")
        self.unload_action = self._action(m, "&Unload", lambda: self.worker.unload())
        self._action(m, "&Remote server…", self.open_remote)
        self.settings_action = self._action(m, "&Settings…", self.open_settings, "Ctrl+,")
        m = bar.addMenu("&View")
        for dock in (self.sidebar_dock, self.model_dock, self.graphs_dock):
            m.addAction(dock.toggleViewAction())
        m = bar.addMenu("&Tools")
        self.wizard_actions = {
            "hardware": self._action(m, "&Hardware wizard…", lambda: self.open_wizard("hardware")),
            "convert": self._action(m, "&Conversion wizard…", lambda: self.open_wizard("convert")),
        }
        m = bar.addMenu("&Help")
        self._action(m, "&About Tessera", self._about)

    def _connect(self) -> None:
        w, c = self.worker, self.controller
        # worker -> views
        w.progress.connect(self.model_panel.show_progress)
        w.state_changed.connect(self.on_state)
        w.tokens.connect(self.graphs.add_chunk)
        w.tokens.connect(self._live_speed)
        w.finished.connect(self.on_finished)
        w.failed.connect(self.on_failed)
        w.inspected.connect(self.on_inspected)
        w.backends.connect(self.on_backends)
        w.state_changed.connect(self.serve_panel.set_state)
        w.serving.connect(self.serve_panel.show_state)
        self.serve_panel.serve_requested.connect(lambda on, network, port: w.serve(on, network, port))
        # controller <-> chat view
        c.conversation_reset.connect(self.chat.set_messages)
        c.conversation_reset.connect(lambda _m: self._update_page())
        c.message_added.connect(self.chat.append_message)
        c.message_changed.connect(self.chat.update_message)
        c.busy_changed.connect(self.chat.set_busy)
        c.context_changed.connect(self.chat.set_context)
        c.notice.connect(self.chat.show_notice)
        c.conversations_changed.connect(self.refresh_conversations)
        c.current_changed.connect(self.sidebar.set_current)
        self.chat.send_requested.connect(c.send)
        self.chat.stop_requested.connect(c.stop)
        self.chat.regenerate_requested.connect(c.regenerate)
        self.chat.edit_requested.connect(c.edit)
        self.chat.thinking_toggled.connect(c.set_thinking)
        self.chat.open_model_requested.connect(self.model_panel.choose_file)
        # sidebar
        self.sidebar.new_requested.connect(c.new_conversation)
        self.sidebar.open_requested.connect(c.open_conversation)
        self.sidebar.rename_requested.connect(c.rename)
        self.sidebar.delete_requested.connect(c.delete)
        self.sidebar.export_requested.connect(self.export)
        self.sidebar.search_changed.connect(lambda _t: self.refresh_conversations())
        # model panel
        # the worker's command methods only emit or set a flag; call them directly from this thread (a plain
        # connection to a method of an object living in the worker thread would be queued behind the running job)
        self.model_panel.inspect_requested.connect(self.inspect_model)
        self.model_panel.load_requested.connect(self.load_model)
        self.model_panel.cancel_requested.connect(lambda: w.cancel_load())
        self.model_panel.unload_requested.connect(lambda: w.unload())
        # welcome
        self.welcome.open_requested.connect(self.model_panel.choose_file)
        self.welcome.demo_requested.connect(self.open_demo)
        self.welcome.test_drive_requested.connect(self.make_test_drive)
        self.welcome.hardware_wizard_requested.connect(lambda: self.open_wizard("hardware"))
        self.welcome.convert_wizard_requested.connect(lambda: self.open_wizard("convert"))
        self.settings.changed.connect(self.on_setting_changed)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._desktop_scheme_changed)

    # ---- model
    def load_model(self, path: str) -> None:
        path = str(path)
        fit = self.fits.get(path)
        if fit is not None and fit.verdict == "won't fit" and not self.confirm_load(fit.text):
            return
        if self.model_panel.path != path:
            self.model_panel.choose(path)
        # refuse here what cannot load, so the model loaded now stays loaded
        if self.model_panel.unreadable and self.model_panel.path == path:
            self.statusBar().showMessage(f"{Path(path).name} cannot be read (see the model panel); "
                                         "the loaded model stays.", 8000)
            self.model_ready.emit(False)
            return
        if (self.settings.get("gpu/use") == "cuda" and self.backend_list is not None
                and not self.backend_list.device.startswith("cuda")):
            reason = self.backend_list.cuda_reason or "no CUDA device is available"
            self._offer_cpu_fallback(WorkerError("load", "placement", f"GPU use is cuda, but {reason}"))
            return
        self.model_panel.start_loading()
        self._loading = True
        self.statusBar().showMessage(f"Loading {Path(path).name}…")
        self.worker.load(path, self.settings.get("model/backend"), self.settings.get("model/threads"),
                         self.settings.get("model/context_length"), self.settings.get("gpu/use"),
                         self.settings.get("gpu/expert_cache"), self.settings.get("model/kv_cache_type"))

    def open_demo(self) -> None:
        demo = paths.demo_model()
        if demo is not None:
            self.load_model(str(demo))

    def make_test_drive(self) -> None:
        out = paths.test_drive_dir() / f"test-drive-{int(time.time())}.gguf"
        self.model_panel.path = str(out)
        self.model_panel.path_label.setText(f"Making {out.name}…")
        self.model_panel.start_loading()
        self._loading = True
        self.worker.make_test_model(str(out), self.settings.get("model/backend"), self.settings.get("model/threads"),
                                    self.settings.get("model/context_length"), self.settings.get("gpu/use"),
                                    self.settings.get("gpu/expert_cache"))

    def on_state(self, state: ModelState) -> None:
        was_loading, self._loading = self._loading, False
        switched = self.state.loaded and state.loaded and state.path == self.state.path and not was_loading
        self.state = state
        self.status.set_state(state)
        self.model_panel.set_state(state)
        self._settings_mode()
        self._show_demo_intro(state)
        self.graphs.twin = "twin" in state.device  # "cpu (twin of the GPU half)"
        self.controller.set_model(state.loaded, state.name, state.context_length)
        self.unload_action.setEnabled(state.loaded)
        if state.loaded and state.backend != "remote":  # a server's URL is not a model file to reopen
            self.settings.add_recent_model(state.path)
            self.model_panel.set_recent(self.settings.get("recent/models"))
        if state.loaded:
            if switched:
                self.statusBar().showMessage(f"Backend {state.backend}: {state.backend_reason}", 8000)
            else:
                self.statusBar().showMessage(f"Loaded {state.name} with backend {state.backend}", 5000)
            self.setWindowTitle(f"Tessera — {state.name}")
        else:
            self.setWindowTitle("Tessera")
        self._update_page()
        if was_loading:
            self.model_ready.emit(state.loaded)

    def _show_demo_intro(self, state: ModelState) -> None:
        """On the demo model an empty chat explains it and offers example prompts; on any other, the plain hint."""
        demo = paths.demo_model()
        on_demo = state.loaded and demo is not None and Path(state.path).resolve() == demo.resolve()
        if on_demo != (self.chat.intro is not None):
            self.chat.set_intro(paths.demo_examples() if on_demo else None)

    def inspect_model(self, path: str) -> None:
        """Read a model's header in the worker, its RAM sized for a load with the current settings."""
        self.worker.inspect(path, self.settings.get("model/context_length"), self.settings.get("model/backend"),
                            self.settings.get("model/kv_cache_type"))

    def on_inspected(self, summary: ModelSummary) -> None:
        fit = estimate(summary.info, ram_available(), self.backend_list.vram_free_bytes if self.backend_list else 0)
        self.fits[summary.path] = fit
        self.model_panel.show_summary(summary, fit.text)

    def confirm_load(self, fit_text: str) -> bool:
        """Before loading a model that will not fit: say so in numbers and let the user decide."""
        answer = QMessageBox.warning(self, "The model will probably not fit", fit_text + "\n\nLoad it anyway?",
                                     QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                     QMessageBox.StandardButton.No)
        return answer == QMessageBox.StandardButton.Yes

    def on_backends(self, backends: BackendList) -> None:
        self.backend_list = backends
        if self.settings_dialog is not None:
            self.settings_dialog.set_backends(backends)
            self.settings_dialog.set_gpu_status(backends)
        if not self.state.loaded:
            self.status.device_label.setText(f"device {backends.device}")

    def on_finished(self, result: GenerationResult) -> None:
        self.graphs.add_result(result)
        m = result.metrics
        if m.get("decode_tok_s") or m.get("prefill_tok_s"):
            self.status.set_speed(float(m.get("decode_tok_s", 0.0)), float(m.get("prefill_tok_s", 0.0)))

    def _live_speed(self, _chunk) -> None:
        """While a reply streams, the status bar shows the decode speed of the last steps (the graph's last point)."""
        if self.graphs.decode_y and self.graphs.decode_y[-1] == self.graphs.decode_y[-1]:
            self.status.set_speed(self.graphs.decode_y[-1])

    def on_failed(self, error: WorkerError) -> None:
        self.last_error = error
        if error.cancelled:
            self._loading = False
            self.model_panel.show_error(error.text)
            kept = f" {self.state.name} stays loaded." if self.state.loaded else ""
            self.statusBar().showMessage("Loading cancelled." + kept, 5000)
            self.model_ready.emit(False)
        elif error.operation == "load" and _needs_cuda(error) and self.settings.get("gpu/use") == "cuda":
            self._loading = False
            self.model_panel.show_error(error.text)
            self._offer_cpu_fallback(error)
        elif error.operation in ("load", "make"):
            self._loading = False
            self.model_panel.show_error(error.text)
            self.statusBar().showMessage(f"Could not load: {error.text}", 10000)
            self._show_error("Could not load the model", error)
            self.model_ready.emit(False)
        elif error.operation == "inspect":
            self.model_panel.show_inspect_error(error.text)
        elif error.operation == "backend":
            self._show_error("Could not switch the backend", error)
        elif error.operation == "generate":
            self.chat.show_notice(f"Generation failed: {error.text}")
        else:
            self.statusBar().showMessage(f"{error.operation} failed: {error.text}", 10000)

    def _offer_cpu_fallback(self, error: WorkerError) -> None:
        """GPU use is set to CUDA but this machine has none: say so, and run on the CPU only if the user accepts."""
        box = QMessageBox(QMessageBox.Icon.Question, "No CUDA device", error.text,
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, self)
        box.setInformativeText("Load the model with everything on the CPU instead? (Settings > GPU use becomes off.)")
        box.setWindowModality(Qt.WindowModality.WindowModal)
        path = self.model_panel.path

        def answered(_result: int) -> None:
            if box.standardButton(box.clickedButton()) == QMessageBox.StandardButton.Yes and path:
                self.settings.set("gpu/use", "off")
                self.load_model(path)
            else:
                self.model_ready.emit(False)

        box.finished.connect(answered)
        self.error_box = box
        box.open()

    def _show_error(self, title: str, error: WorkerError) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, title, error.text, QMessageBox.StandardButton.Ok, self)
        if error.detail:
            box.setDetailedText(error.detail)
        box.setInformativeText("The window stays usable: choose another model or fix the file and try again.")
        box.setWindowModality(Qt.WindowModality.WindowModal)
        self.error_box = box
        box.open()

    # ---- settings
    def open_settings(self) -> SettingsDialog:
        if self.settings_dialog is None:
            self.settings_dialog = SettingsDialog(self.settings, self.backend_list, self.state.loaded, self)
            self.settings_dialog.finished.connect(self._settings_closed)
            self.settings_dialog.clear_cache_requested.connect(self.worker.clear_pack_cache)
            self.worker.pack_cache.connect(self.settings_dialog.show_pack_cache)
            self.worker.query_backends()
        self._settings_mode()
        self.worker.query_pack_cache()
        self.settings_dialog.show()
        self.settings_dialog.raise_()
        return self.settings_dialog

    def _settings_mode(self) -> None:
        """The open settings dialog follows the engine in use: local-only settings are disabled with the reason
        while a remote server is in use, and enabled again when a local model (or none) takes over."""
        if self.settings_dialog is not None:
            remote = self.state.loaded and self.state.backend == "remote"
            self.settings_dialog.set_remote("Chatting through a remote server, which chooses its own backend, threads, "
                                            "context and GPU use and reads control tokens by its own rules: these "
                                            "settings apply to local models only." if remote else "")

    def _settings_closed(self, _result: int) -> None:
        self.worker.pack_cache.disconnect(self.settings_dialog.show_pack_cache)
        self.settings_dialog.deleteLater()
        self.settings_dialog = None

    def apply_theme(self) -> None:
        """The theme setting, applied: on a change of the setting, and for "system" when the desktop switches
        between light and dark."""
        theme = str(self.settings.get("ui/theme"))
        app = QApplication.instance()
        if app is not None:
            apply_theme(app, theme)
        self.graphs.set_dark(is_dark(theme))
        self.chat.dark = is_dark(theme)  # code colours: re-render the transcript
        self.chat.set_messages(list(self.controller.messages))

    def _desktop_scheme_changed(self, _scheme) -> None:
        if self.settings.get("ui/theme") == "system":
            self.apply_theme()

    def on_setting_changed(self, key: str, value) -> None:
        if key in ("model/backend", "model/context_length", "model/kv_cache_type") and self.model_panel.path:
            self.inspect_model(self.model_panel.path)  # the fit estimate follows the backend, context and KV type
        if key == "model/backend" and self.state.loaded:
            self.statusBar().showMessage(f"Repacking experts for {value}…")
            self.worker.set_backend(str(value))
        elif key == "ui/theme":
            self.apply_theme()
        elif key == "ui/font_size":
            app = QApplication.instance()
            if app is not None:
                set_font_size(app, int(value))
        elif key == "chat/thinking":
            self.chat.set_thinking(bool(value))
        elif key == "hardware/bandwidth_gbs":
            self.graphs.set_measured_bandwidth(float(value))

    # ---- conversations
    def refresh_conversations(self) -> None:
        search = self.sidebar.search.text().strip()
        conversations = self.store.conversations(search)
        snippets = {c.id: self.store.snippet(c.id, search) for c in conversations} if search else None
        self.sidebar.set_conversations(conversations, self.controller.conversation_id, snippets)

    def export(self, conversation_id: int, fmt: str) -> None:
        conv = self.store.conversation(conversation_id) if conversation_id else None
        if conv is None:
            self.statusBar().showMessage("Nothing to export: open a conversation first.", 5000)
            return
        ext, flt = (".md", "Markdown (*.md)") if fmt == "markdown" else (".json", "JSON (*.json)")
        name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conv.title).strip() or "chat"
        start = Path(self._export_folder or Path.home()) / (name + ext)  # the last folder used, else home
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", str(start), flt)
        if path:
            self._export_folder = str(Path(path).parent)
            messages = self.store.messages(conversation_id)
            write_atomic(path, to_markdown(conv, messages) if fmt == "markdown" else to_json(conv, messages))
            self.statusBar().showMessage(f"Exported to {path}", 5000)

    # ---- misc
    def open_wizard(self, kind: str):
        if kind == "hardware":
            wizard = HardwareWizard(self, model_path=self.state.path or None,
                                    context_length=self.settings.get("model/context_length"),
                                    backend=self.settings.get("model/backend"))
            wizard.report_ready.connect(self.on_hardware_report)
        else:
            wizard = ConvertWizard(self, backend=self.settings.get("model/backend"))
            wizard.converted.connect(self.on_converted)
            wizard.open_requested.connect(self.load_model)
        wizard.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        wizard.open()
        return wizard

    def on_hardware_report(self, report: dict) -> None:
        """Keep the measured read bandwidth: the graphs compare the achieved expert-weight bytes/s with it."""
        gbs = (report.get("memory") or {}).get("read_bandwidth_gbs")
        if gbs:
            self.settings.set("hardware/bandwidth_gbs", round(float(gbs), 2))

    def on_converted(self, path: str) -> None:
        self.model_panel.choose(path)
        self.statusBar().showMessage(f"Converted to {path}: press Load in the model panel to chat with it.", 10000)

    def _about(self) -> None:
        QMessageBox.about(self, "About Tessera", "Tessera: chat with Qwen3-MoE models locally, "
                                                 "experts on the CPU, the rest on the GPU.")

    def _update_page(self) -> None:
        show_chat = self.state.loaded or bool(self.controller.messages) or self._loading
        self.pages.setCurrentWidget(self.chat if show_chat else self.welcome)

    def _update_memory(self) -> None:
        self.status.set_memory(psutil.Process().memory_info().rss)
        self.status.set_pack_writes(self.worker.pack_writes_left(), self.worker.pack_hashing_left())

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.model_panel.dragEnterEvent(event)

    def dropEvent(self, event) -> None:  # noqa: N802
        self.model_panel.dropEvent(event)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self.fit_docks_to_window()

    def fit_docks_to_window(self) -> None:
        """A small window hides the graphs dock by default, so the transcript keeps its height; a larger one shows
        it again. Once the user shows or hides it (View > Graphs), their choice stands."""
        if self._graphs_chosen:
            return
        small = self.height() < SMALL_WINDOW_HEIGHT
        if small and not self.graphs_dock.isHidden():
            self.graphs_dock.hide()
            self._graphs_auto_hidden = True
        elif not small and self._graphs_auto_hidden:
            self._graphs_auto_hidden = False
            self.graphs_dock.show()

    def _graphs_toggled_by_user(self, _checked: bool) -> None:
        self._graphs_chosen = True
        self._graphs_auto_hidden = False

    def closeEvent(self, event) -> None:  # noqa: N802
        self.worker.stop()
        if self.worker.pack_writes_left() > 0:  # a first load's packs still on their way to the disk: say so, wait
            event.ignore()  # (the dialog closes the window again once they are written or skipped)
            if self.pack_writes_dialog is None:
                self.pack_writes_dialog = PackWritesDialog(self.worker.pack_writes_left, self.worker.skip_pack_writes,
                                                           self.worker.pack_work_text, self)
                self.pack_writes_dialog.written.connect(self.close)
                self.pack_writes_dialog.open()
            return
        self.settings.set("window/geometry", bytes(self.saveGeometry().data()))
        if self._graphs_auto_hidden:  # saved as the user left it: a larger window next time shows the graphs
            self.graphs_dock.show()
        self.settings.set("window/state", bytes(self.saveState().data()))
        self.settings.sync()
        super().closeEvent(event)


def _needs_cuda(error: WorkerError) -> bool:
    """The engine refused a plan that puts parts on CUDA because this machine has no CUDA device."""
    return error.subject == "placement" and "no CUDA device" in error.message
