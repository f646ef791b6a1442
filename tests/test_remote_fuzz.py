"""The remote client against a loopback server answering at random (lab/commands/fuzz_remote.py): every
question ends with an answer or a RemoteError naming the server, never another exception, never a hang.
The long run: `python -m lab.commands.fuzz_remote --examples 100000 --seed S` (docs/HARDENING.md)."""
from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from lab.commands.fuzz_remote import FuzzServer, check, strategies  # noqa: E402

SHORT = settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def server():
    srv = FuzzServer()
    yield srv
    srv.stop()


@SHORT
@given(script=strategies())
def test_every_reply_gives_an_answer_or_a_remote_error(server, script):
    assert check(server, script) in ("answer", "refused")


def test_the_long_run_command_counts_inputs_and_findings(capsys):
    from argparse import Namespace

    from lab.commands.fuzz_remote import run

    assert run(Namespace(examples=20, seed=3, minutes=0.0)) == 0
    out = capsys.readouterr().out
    assert "20 inputs" in out and "0 findings" in out
