"""Architecture rules as import-linter contracts ([tool.importlinter] in pyproject.toml), run here as a
developer runs them by hand: `lint-imports`. grimp counts every import statement, those inside
functions included, and follows chains of imports (the forbidden and layers contracts forbid indirect
imports too).

- backend never imports Qt (PySide6, shiboken6, PyQt5/6, pyqtgraph);
- the engine child process (app.engine_child, app.engine_process, app.engine_protocol) is Qt-free;
- layers ui -> app -> backend: backend never imports app or ui, app never imports ui (but for the
  GUI's entry point and the self-test, which start the window);
- the UI never calls llama.cpp itself (no direct import of llama_cpp);
- only the engine (backend/engine.py, its model's tokens in backend/vocabulary.py), its context
  (backend/llama_context.py) and that context's slot (backend/slot.py, which calls llama.cpp itself as
  server_slot does), its sampler chain (backend/sampler.py) and the ggml view
  (backend/ridgefill/ggml_graph.py) import llama_cpp directly: everything else goes through them;
- no import cycles in backend, nor in the lab: between the children of every package in it, at every depth;
- ridgefill never imports the hub, recall or tuning (directly or through a chain of imports);
- the product never imports the lab: app, backend and ui import nothing of lab/ (the eval commands, the
  fuzzers, the load test, the experiments), directly or through a chain of imports;
- the UI never imports recall or tuning (backend.recall, backend.tuning) itself;
- recall is imported only where it runs: the GUI's recall task, Tune and the lab;
- tuning is imported only where Tune runs: its command and the engine child's tune handler.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONTRACTS = [c["name"] for c in tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]]


@cache
def lint_imports() -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--config", str(PYPROJECT), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True,
        text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )


def test_the_contracts_are_all_there():
    assert set(CONTRACTS) == {
        "backend never imports Qt",
        "the engine child process is Qt-free",
        "layers: ui -> app -> backend",
        "the UI never calls llama.cpp itself",
        "only the engine and the ggml view import llama_cpp",
        "no import cycles in backend",
        "no import cycles in the lab",
        "ridgefill never imports the hub, recall or tuning",
        "ridgefill never imports a request's orchestration",
        "the product never imports the lab",
        "the UI never imports recall or tuning itself",
        "recall is imported only where it runs",
        "tuning is imported only where Tune runs",
    }


@pytest.mark.parametrize("name", CONTRACTS)
def test_contract_is_kept(name):
    r = lint_imports()
    lines = [line.strip() for line in r.stdout.splitlines()]
    kept = any(line.startswith(f"{name} KEPT") for line in lines)
    assert kept, f"`lint-imports` (exit {r.returncode}) does not keep {name!r}:\n{r.stdout}{r.stderr}"
