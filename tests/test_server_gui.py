"""The GUI's "Serve on localhost:8080" switch serves the window's own engine (ui/serve_switch.py): the
official openai client gets an answer from it, and switching it off mid-stream ends the stream and
frees the engine."""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("pytestqt")
openai = pytest.importorskip("openai")

from tests.gui_helpers import make_window, start_service, wait_ready  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path))
    return tmp_path


def in_thread(fn) -> dict:
    """Run a blocking client call off the GUI thread (the GUI thread delivers the engine's messages)."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            box["error"] = exc
        box["done"] = True

    threading.Thread(target=run, daemon=True).start()
    return box


def test_serve_switch_serves_the_windows_engine(qtbot, home, model_path):
    service = start_service(model_path, n_ctx=1024)
    try:
        wait_ready(qtbot, service)
        w = make_window(qtbot, service)
        assert w.serve.action.text() == "Serve on localhost:8080" and not w.serve.label.isVisible()
        w.serve.port = 0  # any free port: the test must not depend on 8080 being free
        w.serve.action.setChecked(True)
        assert w.serve.url.startswith("http://127.0.0.1:") and w.serve.url in w.serve.label.text()
        assert w.serve.label.isVisible()
        client = openai.OpenAI(base_url=w.serve.url, api_key="unused", max_retries=0, timeout=120)

        box = in_thread(lambda: client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=4,
            messages=[{"role": "user", "content": "Say hello."}]))
        qtbot.waitUntil(lambda: "done" in box, timeout=120_000)
        resp = box.get("result")
        assert resp is not None, box.get("error")
        assert resp.choices[0].message.content and resp.timings["predicted_n"] > 0

        # a long answer streaming when the switch goes off: the stream ends, the engine is free again
        seen: list = []

        def stream():
            for chunk in client.chat.completions.create(
                    model=resp.model, max_tokens=600, stream=True,
                    messages=[{"role": "user", "content": "Tell a long story about the sea."}]):
                seen.append(chunk)

        box = in_thread(stream)
        qtbot.waitUntil(lambda: len(seen) >= 3, timeout=120_000)
        t0 = time.monotonic()
        w.serve.action.setChecked(False)
        assert time.monotonic() - t0 < 5  # the GUI thread does not wait out the stream
        assert w.serve.server is None and not w.serve.label.isVisible()
        qtbot.waitUntil(lambda: "done" in box, timeout=20_000)
        assert not any(c.choices and c.choices[0].finish_reason for c in seen)  # cut off, not finished
        qtbot.waitUntil(lambda: not service.busy, timeout=20_000)
    finally:
        service.shutdown()
