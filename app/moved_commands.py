"""The commands that moved from `python -m app` to the lab: they measure RidgeFill (recall, bench, fidelity,
the fuzzers, a load test, the prompt cache's bench) and live beside the product in lab/ (`python -m lab`),
which the app never imports. Asked for one, the app says where it went, with the same arguments."""
from __future__ import annotations

import shlex

# `python -m lab`'s commands (lab/cli.py; tests/test_lab_cli.py checks that the two lists agree)
LAB_COMMANDS = ("recall", "compare", "nll", "sweep", "bench", "hitrate", "followup", "sources", "fidelity",
                "fuzz-readers", "fuzz-server", "serve-load")
LAB_CACHE_ACTIONS = ("bench",)  # `cache bench`; `cache list` and `cache clear` stay the app's
VALUE_OPTIONS = ("--model", "--threads", "--ctx")  # the common options that take a value (app/cli.py)


def moved_command(argv: list[str]) -> str | None:
    """The lab command `argv` asks for ("recall", "cache bench"), or None."""
    words = _first_words(argv, 2)
    if words[:1] and words[0] in LAB_COMMANDS:
        return words[0]
    if words[:1] == ["cache"] and words[1:] and words[1] in LAB_CACHE_ACTIONS:
        return f"cache {words[1]}"
    return None


def _first_words(argv: list[str], n: int) -> list[str]:
    """The first `n` words of `argv` that are neither options nor a common option's value."""
    words: list[str] = []
    value_next = False
    for arg in argv:
        if value_next:
            value_next = False
        elif arg.startswith("-"):
            value_next = arg in VALUE_OPTIONS
        elif len(words) < n:
            words.append(arg)
    return words


def moved_message(command: str, argv: list[str]) -> str:
    return (f"error: `{command}` measures RidgeFill and is no longer a command of the app: it lives in the lab "
            f"beside it. From a checkout of the repository, run:\n  python -m lab {shlex.join(argv)}")
