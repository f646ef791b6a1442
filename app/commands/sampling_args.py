"""The sampling flags `chat` and `serve` share: the names of llama.cpp's server, each checked against
backend/sampling.py's range when parsed; what is not given comes from the model's defaults."""
from __future__ import annotations

import argparse
from dataclasses import replace

from backend.sampling import (
    GREEDY,
    MAX_BREAKER_CHARS,
    RANGES,
    SamplingParams,
    breakers_error,
    model_defaults,
    numeric_fields,
    range_text,
)

HELP = {
    "temperature": "0 = greedy",
    "top_k": "0 = off",
    "top_p": "1 = off",
    "min_p": "0 = off",
    "repeat_penalty": "1 = off",
    "repeat_last_n": "the penalties' window: the answer's last n tokens; 0 = off, -1 = all of it",
    "presence_penalty": "0 = off",
    "frequency_penalty": "0 = off",
    "dry_multiplier": "DRY's strength against repeating what the answer said; 0 = off",
    "dry_base": "DRY's growth per token of a repeat",
    "dry_allowed_length": "DRY: a repeat of up to this many tokens is free",
    "dry_penalty_last_n": "DRY's window: the answer's last n tokens; 0 = off, -1 = all of it",
    "seed": "-1 = a new one each time",
}


def _ranged(name: str, kind: type):
    lo, hi = RANGES[name]

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a number' if kind is float else 'an integer'}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text} is outside {range_text(name)}")
        return value

    return parse


def _breaker(text: str) -> str:
    text = text.replace("\\n", "\n")  # "\n" as typed in a shell: a new line
    if not 0 < len(text) <= MAX_BREAKER_CHARS:
        raise argparse.ArgumentTypeError(f"a breaker is 1 to {MAX_BREAKER_CHARS} characters")
    return text


def _breakers(given: list[str]) -> tuple[str, ...]:
    out = () if given == ["none"] else tuple(given)
    problem = breakers_error(out)
    if problem:
        raise SystemExit(f"--dry-sequence-breaker: the breakers must be {problem}")
    return out


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling", "Left out: the model's defaults (its file's recommendation, else "
                                  "the app's; see docs/SERVER.md). --greedy: all off, the same answer each time.")
    for f in numeric_fields():
        kind = int if isinstance(getattr(GREEDY, f.name), int) else float
        g.add_argument("--" + f.name.replace("_", "-"), type=_ranged(f.name, kind), default=None,
                       help=f"{HELP[f.name]} ({range_text(f.name)})")
    g.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="TEXT", type=_breaker,
                   help="DRY: a repeat does not reach back over TEXT (repeatable; replaces the defaults "
                        "\\n : \" *; 'none': no breakers), as llama.cpp's flag")
    g.add_argument("--greedy", action="store_true", help="temperature 0, no penalties, no DRY, unless a flag says more")


def sampling_from_args(args, recommended: tuple = ()) -> SamplingParams:
    """The flags given, over greedy (--greedy) or the model's defaults (`recommended`: ModelInfo.sampling)."""
    base = GREEDY if args.greedy else model_defaults(dict(recommended))[0]
    given = {f.name: getattr(args, f.name) for f in numeric_fields() if getattr(args, f.name) is not None}
    if args.dry_sequence_breaker is not None:
        given["dry_sequence_breakers"] = _breakers(args.dry_sequence_breaker)
    return replace(base, **given)


def sampling_given(args) -> bool:
    """Whether any sampling flag was given (serve: else each request gets the model's defaults)."""
    return (args.greedy or args.dry_sequence_breaker is not None
            or any(getattr(args, f.name) is not None for f in numeric_fields()))
