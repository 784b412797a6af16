"""Helpers for the server tests: a real uvicorn server on 127.0.0.1 (free port) over a real Session, and a way to
hold the engine busy so queueing can be observed deterministically."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tessera.engine.scheduler import EngineScheduler
from tessera.engine.server.app import ServerOptions
from tessera.engine.server.run import ServerThread

DEMO = Path(__file__).resolve().parents[2] / "tessera" / "resources" / "demo" / "tessera-demo-moe.gguf"
NAME = "tessera-demo-moe"


@dataclass
class Running:
    scheduler: EngineScheduler
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


@contextlib.contextmanager
def running_server(session, *, api_key: str | None = None, max_waiting: int = 8,
                   max_body_bytes: int = 4 << 20):
    scheduler = EngineScheduler(session, max_waiting=max_waiting)
    server = ServerThread(scheduler, ServerOptions(NAME, api_key, max_body_bytes)).start()
    try:
        yield Running(scheduler, server)
    finally:
        server.stop()
        scheduler.close()


@contextlib.contextmanager
def engine_held(scheduler: EngineScheduler):
    """Occupy the engine thread (a queued call that waits) until the block ends: requests queue behind it."""
    started, release = threading.Event(), threading.Event()

    def hold(session):
        started.set()
        release.wait(60)

    future = scheduler.call(hold)
    assert started.wait(30), "the engine thread never picked up the hold"
    try:
        yield
    finally:
        release.set()
        future.result(30)


def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def serving_app(app):
    """Any ASGI app (e.g. a scripted misbehaving server) under uvicorn on a free loopback port; yields its base URL."""
    import uvicorn

    from tessera.engine.server.run import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the scripted server")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
