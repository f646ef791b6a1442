"""The needle items of tune's check (backend/tuning/needle_check.py): needles planted in shipped haystacks
(backend/recall/needles.py), only those whose asked needle lies in the approximated bulk."""
from __future__ import annotations

from ..errors import RidgeFillError
from ..recall.haystacks import load_haystack
from ..recall.needles import NeedleItem, make_items
from ..recall.run import effective_tail


def bulk_items(engine, length: int, depths, variants, haystacks, tail: int,
               max_answer_tokens: int | None) -> list[NeedleItem]:
    """The needle items of every haystack whose asked needle lies in the approximated bulk at `tail`."""
    items = [it for name in haystacks for it in make_items(engine, lengths=[length], depths=list(depths),
                                                            variants=list(variants), haystack=load_haystack(name))]
    bulk_tail = effective_tail(engine, length, tail)
    items = [it for it in items if it.region(bulk_tail) == "bulk"]
    for it in items if max_answer_tokens else ():  # tests: a 7-digit answer needs only a few tokens
        it.max_tokens = min(it.max_tokens, max_answer_tokens)
    if not items:
        raise RidgeFillError(f"no needle item lies in the approximated bulk at {length} tokens with tail {tail}; "
                             "give a longer --length.")
    return items
