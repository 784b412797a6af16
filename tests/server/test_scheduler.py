"""EngineScheduler: one Session, requests in submission order, bounded queue, cancellation queued and running,
calls between requests, and no cross-talk between interleaved conversations' KV."""

from __future__ import annotations

import threading

import pytest
from server_support import engine_held, wait_until

from tessera.engine.errors import TesseraError
from tessera.engine.events import DoneEvent
from tessera.engine.sampling import SamplingParams
from tessera.engine.scheduler import EngineScheduler, QueueFullError, SchedulerClosedError

GREEDY = SamplingParams(temperature=0, max_tokens=80)


def ask(text):
    return [{"role": "user", "content": text}]


@pytest.fixture
def scheduler(served_session):
    s = EngineScheduler(served_session, max_waiting=2)
    yield s
    s.close()


def submit_chat(scheduler, messages, params=GREEDY, **kw):
    cancel = threading.Event()
    events = scheduler.session.chat(messages, params, cancel=cancel)
    return scheduler.submit(events, cancel=cancel, **kw)


def final(ticket) -> DoneEvent:
    return list(ticket.events(timeout=120))[-1]


def test_requests_run_in_submission_order_and_match_a_lone_session(scheduler, reference_session):
    prompts = ["What is 12 + 30?", "Sort [9, 2, 5].", "How many r's are in strawberry?", "What is 12 + 30?"]
    done: dict[int, DoneEvent] = {}
    order = []

    def on_event(i, e):
        if isinstance(e, DoneEvent):
            order.append(i)
            done[i] = e

    with engine_held(scheduler):
        tickets = [submit_chat(scheduler, ask(p), bounded=False, on_event=lambda e, i=i: on_event(i, e))
                   for i, p in enumerate(prompts)]
        assert scheduler.waiting == 4
    wait_until(lambda: all(t.finished.is_set() for t in tickets), 120, "the requests")
    assert order == [0, 1, 2, 3]
    for i, p in enumerate(prompts):  # interleaved conversations through one prefix cache: each answer unchanged
        assert done[i].text == list(reference_session.chat(ask(p), GREEDY))[-1].text
    assert done[3].metrics.reused_tokens > 0  # the repeated prompt came from the prefix cache


def test_queue_bound_gives_queue_full_and_cancel_frees_the_slot(scheduler):
    with engine_held(scheduler):
        a = submit_chat(scheduler, ask("Sort [1, 2, 3]."))
        b = submit_chat(scheduler, ask("Sort [4, 5, 6]."))
        with pytest.raises(QueueFullError) as e:
            submit_chat(scheduler, ask("Sort [7, 8, 9]."))
        assert "at most 2" in e.value.message
        assert scheduler.waiting == 2
        b.cancel()  # leaves the queue at once, with a cancelled DoneEvent
        assert scheduler.waiting == 1 and b.finished.is_set()
        b_done = final(b)
        assert b_done.metrics.stop_reason == "cancelled" and b_done.token_ids == []
        c = submit_chat(scheduler, ask("Sort [7, 8, 9]."))
    assert final(a).metrics.stop_reason == "eos" and final(c).metrics.stop_reason == "eos"
    assert scheduler.stats["cancelled"] == 1 and scheduler.stats["completed"] == 2


def test_cancelling_a_running_request_stops_it_within_one_token(scheduler):
    seen = []
    gate = threading.Event()

    def on_event(e):
        seen.append(e)
        if len(seen) == 3:
            ticket.cancel()
            gate.set()

    long = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
    cancel = threading.Event()
    ticket = scheduler.submit(scheduler.session.chat(ask("Sort [1, 2]."), long, cancel=cancel), cancel=cancel,
                              on_event=on_event)
    wait_until(ticket.finished.is_set, 120, "the cancelled request")
    done = seen[-1]
    assert isinstance(done, DoneEvent) and done.metrics.stop_reason == "cancelled"
    assert len(done.token_ids) == 3  # the token being handed over when cancel came, and no further forward step


def test_errors_of_a_request_go_to_its_consumer_and_the_engine_carries_on(scheduler):
    def broken():
        yield from ()
        raise TesseraError("session", "broke")

    ticket = scheduler.submit(broken())
    with pytest.raises(TesseraError):
        list(ticket.events(timeout=30))
    assert final(submit_chat(scheduler, ask("Sort [3, 1]."))).metrics.stop_reason == "eos"
    assert scheduler.stats["failed"] == 1


def test_call_runs_between_requests_and_close_refuses_new_work(scheduler):
    assert scheduler.call(lambda s: s.context_length).result(30) == scheduler.session.context_length
    scheduler.close()
    with pytest.raises(SchedulerClosedError):
        submit_chat(scheduler, ask("Sort [3, 1]."))
