"""The maps' tasks behind the RidgeFill controls: the check of the split the slider shows, Get maps and
Tune (one long task at a time: both use the engine), with progress, the time left and the outcome.

While the shown model's split is a guess (app/model_tuning.py), the tune starts by itself once its maps
exist: after Get maps, and at each start until a record exists (the backend resumes the partial results it
keeps on disk). A tune the user cancels no longer starts by itself for that model (Settings.auto_tune_off);
"Tune for this model" always runs. Started by itself, it gives way to a question or the idle work
(the engine ends it, cancelled) and starts again once the engine is free."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.engine_client import EngineClient, TaskHandle
from app.engine_protocol import GetMapsRequest, MapsStatus, MapsStatusRequest, StageNote, TaskKind, TuneDone, TuneRequest
from backend.eta import Eta
from backend.protocol import ProgressEvent
from ui.controls import RidgeFillControls


RESUME_MS = 30_000  # how often a tune that gave way looks whether the engine is free again


class MapsTasks(QObject):
    """Runs the maps' tasks for `controls`; `models` (the Models panel) gives the hub settings and lists
    a new set. `said` carries a line for the status bar."""

    said = Signal(str)

    def __init__(self, service: EngineClient, controls: RidgeFillControls, models, settings, parent=None):
        super().__init__(parent)
        self.service, self.controls, self.models, self.settings = service, controls, models, settings
        self.check_task: TaskHandle | None = None
        self.long_task: TaskHandle | None = None  # Get maps or Tune
        self._eta = Eta()
        self._label = ""  # what the progress bar says before the stage ("tuning by itself · ")
        self.untuned = ""  # the shown model's guess note while its split is a guess (show_tuning writes it)
        self.auto_tried: set[str] = set()  # models whose tune started by itself this session: once each
        self._cancel_asked = False  # the user pressed Cancel (not a shutdown's cancel)
        self._by_itself = False  # the running tune started by itself (it gives way to other work)
        self.capture_tokens: int | None = None  # bound a first capture (tests); None: the whole corpus
        self.tune_request = TuneRequest()  # what "Tune for this model" measures (tests make it small)
        controls.split_settled.connect(self.check)
        controls.get_maps.connect(self.get_maps)
        controls.tune.connect(self.tune)
        controls.cancel_fit.connect(self.cancel)

    @Slot(int)
    def check(self, split: int) -> None:
        self.controls.set_maps_status("checking")
        if self.check_task is not None:
            self.check_task.cancel()  # a check for a split the slider has left: skip it if still queued
        h = self.service.submit(TaskKind.MAPS_STATUS, MapsStatusRequest(split), owner=self,
                                on_done=lambda res: self._checked(h, res),
                                on_failed=lambda _type, message: self._checked(h, None, message),
                                on_cancelled=lambda _message: self._checked(h, None))
        self.check_task = h

    def _checked(self, h: TaskHandle, res: MapsStatus | None, error: str = "") -> None:
        if h is not self.check_task:
            return
        self.check_task = None
        if res is not None:
            if res.split == self.controls.split():
                self.controls.set_maps_status(res.status, res.reasons)
            if res.status in ("verified", "warning"):  # at a start: a tune cut short resumes
                self.tune_by_itself()
        elif error:
            self.controls.set_maps_status("unavailable", [error])

    @Slot(int)
    def get_maps(self, split: int) -> None:
        """Get maps: the published set when there is one (verified), else fitted on the engine from a
        capture made once per model (resumed if one was cut short); progress with the time left."""
        if self.long_task is not None:
            return
        hs = self.models.hub_settings()
        req = GetMapsRequest(split, cache_root=str(hs.cache_root), endpoint=hs.endpoint, token=hs.token,
                             offline=hs.offline, maps_owner=hs.maps_owner, capture_tokens=self.capture_tokens)
        self._start(f"getting maps for split {split}…")
        self.long_task = self.service.submit(TaskKind.GET_MAPS, req, owner=self, on_event=self._on_event,
                                             on_done=self._got, on_failed=lambda _type, message: self._ended(message),
                                             on_cancelled=self._ended)

    @Slot()
    def tune(self, by_itself: bool = False) -> None:
        """Tune for this model: settings measured, the one chosen made the model's default (a record)."""
        if self.long_task is not None:
            return
        self._start("tuning: measuring candidate settings…", "tuning by itself · " if by_itself else "tuning · ")
        self._by_itself = by_itself
        req = replace(self.tune_request, yields=by_itself)  # by itself, it gives way to questions and idle work
        self.long_task = self.service.submit(TaskKind.TUNE, req, owner=self, on_event=self._on_event,
                                             on_done=self._tuned, on_failed=lambda _type, message: self._ended(message),
                                             on_cancelled=self._tune_cancelled)

    def tune_by_itself(self) -> None:
        """The tune, started by itself: while the split of this machine's model is a guess and no long task
        runs, once a session per model (one that failed waits for the next start or the button), never
        for a model whose tune the user cancelled."""
        name = self._model_name()
        if (self.long_task is not None or not self.untuned or name is None or self.controls.showing_remote()
                or name in self.settings.auto_tune_off or name in self.auto_tried):
            return
        self.auto_tried.add(name)
        self.tune(by_itself=True)

    def _resume_by_itself(self) -> None:
        """The tune that gave way, again once the engine is free (its kept lines make this cheap)."""
        name = self._model_name()
        if (self.long_task is not None or not self.untuned or name is None or self.controls.showing_remote()
                or name in self.settings.auto_tune_off):
            return
        if self.service.busy:
            QTimer.singleShot(RESUME_MS, self, self._resume_by_itself)
            return
        self.tune(by_itself=True)

    def show_tuning(self, tuned_line: str, untuned: str) -> None:
        """The shown model's tuned line and guess note (app/model_tuning.py), in the panel and for the tune."""
        self.untuned = untuned
        self.controls.set_tuned(tuned_line)
        self.controls.set_untuned(untuned)

    def _model_name(self) -> str | None:
        info = self.service.info
        return Path(info.model_path).name if info is not None else None

    @Slot()
    def cancel(self) -> None:
        if self.long_task is not None:
            self._cancel_asked = True
            self.long_task.cancel()  # this task only; a chat answer in progress goes on

    def _start(self, label: str, prefix: str = "") -> None:
        self._eta, self._label, self._cancel_asked = Eta(), prefix, False
        self.controls.maps_reasons.setText("")
        self.controls.set_fit_progress(0, 1, prefix + label)

    def _on_event(self, ev) -> None:
        if isinstance(ev, ProgressEvent):  # the stage, done/total and the time left at the stage's pace
            self._eta.update(ev.stage, ev.done, ev.total)
            self.controls.set_fit_progress(ev.done, ev.total, self._label + self._eta.line())
        elif isinstance(ev, StageNote):
            self.controls.maps_reasons.setText(ev.text)
            self.controls.maps_reasons.setVisible(True)

    def _got(self, res) -> None:
        self.long_task = None
        self.controls.fit_finished()
        self.check(self.controls.split())
        self.models.refresh()  # the models panel lists the new set
        self.said.emit(f"Maps for split {res.split}: {res.how}, {res.status} · {res.folder}")
        self.tune_by_itself()

    def _tuned(self, res: TuneDone) -> None:
        self.long_task = None
        self.controls.fit_finished()
        self.show_tuning(res.summary, "" if res.record_path else self.untuned)
        if self.controls.model_defaults is not None:  # the tuned split is this model's default from now on
            self.controls.model_defaults = (res.split, self.controls.model_defaults[1])
        self.controls.slider.setValue(res.split)
        if res.result.get("mode"):  # the tuned mode (or exact) runs from now on, as after a restart
            self.controls.set_default_mode(res.result["mode"])
        self.check(res.split)
        self.models.refresh()

    def _tune_cancelled(self, message: str) -> None:
        name = self._model_name()
        if self._by_itself and not self._cancel_asked:  # it gave way to other work: it resumes once that is done
            QTimer.singleShot(RESUME_MS, self, self._resume_by_itself)
            self._ended("The tune gave way to other work; it goes on when the engine is free.")
            return
        if self._cancel_asked and name is not None and name not in self.settings.auto_tune_off:
            self.settings.auto_tune_off = [*self.settings.auto_tune_off, name]  # saved with the settings at quit
            message += " The tune will not start by itself again for this model; “Tune for this model” runs it."
        self._ended(message)

    def _ended(self, message: str) -> None:
        self.long_task = None
        self.controls.fit_finished()
        self.controls.maps_reasons.setText(message)
        self.controls.maps_reasons.setVisible(True)
