""""Serve this model": the app's loaded Session served over the OpenAI API, shared with the app's own chat. Qt-free.

While serving, every request to the Session, the app's chat included, goes through one EngineScheduler (arrival
order, one at a time), so the chat and the server's clients never run on the Session at once and each reuses its own
cached prefixes. The worker (tessera/app/worker.py) owns the LocalServer and routes its chat through `LocalServer.chat`.
"""

from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 8080


@dataclass(frozen=True)
class ServeState:
    """What the "Serve this model" panel shows (the worker's `serving` signal)."""

    running: bool
    url: str = ""
    api_key: str = ""  # shown to the user to copy; never stored, logged or exported
    model: str = ""
    error: str = ""


def new_api_key() -> str:
    """A fresh random key shown to the user (never stored, logged or exported)."""
    return "tsk-" + secrets.token_urlsafe(24)


class LocalServer:
    """tessera-cli serve's server on a thread, over an already loaded Session."""

    def __init__(self, session, *, model_path: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 api_key: str | None = None, max_waiting: int = 8):
        from tessera.engine.cli.serve import served_name
        from tessera.engine.scheduler import EngineScheduler
        from tessera.engine.server.app import ServerOptions
        from tessera.engine.server.run import ServerThread

        self.session = session
        self.model_name = served_name(str(Path(model_path)))
        self.api_key = api_key
        self.scheduler = EngineScheduler(session, max_waiting=max_waiting)
        try:
            self._server = ServerThread(self.scheduler, ServerOptions(self.model_name, api_key), host=host,
                                        port=port).start()
        except BaseException:
            self.scheduler.close()
            raise

    @property
    def url(self) -> str:
        """The base URL to give clients (this machine's name when serving on every address)."""
        if self._server.host in ("0.0.0.0", "::"):
            import socket

            from tessera.engine.server.run import base_url

            return base_url(socket.gethostname(), self._server.port)
        return self._server.url

    def stop(self) -> None:
        """Stop serving (open streams are cancelled), then the scheduler; the Session stays loaded."""
        try:
            self._server.stop()
        finally:
            self.scheduler.close()

    def chat(self, messages: list[dict], params, *, enable_thinking: bool = True,
             cancel: threading.Event | None = None, on_step: Callable | None = None,
             allow_special_tokens: bool = False) -> Iterator:
        """Session.chat's events, run in turn with the server's requests. on_step is called on the caller's thread
        (the engine thread only queues the step figures), exactly as with a direct Session.chat. The app's own
        allow_special_tokens applies to the app's chat only; the server's clients always get it off."""
        cancel = cancel or threading.Event()
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        events = self.session.chat(messages, params, enable_thinking=enable_thinking, cancel=cancel,
                                   on_step=lambda m: inbox.put(("step", m)), allow_special_tokens=allow_special_tokens)
        ticket = self.scheduler.submit(events, cancel=cancel, on_event=lambda e: inbox.put(("event", e)),
                                       bounded=False)  # the app's own chat always gets a place in the queue
        return self._relay(inbox, ticket, on_step)

    @staticmethod
    def _relay(inbox: queue.SimpleQueue, ticket, on_step) -> Iterator:
        from tessera.engine.events import DoneEvent

        try:
            while True:
                kind, item = inbox.get()
                if kind == "step":
                    if on_step is not None:
                        on_step(item)
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, DoneEvent):
                    return
        finally:
            ticket.cancel()  # a consumer that stops early stops the generation too; no-op once done

    def call(self, fn: Callable):
        """Run fn(session) between requests (e.g. a backend switch) and return its result."""
        return self.scheduler.call(fn).result()
