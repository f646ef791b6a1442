"""A task started by itself (the tune, TuneRequest.yields) gives way: its cancel check reads true while
another task or idle work waits in the engine child; any other task's only when it is cancelled."""
from __future__ import annotations

import queue

from app.cancel_book import CancelBook
from app.engine_child import _run_task
from app.engine_protocol import TaskKind, TaskMessage, TuneRequest


def test_a_task_that_yields_stops_when_other_work_waits_and_no_other_does():
    seen = {}

    def handler(engine, payload, on_event, cancel):
        seen[(payload.yields, waiting[0])] = cancel()
        return "done"

    waiting = [True]
    book = CancelBook(queue.Queue(), busy=lambda: waiting[0])
    for busy in (True, False):
        waiting[0] = busy
        for tid, yields in ((1, False), (2, True)):
            _run_task(None, TaskMessage(tid, TaskKind.TUNE, TuneRequest(yields=yields)), queue.Queue(), book,
                      {TaskKind.TUNE: handler})
    assert seen == {(False, True): False, (True, True): True, (False, False): False, (True, False): False}
