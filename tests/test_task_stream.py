"""The one task stream (app/task_stream.py): a Task takes events then one end, its cancel reaches the source
once, a source's TaskTable drops what is not pending, and the readers (blocking, asyncio) see the messages in
order. A structural test holds that no other module of app/ or ui/ keeps a table of pending tasks."""
from __future__ import annotations

import ast
import asyncio
import threading
from pathlib import Path

from app.engine_protocol import TaskCancelled, TaskDone, TaskEvent, TaskFailed
from app.job_runner import JobRunner
from app.task_stream import PENDING, LoopReader, Task, TaskReader, TaskTable

ROOT = Path(__file__).resolve().parent.parent


def bound(task_id: int = 1) -> tuple[Task, list, list]:
    """A task bound as `task_id`, the messages its listener got, and the stops the source got."""
    got, stops = [], []
    task = Task("kind", "payload", got.append).bind(task_id, lambda: stops.append(task_id))
    return task, got, stops


def test_events_then_one_end_and_nothing_after():
    task, got, _ = bound()
    task.deliver(TaskEvent(1, "a"))
    task.deliver(TaskEvent(1, "b"))
    assert task.state == PENDING and task.running()
    task.deliver(TaskDone(1, "result"))
    task.deliver(TaskEvent(1, "late"))  # after the end: nobody waits for it
    task.deliver(TaskFailed(1, "E", "a second end"))
    assert [m.event for m in got[:2]] == ["a", "b"] and got[2] == TaskDone(1, "result") and len(got) == 3
    assert task.state == "done" and task.end == TaskDone(1, "result") and task.payload is None


def test_a_listener_that_comes_late_gets_the_end_and_a_bad_one_loses_no_message():
    task, got, _ = bound()
    task.listen(lambda msg: 1 / 0)  # raises on every message: the next listener still gets each
    later: list = []
    task.listen(later.append)
    task.deliver(TaskEvent(1, "a"))
    task.deliver(TaskFailed(1, "E", "m"))
    assert len(got) == 2 and len(later) == 2
    after: list = []
    task.listen(after.append)
    assert after == [TaskFailed(1, "E", "m")] and task.state == "failed"


def test_cancel_reaches_the_source_once_then_the_end_comes():
    task, got, stops = bound(7)
    task.cancel()
    task.cancel()
    assert stops == [7] and task.cancel_requested and task.running()
    task.deliver(TaskCancelled(7, "stopped"))
    task.cancel()  # ended: left as it is
    assert stops == [7] and task.state == "cancelled" and got == [TaskCancelled(7, "stopped")]


def test_a_cancel_before_the_source_took_it_goes_when_it_does():
    stops: list = []
    task = Task("kind")
    task.cancel()
    assert stops == [] and task.id is None
    task.bind(3, lambda: stops.append(3))
    assert stops == [3]
    ended = Task("kind")
    ended.deliver(TaskFailed(0, "EngineError", "The server is stopping."))
    ended.cancel()
    ended.bind(4, lambda: stops.append(4))
    assert stops == [3]  # an ended task is never stopped


def test_the_table_delivers_to_pending_tasks_and_ignores_unknown_ids():
    table = TaskTable()
    task, got, _ = bound(5)
    table.add(task)
    assert table.deliver(TaskEvent(5, "x")) and 5 in table and len(table) == 1
    assert not table.deliver(TaskEvent(99, "x")) and not table.deliver(TaskDone(99, None))  # unknown id
    assert table.deliver(TaskDone(5, "r")) and 5 not in table and not table
    assert not table.deliver(TaskDone(5, "r"))  # a second end: no longer pending
    assert not table.deliver(TaskEvent(5, "late"))
    assert [m for m in got] == [TaskEvent(5, "x"), TaskDone(5, "r")] and table.ids() == []


def test_a_reader_iterates_blocking_while_another_thread_feeds():
    task, _, _ = bound()
    reader = TaskReader(task)

    def feed():
        for i in range(3):
            task.deliver(TaskEvent(1, i))
        task.deliver(TaskDone(1, "r"))

    threading.Thread(target=feed).start()
    got = list(reader.messages(timeout=5))
    assert [m.event for m in got[:3]] == [0, 1, 2] and got[3] == TaskDone(1, "r")


def test_a_reader_pumps_a_source_nobody_else_polls():
    runner = JobRunner("stream-test")
    task = runner.submit_task(Task("count", lambda ctx: [ctx.emit(i) for i in range(5)] and "done"))
    got = list(TaskReader(task).messages(pump=runner.poll, timeout=5))
    assert [m.event for m in got[:-1]] == list(range(5)) and got[-1] == TaskDone(task.id, "done")
    assert not runner.busy
    late = Task("never")
    assert list(TaskReader(late).messages(timeout=0.05)) == []  # no end in time: it stops without one


def test_the_asyncio_reader_gets_the_messages_on_its_loop():
    async def run():
        ends = []
        reader = LoopReader(on_end=ends.append)
        task, _, _ = bound()
        task.listen(reader.deliver_threadsafe)
        thread = threading.Thread(target=lambda: [task.deliver(TaskEvent(1, "a")), task.deliver(TaskDone(1, "r"))])
        thread.start()
        first = await asyncio.wait_for(reader.get(), 5)
        end = await asyncio.wait_for(reader.result(), 5)
        thread.join()
        return first, end, ends, reader

    first, end, ends, reader = asyncio.run(run())
    assert first == TaskEvent(1, "a") and end == TaskDone(1, "r") and ends == [reader] and reader.end == end


def test_a_job_runners_cancel_goes_through_its_task():
    runner = JobRunner("stream-test")
    started = threading.Event()

    def wait(ctx):
        started.set()
        while not ctx.cancelled:
            threading.Event().wait(0.01)
        raise RuntimeError("stopped")  # raised once cancelled: the job ends cancelled

    task = runner.submit_task(Task("wait", wait))
    started.wait(5)
    runner.cancel(task.id)
    got = list(TaskReader(task).messages(pump=runner.poll, timeout=5))
    assert task.cancel_requested and got[-1].id == task.id and task.state == "cancelled"


# -- the one pending table --
def pending_tables(source: str) -> list[int]:
    """Lines that make a dict keyed by task id: `self.<name>: dict[int, ...]` or a name like *pending*,
    *handles*, *tickets*, *jobs* set to {}."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute):
            ann = ast.unparse(node.annotation)
            if ann.startswith("dict[int") and any(w in node.target.attr for w in ("pending", "handle", "ticket",
                                                                                  "job", "task")):
                found.append(node.lineno)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and not node.value.keys:
            names = [t.attr for t in node.targets if isinstance(t, ast.Attribute)]
            if any(w in n for n in names for w in ("pending", "handles", "tickets", "jobs")):
                found.append(node.lineno)
    return found


def test_only_the_task_stream_keeps_a_table_of_pending_tasks():
    found = {str(p.relative_to(ROOT)): lines for package in ("app", "ui") for p in (ROOT / package).rglob("*.py")
             if p.name != "task_stream.py" and (lines := pending_tables(p.read_text(encoding="utf-8")))}
    assert found == {}
    assert pending_tables("class A:\n    def f(self):\n        self.pending: dict[int, str] = {}\n") == [3]
    assert pending_tables("class A:\n    def f(self):\n        self._handles = {}\n") == [3]
