"""The time left of a long task (Get maps, tune) from the time it has taken so far."""
from __future__ import annotations

from backend.eta import Eta, time_left


def test_time_left_is_the_rest_at_the_pace_so_far():
    assert time_left(30.0, 1, 4) == 90.0  # a quarter in 30 s: three quarters in 90 s more
    assert time_left(10.0, 5, 5) == 0.0
    assert time_left(0.0, 1, 4) is None and time_left(10.0, 0, 4) is None  # no pace yet
    assert time_left(10.0, 2, 0) is None  # no total
    assert time_left(10.0, 6, 5) == 0.0  # a stage that overran its total promises nothing negative


def test_eta_counts_its_pace_from_the_first_report_of_a_stage():
    now = [0.0]
    eta = Eta(clock=lambda: now[0])
    eta.update("tune: S = 2", 0, 10)
    now[0] = 20.0
    eta.update("tune: S = 2", 2, 10)
    assert eta.seconds_left() == 80.0 and "2/10" in eta.line() and "about 1 min 20 s left" in eta.line()
    eta.update("fit", 0, 4)  # a new stage starts its own clock
    assert eta.seconds_left() is None and eta.line() == "fit: 0/4 layers"
