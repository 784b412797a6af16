"""One Session shared by several clients (the app's chat, the OpenAI-compatible server): requests run one at a time,
in the order they were submitted, on one engine thread. Qt-free.

A Session serves one request at a time and keeps finished requests' K/V in its prefix cache keyed by token ids, so
serializing whole requests is all it takes for two clients never to corrupt each other's KV: each request gets the
cache of its own longest prefix, whoever computed it.

    scheduler = EngineScheduler(session, max_waiting=8)
    cancel = threading.Event()
    events = session.chat(messages, params, cancel=cancel)  # request errors raise here, in the caller's thread
    ticket = scheduler.submit(events, cancel=cancel)         # QueueFullError when max_waiting requests already wait
    for event in ticket.events(): ...                        # TokenEvent..., then DoneEvent (or the error raised)

`Session.chat`/`generate` validate and tokenize when called and touch the model only when the returned iterator runs,
which here happens on the engine thread. `on_event` (called on the engine thread) replaces `ticket.events()` for
consumers with their own loop (asyncio, Qt signals). `call(fn)` runs `fn(session)` in the same order (backend switch).
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from engine.errors import TesseraError
from engine.events import DoneEvent, RequestMetrics, TokenEvent

Event = TokenEvent | DoneEvent | BaseException  # an exception is the last item of a request that failed


class QueueFullError(TesseraError):
    """max_waiting requests are already waiting for the engine."""


class SchedulerClosedError(TesseraError):
    """The scheduler was closed (the model was unloaded or the server stopped)."""


class Ticket:
    """A submitted request: its cancel flag and its events (TokenEvent..., then a DoneEvent or an exception)."""

    def __init__(self, events: Iterator, cancel: threading.Event, on_event: Callable[[Event], None] | None):
        self._iterator = events
        self.cancel_event = cancel
        self._queue: queue.SimpleQueue | None = None
        if on_event is None:
            self._queue = queue.SimpleQueue()
            on_event = self._queue.put
        self._on_event = on_event
        self.started = threading.Event()  # set when the engine thread begins this request
        self.finished = threading.Event()  # set after its last event was delivered

    def cancel(self) -> None:
        """Stop this request: before the engine's next forward step if running, without running it if still queued."""
        self.cancel_event.set()

    def events(self, timeout: float | None = None) -> Iterator[TokenEvent | DoneEvent]:
        """The request's events as they come (blocking); an error of the request is raised here. Only without
        on_event. timeout: seconds to wait for each event (queue.Empty beyond it)."""
        if self._queue is None:
            raise RuntimeError("this ticket delivers its events to on_event")
        while True:
            item = self._queue.get(timeout=timeout)
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, DoneEvent):
                return

    def _emit(self, item: Event) -> None:
        try:
            self._on_event(item)
        except Exception:  # the consumer is gone (e.g. its event loop closed): nobody wants the rest
            self.cancel_event.set()


def cancelled_done() -> DoneEvent:
    """The DoneEvent of a request cancelled before it ran."""
    return DoneEvent("", [], RequestMetrics(stop_reason="cancelled"))


class EngineScheduler:
    """Runs submitted requests on one engine thread, first come first served. `max_waiting` bounds the requests
    waiting behind the running one (QueueFullError beyond); unbounded submissions (the app's own chat) skip that
    check but still wait their turn."""

    def __init__(self, session, *, max_waiting: int = 8, name: str = "tessera-engine"):
        if max_waiting < 0:
            raise TesseraError("--max-queue", f"must be >= 0, got {max_waiting}")
        self.session = session
        self.max_waiting = max_waiting
        self._pending: collections.deque = collections.deque()  # Ticket | (fn, Future)
        self._running: Ticket | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ---- submitting ----------------------------------------------------------------------------------------------

    def submit(self, events: Iterator, *, cancel: threading.Event | None = None,
               on_event: Callable[[Event], None] | None = None, bounded: bool = True) -> Ticket:
        """Queue an event iterator from `session.chat`/`generate` (made with this `cancel` event)."""
        ticket = Ticket(events, cancel or threading.Event(), on_event)
        with self._cond:
            if self._closed:
                _close_quietly(events)
                raise SchedulerClosedError("engine", "is shut down")
            if bounded and self.waiting >= self.max_waiting:
                _close_quietly(events)
                raise QueueFullError(
                    "engine", f"{self.waiting} requests are already waiting (at most {self.max_waiting}); try later")
            self._pending.append(ticket)
            self._cond.notify()
        return ticket

    def call(self, fn: Callable, *, bounded: bool = False) -> Future:
        """Run fn(session) on the engine thread between requests (e.g. set_backend); its result or error in a Future."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("engine", "is shut down")
            if bounded and self.waiting >= self.max_waiting:
                raise QueueFullError("engine", f"{self.waiting} requests are already waiting; try later")
            self._pending.append((fn, future))
            self._cond.notify()
        return future

    @property
    def waiting(self) -> int:
        """Requests queued behind the running one."""
        return len(self._pending)

    @property
    def busy(self) -> bool:
        return self._running is not None or bool(self._pending)

    def close(self, timeout: float | None = 30.0) -> None:
        """Cancel the waiting and running requests, stop the engine thread. The session stays open (its owner closes
        it)."""
        with self._cond:
            self._closed = True
            for item in self._pending:
                if isinstance(item, Ticket):
                    item.cancel()
                else:
                    item[1].cancel()
            if self._running is not None:
                self._running.cancel()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ---- the engine thread ---------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                item = self._pending.popleft()
                if isinstance(item, Ticket):
                    self._running = item
            try:
                if isinstance(item, Ticket):
                    self._run(item)
                else:
                    self._call(*item)
            finally:
                with self._cond:
                    self._running = None

    def _call(self, fn: Callable, future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(self.session)
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(e)
        else:
            future.set_result(result)

    def _run(self, ticket: Ticket) -> None:
        ticket.started.set()
        events = ticket._iterator
        try:
            if ticket.cancel_event.is_set():
                ticket._emit(cancelled_done())
                return
            for event in events:
                ticket._emit(event)
        except BaseException as e:  # noqa: BLE001 - the request's error goes to its consumer, the engine carries on
            ticket._emit(e)
        finally:
            _close_quietly(events)
            ticket.finished.set()


def _close_quietly(events) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - closing a generator that failed already
            pass
