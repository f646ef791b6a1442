"""The engine's messages are sorted by kind in one module (app/engine_messages.py: kind_of, is_end, route):
no other module of app/ or ui/ tests a message's type itself. An AST walk holds this."""
from __future__ import annotations

import ast
from pathlib import Path

from app.engine_messages import CANCELLED, DONE, EVENT, FAILED, is_end, kind_of
from app.engine_protocol import TaskCancelled, TaskDone, TaskEvent, TaskFailed

ROOT = Path(__file__).resolve().parent.parent
MESSAGE_TYPES = {"TaskEvent", "TaskDone", "TaskFailed", "TaskCancelled", "EngineStarted", "EngineCrashed",
                 "EngineFatal", "DocumentState", "ENDS", "TaskEnd"}


def type_tests(source: str) -> list[int]:
    """Lines of isinstance(..., <a message type>) calls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} if len(node.args) > 1 else set()
            if names & MESSAGE_TYPES:
                found.append(node.lineno)
    return found


def test_no_module_but_engine_messages_sorts_the_engines_messages_by_type():
    found = {str(p.relative_to(ROOT)): lines for package in ("app", "ui") for p in (ROOT / package).rglob("*.py")
             if p.name != "engine_messages.py" and (lines := type_tests(p.read_text(encoding="utf-8")))}
    assert found == {}
    assert type_tests("isinstance(msg, (TaskDone, TaskFailed))\n") == [1]  # the walk sees one


def test_each_task_message_has_its_kind_and_exactly_the_ends_end():
    kinds = [kind_of(m) for m in (TaskEvent(1, None), TaskDone(1, None), TaskFailed(1, "E", "m"), TaskCancelled(1, "m"))]
    assert kinds == [EVENT, DONE, FAILED, CANCELLED]
    assert [is_end(m) for m in (TaskEvent(1, None), TaskDone(1, None))] == [False, True]
    assert kind_of(object()) is None
