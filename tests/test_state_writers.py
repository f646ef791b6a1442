"""One writer for each piece of the engine's state, checked in the source (app, backend, ui):
- the row record (backend/row_record.py) changes only inside backend/engine.py: everyone else reads
  `engine.row_record` and writes through the Engine's methods (decode, truncate_cache, mark_exact,
  record_cells, keep_split_streams);
- RidgeFill's runtime slot (`Engine.ridgefill_runtime`) is filled only by backend/ridgefill/runtime.py."""
from __future__ import annotations

import ast
from pathlib import Path

from backend.row_record import RowRecord

ROOT = Path(__file__).resolve().parents[1]
ENGINE = Path("backend/engine.py")
RUNTIME = Path("backend/ridgefill/runtime.py")
READERS = {"tokens", "all_exact", "with_cells", "approximated", "cells", "split_streams", "reusable_prefix",
           "n_clean", "stream_split", "streams_kept", "saved"}
BUILDERS = {"from_saved"}  # make a new record (the prompt cache's); the Engine adopts it
WRITERS = {"append", "truncate", "mark_exact", "mark_clean", "record_cells", "keep_split_streams"}
RECORD_ATTRS = {"row_record", "_rows"}  # how the Engine's record is reached


def _sources():
    for top in ("app", "backend", "ui"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))


def _record_writes(tree) -> list[int]:
    """Lines that call a writing method on `<x>.row_record` / `<x>._rows`, or make a RowRecord."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in WRITERS and isinstance(f.value, ast.Attribute) \
                and f.value.attr in RECORD_ATTRS:
            lines.append(node.lineno)
        if isinstance(f, ast.Name) and f.id == "RowRecord":
            lines.append(node.lineno)
    return lines


def _assigned_attrs(tree, names: set[str]) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        lines += [t.lineno for t in targets if isinstance(t, ast.Attribute) and t.attr in names]
    return lines


def test_every_method_of_the_record_is_a_reader_or_a_writer():
    public = {n for n in dir(RowRecord) if not n.startswith("_")}
    assert public == READERS | WRITERS | BUILDERS, "classify the record's new method in READERS, WRITERS or BUILDERS"


def test_only_the_engine_writes_the_row_record():
    found = {f"{rel}:{line}" for rel, tree in _sources() if rel != ENGINE
             for line in _record_writes(tree) + _assigned_attrs(tree, RECORD_ATTRS)}
    assert not found, f"the row record is written outside backend/engine.py at {sorted(found)}"


def test_the_engine_does_write_it():  # the check above looks where the writes are
    tree = ast.parse((ROOT / ENGINE).read_text(encoding="utf-8"))
    assert len(_record_writes(tree)) >= len(WRITERS) + 1


def test_only_ridgefill_runtime_fills_the_engines_ridgefill_slot():
    found = {f"{rel}:{line}" for rel, tree in _sources() if rel not in (ENGINE, RUNTIME)
             for line in _assigned_attrs(tree, {"ridgefill_runtime"})}
    assert not found, f"Engine.ridgefill_runtime is set outside {RUNTIME} at {sorted(found)}"
    assert _assigned_attrs(ast.parse((ROOT / RUNTIME).read_text(encoding="utf-8")), {"ridgefill_runtime"})
