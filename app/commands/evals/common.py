"""What the eval commands (recall, compare, nll, sweep, hitrate) share: list arguments, defaults, items, stderr
progress."""
from __future__ import annotations

import argparse
import sys

from backend.evals.document_questions import QUESTION_SETS, question_items
from backend.evals.haystacks import load_haystack
from backend.evals.needles import make_items
from backend.ridgefill.defaults import default_split, default_tail


def int_list(text: str) -> list[int]:
    try:
        return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def float_list(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if any(not 0.0 <= d <= 1.0 for d in out):
        raise argparse.ArgumentTypeError("depths are shares of the haystack, between 0 and 1")
    return out


def str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_split_tail(p) -> None:
    p.add_argument("--split", type=int, default=None, help="RidgeFill split S (default: the model's default)")
    p.add_argument("--tail", type=int, default=None, help="exact tail T in tokens (default: the model's default)")


def split_tail(args, info) -> tuple[int, int]:
    """The split and tail asked for, else the model's defaults."""
    asked_split = getattr(args, "split", None)
    split = asked_split if asked_split is not None else default_split(info)
    tail = args.tail if args.tail is not None else default_tail(info)
    return split, tail


def haystack_of(args):
    return load_haystack(getattr(args, "haystack", None))


def eval_items(engine, haystack: str | None, *, lengths, depths, variants, reps: int = 1, seed: int = 0) -> list:
    """Items for one haystack: a set of questions about real documents (their own lengths and places), or
    needles hidden in a haystack at the given lengths and depths."""
    if haystack in QUESTION_SETS:
        return question_items(engine, haystack)
    return make_items(engine, lengths=lengths, depths=depths, variants=variants, haystack=load_haystack(haystack),
                      reps=reps, seed=seed)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
