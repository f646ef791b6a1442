"""The tune starts by itself for a model whose split is a guess (the tiny test model) once its maps exist:
after Get maps (real, on the engine), and again at the next start while no record exists; it reports its
stage, done/total and the time left; Cancel turns it off for that model (kept in the settings); the
button still runs it; "untuned" shows in the RidgeFill panel until a record exists. The tune itself is
observed at its submission and answered here (a real tune takes minutes: tests/test_tune*.py measure it)."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QTimer  # noqa: E402

from app.engine_protocol import TaskKind, TuneDone  # noqa: E402
from backend.protocol import ProgressEvent  # noqa: E402
from tests.gui_helpers import make_window, start_service, wait_ready  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf  # noqa: E402

NAME = "tiny-llama.gguf"


class SubmittedTune:
    """A TUNE submission, answered by the test through the callbacks MapsTasks gave."""

    def __init__(self, request, callbacks: dict):
        self.request, self.callbacks, self.cancelled = request, callbacks, False

    def cancel(self) -> None:  # as the engine does: the task ends cancelled, a moment later
        self.cancelled = True
        QTimer.singleShot(0, lambda: self.callbacks["on_cancelled"]("Cancelled."))


def observe_tunes(service) -> list[SubmittedTune]:
    """Every TUNE submitted from now on is kept, not sent; the other tasks go to the engine."""
    tunes, submit = [], service.submit

    def submitted(kind, payload, **callbacks):
        if kind is not TaskKind.TUNE:
            return submit(kind, payload, **callbacks)
        tunes.append(SubmittedTune(payload, callbacks))
        return tunes[-1]

    service.submit = submitted
    return tunes


def test_the_tune_runs_by_itself_reports_resumes_and_cancel_turns_it_off(qtbot, tmp_path, monkeypatch):
    from app.settings import Settings
    from backend.model_file import read_model_header
    from backend.ridgefill.tuned import EXACT_SUMMARY, write_tuned

    import ui.maps_tasks

    monkeypatch.setattr(ui.maps_tasks, "RESUME_MS", 50)  # a tune that gave way looks again at once
    tiny = str(write_tiny_gguf(tmp_path / NAME, "llama", n_layer=4))
    service = start_service(tiny, n_ctx=512)
    windows = []

    def start(**settings):  # a start of the app on the running engine (what a restart reaches again)
        windows.append(make_window(qtbot, service, model_path=tiny, **settings))
        return windows[-1]

    try:
        wait_ready(qtbot, service, timeout_s=120)
        tunes = observe_tunes(service)
        w = start()
        c = w.controls
        assert c.untuned_label.isVisible() and c.untuned_label.text().startswith("Untuned: split 3 is a guess")
        assert "measured on no document" in c.untuned_label.text() and not tunes  # no maps yet: no tune
        w.maps_tasks.capture_tokens = 600  # a small first capture: seconds on a tiny model
        c.slider.setValue(2)
        qtbot.waitUntil(lambda: getattr(c, "maps_status", None) == "missing", timeout=60_000)
        c.get_btn.click()
        qtbot.waitUntil(lambda: c.maps_status == "verified" and len(tunes) == 1, timeout=120_000)
        assert c.fit_bar.isVisible() and c.fit_bar.format().startswith("tuning by itself · ")

        on_event = tunes[0].callbacks["on_event"]  # the stage, done/total and the time left
        on_event(ProgressEvent(1, 10, 0.0, "fidelity: S = 2"))
        qtbot.wait(600)
        on_event(ProgressEvent(3, 10, 600.0, "fidelity: S = 2"))
        assert c.fit_bar.value() == 3 and c.fit_bar.maximum() == 10
        line = c.fit_bar.format()
        assert line.startswith("tuning by itself · fidelity: S = 2: 3/10") and "left" in line, line
        w.shutdown()  # quit while it runs: no record, so the next start resumes it

        w = start(split=2)
        qtbot.waitUntil(lambda: len(tunes) == 2, timeout=60_000)
        assert w.controls.fit_bar.format().startswith("tuning by itself") and w.controls.untuned_label.isVisible()
        assert tunes[1].request.yields  # by itself, it gives way to other work
        tunes[1].callbacks["on_cancelled"]("tune cancelled")  # the engine ended it: a question came
        assert "gave way" in w.controls.maps_reasons.text() and not w.settings.auto_tune_off
        qtbot.waitUntil(lambda: len(tunes) == 3, timeout=5_000)  # and it starts again once the engine is free
        tunes.pop(1)
        w.controls.fit_cancel.click()
        qtbot.waitUntil(lambda: w.controls.fit_bar.isHidden(), timeout=10_000)
        assert tunes[1].cancelled and w.settings.auto_tune_off == [NAME]
        assert "will not start by itself again" in w.controls.maps_reasons.text()
        w.shutdown()
        assert Settings.load().auto_tune_off == [NAME]  # remembered in the app's settings

        w = start(split=2, auto_tune_off=Settings.load().auto_tune_off)
        qtbot.waitUntil(lambda: getattr(w.controls, "maps_status", None) == "verified", timeout=60_000)
        qtbot.wait(300)
        assert len(tunes) == 2 and w.controls.fit_bar.isHidden()  # turned off for this model
        w.controls.tune_btn.click()  # the button always runs it
        assert len(tunes) == 3 and w.controls.fit_bar.format().startswith("tuning · ")
        write_tuned(read_model_header(tiny), {"split": 2, "tail": 64, "mode": "off", "chosen_by": "test"})
        tunes[2].callbacks["on_done"](TuneDone(2, EXACT_SUMMARY, {"mode": "off"}, "record.json"))
        assert w.controls.untuned_label.isHidden() and w.controls.fit_bar.isHidden()
        assert w.controls.tuned_label.text() == f"Tuned: {EXACT_SUMMARY}"
        assert not w.controls.toggle.isChecked() and w.controls.mode() == "off"  # exact from now on
        w.shutdown()

        w = start(split=2)  # a record exists: no "untuned", no tune
        qtbot.waitUntil(lambda: getattr(w.controls, "maps_status", None) == "verified", timeout=60_000)
        qtbot.wait(300)
        assert len(tunes) == 3 and w.controls.untuned_label.isHidden() and w.controls.tuned_label.isVisible()
        assert not w.controls.toggle.isChecked() and w.controls.mode() == "off"  # tune chose exact: it runs exact
        assert Settings.load().ridgefill_on  # the saved switch was not turned off for every model
        w.controls.set_default_mode("speed")  # another model: RidgeFill on again, in its mode
        assert w.controls.toggle.isChecked() and w.controls.mode() == "speed"
    finally:
        for w in windows:
            w.shutdown()
        service.shutdown()
