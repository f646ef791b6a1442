"""The headless command line. Each command lives in app/commands/<name>.py with `register(subparsers)`.
The lab's commands (measuring RidgeFill, not using it) are `python -m lab` (lab/cli.py), which reuses the
common options and the error handling here; `python -m app <lab command>` says where it went
(app/moved_commands.py)."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from app.logging_setup import setup_logging
from app.moved_commands import moved_command, moved_message
from backend.errors import RidgeFillError
from backend.protocol import AUTO_CTX

# One module per command; each adds its own sub-parser and sets `func` (listed in this order in --help).
COMMANDS = ["info", "chat", "demo", "run", "models", "download", "maps", "download_maps", "publish_maps",
            "fit_maps", "tune", "serve", "cache"]
COMMAND_MODULES = [f"app.commands.{name}" for name in COMMANDS]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app",
        description="RidgeFill Desktop: chat with long documents on a local model. No command opens the GUI.",
        epilog="Measuring RidgeFill (recall, bench, fidelity, the fuzzers, ...) is the lab's, from a checkout: "
               "python -m lab --help",
    )
    add_common(parser)
    parser.add_argument("--selftest", action="store_true", help="check this install headless and exit (0 = all held)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_commands(sub, COMMAND_MODULES)
    return parser


def add_commands(sub, modules: list[str]) -> None:
    """Each module registers its command; then every command takes the common options after it too
    (`tune --model M` as well as `--model M tune`)."""
    for module in modules:
        importlib.import_module(module).register(sub)
    for command in sub.choices.values():
        add_common(command, after_command=True)


def add_common(parser: argparse.ArgumentParser, after_command: bool = False) -> None:
    """The options every command shares. After the command they default to SUPPRESS, so one given before
    the command is not overwritten by the command's own default."""
    def d(value):
        return argparse.SUPPRESS if after_command else value

    parser.add_argument("--model", default=d(None),
                        help="a local GGUF file (default: the embedded Gemma 3 270M)")
    parser.add_argument("--threads", type=int, default=d(None), help="CPU threads (default: all cores)")
    parser.add_argument("--ctx", type=int, default=d(AUTO_CTX),
                        help="context size in tokens, capped at the model's (default 0: follows the document, up to "
                             "the model's trained context and a K/V cache of a quarter of the RAM and half the "
                             "memory available)")
    parser.add_argument("--gpu-layers", type=_gpu_layers, default=d("auto"), metavar="auto|none|N",
                        help="layers of the exact model on a GPU (default auto: all that fit, where llama.cpp was "
                             "built with a GPU backend; RidgeFill runs exact while any are)")
    parser.add_argument("-v", "--verbose", action="store_true", default=d(False), help="log details to stderr")


def _gpu_layers(text: str):
    from backend.gpu_offload import parse_gpu_layers

    try:
        return parse_gpu_layers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_cli(argv: list[str]) -> int:
    if moved := moved_command(argv):
        print(moved_message(moved, argv), file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if args.selftest:
        from app.selftest import run_selftest

        return run_selftest(args)
    if args.command is None:
        from app.commands.run import open_gui

        return open_gui(args)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """The parsed command run, its failures as one line and an exit code (2: the user's to fix)."""
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
