"""The lab's fuzzers share one report and one set of options (lab/fuzz_report.py): each takes --examples and
--seed (and --minutes where it can stop early), counts a finding once per kind with its first input, and
prints the same line."""
from __future__ import annotations

import argparse

import pytest

from lab import fuzz_report
from lab.cli import build_parser


@pytest.mark.parametrize("command", ["fuzz-readers", "fuzz-configs", "fuzz-remote", "fuzz-server"])
def test_every_fuzzer_takes_the_shared_options(command):
    args = build_parser().parse_args([command, "--examples", "7", "--seed", "3"])
    assert (args.examples, args.seed) == (7, 3)
    if command != "fuzz-server":  # its inputs are parsed in microseconds: it has no time limit
        assert build_parser().parse_args([command, "--minutes", "0.5"]).minutes == 0.5


def test_a_finding_is_counted_once_per_kind_with_its_first_input_and_reported(capsys):
    stats = fuzz_report.new_stats()
    for data in (b"first", b"second"):
        try:
            {}["missing"]
        except KeyError as exc:
            fuzz_report.count(stats, fuzz_report.finding(stats, exc, data), 0.0)
    fuzz_report.count(stats, "refused", 0.0)
    assert fuzz_report.report("demo", stats, 1.0, seed=5) == 2
    out = capsys.readouterr().out
    assert out.startswith("demo: 3 inputs in 1 s (seed 5; finding 2, refused 1); 2 findings;"), out
    assert out.count("FINDING KeyError") == 1 and "b'first'" in out and "b'second'" not in out


def test_the_options_parse_alone():
    p = argparse.ArgumentParser()
    fuzz_report.add_options(p, 100, minutes=False)
    assert vars(p.parse_args([])) == {"examples": 100, "seed": 0}
