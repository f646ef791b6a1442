"""Progress lines with a rate and a time left, for the long stages (capture, fit, tune), Qt-free.

The rate counts from the first report of a stage in this run, so a resumed capture (which reports the
parts already on disk at once) does not promise a time it cannot keep.
"""
from __future__ import annotations

import time

BURST_S = 0.3
UNITS = {"capture": "tokens", "fit": "layers", "download": "bytes"}


def duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def time_left(elapsed_s: float, done: int, total: int) -> float | None:
    """The seconds the rest of `total` steps take at the pace of the `done` ones taken in `elapsed_s`; None
    before a step is done (no pace yet) or without a total."""
    if done <= 0 or elapsed_s <= 0 or total <= 0:
        return None
    return max(0.0, (total - done) * elapsed_s / done)


class Eta:
    """Feed it (stage, done, total); `line()` says how far, how fast, and about how long is left."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.stage: str | None = None
        self.t0 = 0.0
        self.done0 = 0
        self.done = self.total = 0

    def update(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        if stage != self.stage or done < self.done:
            self.stage, self.t0, self.done0 = stage, now, done
        elif now - self.t0 < BURST_S:
            self.t0, self.done0 = now, done  # a burst of reports (resumed parts): start the clock after it
        self.done, self.total = done, total

    def seconds_left(self) -> float | None:
        return time_left(self.clock() - self.t0, self.done - self.done0, self.total - self.done0)

    def line(self) -> str:
        unit = UNITS.get((self.stage or "").split(":")[0], "steps")
        text = f"{self.stage}: {self.done:,}/{self.total:,} {unit}"
        left = self.seconds_left()
        if self.done >= self.total > 0:
            return text + " · done"
        if left is not None:
            text += f" · about {duration(left)} left"
        return text
