"""Run the OpenAI-compatible server with uvicorn: in the foreground (`tessera-cli serve`) or on a background thread
(the app's "Serve this model", tests). The socket is bound here first, so a taken port or a bad address is a named
error before anything starts, and port 0 picks a free port (`ServerThread.port`)."""

from __future__ import annotations

import ipaddress
import socket
import threading

from tessera.engine.errors import TesseraError
from tessera.engine.scheduler import EngineScheduler
from tessera.engine.server.app import ServerOptions, create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Loopback is the default; any other address serves the network and so needs an API key."""
    if not is_loopback(host) and not api_key:
        raise TesseraError("--host", f"{host} is reachable from other machines, so serving there needs an API key: "
                                     "add --api-key KEY (or serve on 127.0.0.1)")


def bind_socket(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise TesseraError("--port", f"must be in 0..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise TesseraError("--host", f"{host} is not an address of this machine: {e.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise TesseraError("--port", f"cannot listen on {host}:{port}: {e.strerror}") from None
    # Listen at once: a client that connects after "serving at URL" is printed, before uvicorn has started, waits in
    # the backlog instead of being refused.
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/v1"


class ServerThread:
    """uvicorn serving `scheduler` on a daemon thread. `start()` returns once it accepts connections; `stop()` ends it
    (open streams are cancelled, which cancels their generations)."""

    def __init__(self, scheduler: EngineScheduler, options: ServerOptions, *, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning"):
        import uvicorn

        check_bind(host, options.api_key)
        self.host = host
        self._socket = bind_socket(host, port)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(create_app(scheduler, options), log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=2, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="tessera-server", daemon=True)

    @property
    def url(self) -> str:
        return base_url(self.host, self.port)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        waited = threading.Event()
        for _ in range(int(timeout / 0.02)):
            if self._server.started or not self._thread.is_alive():
                break
            waited.wait(0.02)
        if not self._server.started:
            raise TesseraError("server", f"did not start on {self.url}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()


def serve_forever(scheduler: EngineScheduler, options: ServerOptions, sock: socket.socket, *,
                  log_level: str = "info") -> None:
    """Serve on a socket from bind_socket (after check_bind) in this thread until interrupted (Ctrl-C)."""
    import uvicorn

    config = uvicorn.Config(create_app(scheduler, options), log_level=log_level, timeout_graceful_shutdown=5,
                            lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
