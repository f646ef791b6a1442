"""Every file reader against Hypothesis' hostile and damaged inputs, briefly (the long run is
`python -m lab fuzz-readers --examples 100000`): each input gives a clean result or the reader's own
documented error, never another exception, within a deadline."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import backend.hub.maps_hub  # noqa: F401  imported here, not in the first example's deadline (torch)
import backend.ridgefill.map_format  # noqa: F401
from lab.commands.fuzz_readers import CHECKS, seed_ggufs, strategies

with tempfile.TemporaryDirectory() as _tmp:
    STRATEGIES = strategies(seed_ggufs(Path(_tmp)))

FUZZ = settings(max_examples=150, deadline=None, database=None,  # the hang check is CPU time (SIGPROF), not wall time
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run_check(name: str, data) -> str:
    with tempfile.TemporaryDirectory() as work:
        return CHECKS[name](data, Path(work))


@FUZZ
@given(STRATEGIES["gguf"])
def test_the_gguf_header_walk_takes_any_bytes(data):
    assert run_check("gguf", data) in ("ok/ok", "ok/refused", "refused/refused")


@FUZZ
@given(STRATEGIES["settings"])
def test_settings_take_any_file(data):
    assert run_check("settings", data) in ("kept", "set aside")


@FUZZ
@given(STRATEGIES["conversation"])
def test_conversations_take_any_file(data):
    assert run_check("conversation", data) in ("kept", "set aside")


@FUZZ
@given(STRATEGIES["catalogue"])
def test_the_user_model_list_takes_any_file(data):
    assert run_check("catalogue", data) in ("kept", "set aside")


@FUZZ
@given(STRATEGIES["manifest"])
def test_a_map_manifest_is_read_or_refused(data):
    """Any exception but the documented refusals, from read_manifest or publish-maps' check, fails."""
    assert run_check("manifest", data) in ("ok", "refused")


@FUZZ
@given(STRATEGIES["tuned"])
def test_a_tuned_split_record_is_read_or_refused(data):
    """A record that is not of its shape (a list, Infinity, a split beyond the model) is no split at all."""
    assert run_check("tuned", data) in ("ok", "refused")


@FUZZ
@given(STRATEGIES["installed"])
def test_an_installed_model_record_is_read_or_refused(data):
    assert run_check("installed", data) in ("ok", "refused")


def test_the_command_reports_findings_and_rss(capsys):
    from lab.cli import run_cli

    assert run_cli(["fuzz-readers", "--examples", "20", "--reader", "gguf", "--reader", "settings"]) == 0
    out = capsys.readouterr().out
    assert "gguf: 20 inputs" in out and "settings: 20 inputs" in out
    assert "0 findings" in out and "peak RSS" in out


@pytest.mark.parametrize("broken", ["gguf"])
def test_a_reader_that_raises_is_a_finding_not_a_stop(monkeypatch, broken):
    from lab.commands import fuzz_readers

    def bug(data, work):
        raise KeyError("a reader bug")

    monkeypatch.setitem(fuzz_readers.CHECKS, broken, bug)
    stats = fuzz_readers.run_reader(broken, 15, [b"GGUF"])
    assert stats["inputs"] == 15 and list(stats["findings"].values())[0]["count"] == 15


def test_a_reader_stops_when_its_minutes_are_spent():
    from lab.commands import fuzz_readers

    stats = fuzz_readers.run_reader("settings", 10**6, [b"GGUF"], minutes=0.01)
    assert stats.get("out_of_time") and 0 < stats["inputs"] < 10**6


def test_an_input_that_hangs_is_a_finding_and_the_run_goes_on(monkeypatch):
    import time

    from lab.commands import fuzz_readers

    def spin(data, work):
        while True:
            pass

    monkeypatch.setitem(fuzz_readers.CHECKS, "gguf", spin)
    started = time.monotonic()
    stats = fuzz_readers.run_reader("gguf", 3, [b"GGUF"], input_s=0.2)
    assert time.monotonic() - started < 10 and stats["inputs"] == 3
    assert [(k.split()[0], f["count"]) for k, f in stats["findings"].items()] == [("Hang", 3)]


def test_a_hang_whose_first_alarm_was_swallowed_is_still_a_finding(monkeypatch):
    """Python ignores an exception raised in a gc callback: the long config run once lost its alarm so."""
    import time

    from lab.commands import fuzz_readers
    from lab.fuzz_run import Hang

    def swallow_then_spin(data, work):
        try:
            while True:
                pass
        except Hang:  # as a gc callback would: the input goes on
            pass
        give_up = time.monotonic() + 5  # without a second alarm: "ok", and the test fails rather than hangs
        while time.monotonic() < give_up:
            pass
        return "ok"

    monkeypatch.setitem(fuzz_readers.CHECKS, "gguf", swallow_then_spin)
    stats = fuzz_readers.run_reader("gguf", 1, [b"GGUF"], input_s=0.2)
    assert [(k.split()[0], f["count"]) for k, f in stats["findings"].items()] == [("Hang", 1)]


def test_an_input_the_machine_paused_is_not_a_hang(monkeypatch):
    """The long GGUF run's 4 'hangs' (10-11.5 s on a machine at load 7) were inputs refused in 2 ms: a hang
    is CPU spent, not the wall time a loaded machine leaves the process waiting."""
    import time

    from lab.commands import fuzz_readers

    monkeypatch.setitem(fuzz_readers.CHECKS, "gguf", lambda data, work: time.sleep(0.5) or "ok")
    stats = fuzz_readers.run_reader("gguf", 2, [b"GGUF"], input_s=0.2)
    assert stats["inputs"] == 2 and not stats["findings"], stats


def test_a_batched_run_gives_as_many_distinct_inputs_and_prints_its_progress(capsys):
    from lab.commands import fuzz_readers

    stats = fuzz_readers.run_reader("settings", 10, [b"GGUF"], batch=4, progress_s=1e-9)
    assert stats["inputs"] == 10 and not stats["findings"], stats  # 4 + 4 + 2 of the third batch
    assert 8 <= stats["distinct"] <= 10, stats  # a batch's inputs differ (Hypothesis repeats list elements)
    out = capsys.readouterr().out
    assert "settings: 4 inputs after" in out and "settings: 10 inputs after" in out, out
