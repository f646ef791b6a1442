"""What the eval commands (recall, compare, nll, sweep, hitrate, followup) share: split and tail, items, stderr
progress."""
from __future__ import annotations

import sys

from backend.recall.document_questions import QUESTION_SETS, question_items
from backend.recall.haystacks import load_haystack
from backend.recall.needles import make_items
from backend.ridgefill.defaults import default_mode, split_or_default, switched_on_mode, tail_or_default


def add_split_tail(p) -> None:
    p.add_argument("--split", type=int, default=None, help="RidgeFill split S (default: the model's default)")
    p.add_argument("--tail", type=int, default=None, help="exact tail T in tokens (default: the model's default)")


def split_tail(args, info) -> tuple[int, int]:
    """The split and tail asked for, else the model's defaults."""
    return split_or_default(info, getattr(args, "split", None)), tail_or_default(info, args.tail)


def ridgefill_mode(info, asked: str | None, quiet: bool = False) -> str:
    """The RidgeFill mode a measurement runs: as asked, else the model's default; where that default is exact
    (a tune, or the measured table, chose it), the mode the app runs when RidgeFill is switched on (said
    unless `quiet`)."""
    if asked:
        return asked
    if default_mode(info) == "off" and not quiet:
        say(f"this model runs exact by default; measuring RidgeFill as switched on, {switched_on_mode(info)} "
            "(pass --mode to choose)")
    return switched_on_mode(info)


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
