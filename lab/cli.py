"""`python -m lab`: the commands that measure RidgeFill against the exact model, fuzz the file readers and the
server, and load-test it. Each lives in lab/commands/<name>.py with `register(subparsers)`. The common options
(--model, --threads, --ctx, -v, before or after the command), the one-line errors and the exit codes are the
app's (app/cli.py), so each command takes the arguments it took as `python -m app COMMAND`."""
from __future__ import annotations

import argparse

from app.cli import add_commands, add_common, run_command
from app.logging_setup import setup_logging

# listed in this order in --help; `cache_bench` adds `cache bench`
COMMANDS = ["recall", "compare", "nll", "sweep", "bench", "hitrate", "followup", "sources", "fidelity",
            "fuzz_readers", "fuzz_configs", "fuzz_server", "fuzz_remote", "serve_load", "cache_bench"]
COMMAND_MODULES = [f"lab.commands.{name}" for name in COMMANDS]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description="RidgeFill's lab: measurements, fuzzers and load tests, run from a checkout. "
                    "The app's own commands are `python -m app`.",
    )
    add_common(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_commands(sub, COMMAND_MODULES)
    return parser


def run_cli(argv: list[str], plan_for=None) -> int:
    """`plan_for(engine, request, n_tokens)`: the plan each RidgeFill request of `fidelity` runs (an
    experiment's variant: lab/evals/plans.py); None: the app's own."""
    args = build_parser().parse_args(argv)
    args.plan_for = plan_for
    setup_logging(args.verbose)
    return run_command(args)
