"""One writer for each piece of the engine's state, checked in the source (app, backend, ui):
- sequence 0's K/V and its row record (backend/row_record.py) change only inside backend/slot.py, the
  slot, which writes both together: everyone else reads `engine.slot.record` and writes through the
  slot's methods. The slot holds its llama.cpp context and calls llama.cpp itself: the llama.cpp calls
  that change a context's cells are made only in the slot and in backend/llama_context.py, whose
  spare-sequence methods refuse sequence 0; the engine makes none and has no sequence-0 method. A cache
  tensor's rows are assigned only in the slot, in one method: `Slot.write_late`, the one writer of K/V outside llama.cpp's decodes
  (the bulk pass's late K/V, the sliding windows, lower_skip's copy of a re-decoded row's lower layers,
  the refinement's rows);
- RidgeFill's runtime (`Engine.ridgefill`) is filled only by backend/ridgefill/runtime.py."""
from __future__ import annotations

import ast
from pathlib import Path

from backend.row_record import RowRecord

ROOT = Path(__file__).resolve().parents[1]
SLOT = Path("backend/slot.py")
ENGINE = Path("backend/engine.py")
RUNTIME = Path("backend/ridgefill/runtime.py")
READERS = {"tokens", "all_exact", "with_cells", "approximated", "cells", "split_streams", "reusable_prefix",
           "n_clean", "stream_split", "streams_kept", "saved"}
BUILDERS = {"from_saved"}  # make a new record (the prompt cache's); the slot adopts it
WRITERS = {"append", "truncate", "mark_exact", "mark_clean", "record_cells", "keep_split_streams"}
RECORD_ATTRS = {"record", "_rows"}  # how the slot's record is reached
CONTEXT = Path("backend/llama_context.py")
# llama.cpp's calls that change a context's cells
CELL_WRITERS = {"llama_decode", "llama_memory_seq_rm", "llama_memory_seq_cp", "llama_memory_clear",
                "llama_state_set_data", "llama_state_seq_set_data"}
# the engine's sequence-0 methods before the slot held its context: none may come back
OLD_SEQ0_METHODS = {"decode_seq0", "seq0_truncate", "seq0_set_state", "seq_remove_seq0", "seq_copy_to_seq0", "pin",
                    "seq0_state", "context_state", "set_context_state"}


def _sources():
    for top in ("app", "backend", "ui"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))


def _record_writes(tree) -> list[int]:
    """Lines that call a writing method on `<x>.record` / `<x>._rows`, or make a RowRecord."""
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


def _calls(tree, names: set[str]) -> list[int]:
    """Lines that call `<x>.<name>(...)` for a name in `names`."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in names]


def _row_assignments(tree) -> list[int]:
    """Lines that assign into a cache tensor's rows: `<x>.rows()[...] = ...` (or a name bound to it)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for t in node.targets:
            if isinstance(t, ast.Subscript):
                v = t.value
                if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "rows":
                    lines.append(node.lineno)
                elif isinstance(v, ast.Name) and v.id == "rows" and isinstance(node.value, ast.Subscript):
                    lines.append(node.lineno)  # rows = cache.rows(); rows[new] = rows[old]
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


def test_only_the_slot_writes_the_row_record():
    found = {f"{rel}:{line}" for rel, tree in _sources() if rel != SLOT
             for line in _record_writes(tree) + _assigned_attrs(tree, {"_rows"})}
    assert not found, f"the row record is written outside {SLOT} at {sorted(found)}"


def test_only_the_slot_writes_sequence_0s_kv():
    found = {f"{rel}:{line}" for rel, tree in _sources() if rel not in (SLOT, CONTEXT)
             for line in _calls(tree, CELL_WRITERS)}
    assert not found, f"a context's cells are written outside {SLOT} and {CONTEXT} at {sorted(found)}"
    engine = ast.parse((ROOT / ENGINE).read_text(encoding="utf-8"))
    methods = {n.name for n in ast.walk(engine) if isinstance(n, ast.FunctionDef)}
    assert not methods & OLD_SEQ0_METHODS, f"the engine has sequence-0 methods {sorted(methods & OLD_SEQ0_METHODS)}"
    tensors = {f"{rel}:{line}" for rel, tree in _sources() if rel != SLOT for line in _row_assignments(tree)}
    assert not tensors, f"cache tensor rows are assigned outside {SLOT} at {sorted(tensors)}"


def test_one_writer_of_kv_rows():
    tree = ast.parse((ROOT / SLOT).read_text(encoding="utf-8"))
    writer = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "write_late")
    inside = set(range(writer.lineno, writer.end_lineno + 1))
    elsewhere = [line for line in _row_assignments(tree) if line not in inside]
    assert not elsewhere, f"cache tensor rows are assigned outside Slot.write_late at lines {elsewhere}"


def test_the_slot_does_write_them():  # the checks above look where the writes are
    tree = ast.parse((ROOT / SLOT).read_text(encoding="utf-8"))
    assert len(_record_writes(tree)) >= len(WRITERS)
    assert set(_calls(tree, CELL_WRITERS)) and _row_assignments(tree)


def test_only_ridgefill_runtime_fills_the_engines_ridgefill_slot():
    found = {f"{rel}:{line}" for rel, tree in _sources() if rel not in (ENGINE, RUNTIME)
             for line in _assigned_attrs(tree, {"ridgefill"})}
    assert not found, f"Engine.ridgefill is set outside {RUNTIME} at {sorted(found)}"
    assert _assigned_attrs(ast.parse((ROOT / RUNTIME).read_text(encoding="utf-8")), {"ridgefill"})
