"""The headless command line. Each command lives in app/commands/<name>.py with `register(subparsers)`;
the lab's eval commands (measuring RidgeFill, not using it) in app/commands/evals/<name>.py."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from app.logging_setup import setup_logging
from backend.errors import RidgeFillError
from backend.protocol import AUTO_CTX

# One module per command; each adds its own sub-parser and sets `func`. The product's commands first,
# then the eval tooling's (listed in this order in --help).
PRODUCT_COMMANDS = ["info", "chat", "demo", "run", "models", "download", "maps", "download_maps", "publish_maps",
                    "fit_maps", "tune", "serve", "serve_load", "fuzz_server", "cache"]
PRODUCT_COMMANDS += ["fuzz_readers"]  # hostile files against every file reader (app/commands/fuzz_readers.py)
PRODUCT_COMMANDS += ["fidelity"]  # how far RidgeFill moves exact's answers on a user's own documents
EVAL_COMMANDS = ["recall", "compare", "nll", "sweep", "bench", "hitrate", "followup", "sources"]
COMMAND_MODULES = ([f"app.commands.{name}" for name in PRODUCT_COMMANDS]
                   + [f"app.commands.evals.{name}" for name in EVAL_COMMANDS])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app",
        description="RidgeFill Desktop: chat with long documents on a local model. No command opens the GUI.",
    )
    _add_common(parser)
    parser.add_argument("--selftest", action="store_true", help="check this install headless and exit (0 = all held)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    for command in sub.choices.values():  # `tune --model M` as well as `--model M tune`
        _add_common(command, after_command=True)
    return parser


def _add_common(parser: argparse.ArgumentParser, after_command: bool = False) -> None:
    """The options every command shares. After the command they default to SUPPRESS, so one given before
    the command is not overwritten by the command's own default."""
    def d(value):
        return argparse.SUPPRESS if after_command else value

    parser.add_argument("--model", default=d(None),
                        help="a local GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", type=int, default=d(None), help="CPU threads (default: all cores)")
    parser.add_argument("--ctx", type=int, default=d(AUTO_CTX),
                        help="context size in tokens, capped at the model's (default 0: follows the document, up to "
                             "the model's trained context and a K/V cache of a quarter of the RAM)")
    parser.add_argument("-v", "--verbose", action="store_true", default=d(False), help="log details to stderr")


def run_cli(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if args.selftest:
        from app.selftest import run_selftest

        return run_selftest(args)
    if args.command is None:
        from app.commands.run import open_gui

        return open_gui(args)
    try:
        return int(args.func(args) or 0)
    except RidgeFillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:  # a bug: log it whole, tell the user where
        logging.getLogger("app").exception("unexpected error")
        print("error: unexpected failure; details are in the log file (see `python -m app info`).", file=sys.stderr)
        return 1
