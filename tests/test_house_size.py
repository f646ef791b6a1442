"""The house stays livable: no source file over MAX_FILE_LINES lines, no function over MAX_FUNCTION_LINES
(app, backend, ui and the lab; tests are not counted)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


def _sources():
    for top in ("app", "backend", "ui", "lab"):
        yield from sorted((ROOT / top).rglob("*.py"))


def test_no_source_file_is_too_long():
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_FILE_LINES}
    assert not long, f"split these files (over {MAX_FILE_LINES} lines): {long}"


def test_no_function_is_too_long():
    long = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.name}"] = n
    assert not long, f"split these functions (over {MAX_FUNCTION_LINES} lines): {long}"


MAX_README_LINES = 250  # the page a user reads; the full record lives in docs/RECORD.md


def test_the_readme_is_a_page_a_user_reads():
    n = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail to docs/ (at most {MAX_README_LINES})"
