"""The server's request bodies fuzzed against its parsing layer (app/server/schema.py), in-process:
every input gives a parsed request within its bounds or a clean 4xx ApiError, never another exception.
A short run here; `python -m lab fuzz-server --examples 100000` is the long one."""
from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lab.commands.fuzz_server import check, strategies  # noqa: E402

BODIES, RAW = strategies()
SHORT = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@SHORT
@given(BODIES, st.booleans())
def test_every_body_is_parsed_or_refused_with_a_4xx(body, chat):
    check(json.dumps(body, allow_nan=True).encode(), chat)


@SHORT
@given(RAW, st.booleans())
def test_every_raw_input_is_parsed_or_refused_with_a_4xx(raw, chat):
    check(raw, chat)


def test_the_long_run_command_counts_inputs_and_crashes(capsys):
    from lab.cli import run_cli

    assert run_cli(["fuzz-server", "--examples", "50"]) == 0
    out = capsys.readouterr().out
    assert "50 inputs" in out and "0 findings" in out and "peak RSS" in out
