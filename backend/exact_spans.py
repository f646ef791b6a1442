"""The document text RidgeFill made exact: after a request, the character spans, per attached document, of
the document rows whose K/V are exact (guided's places, quality's share, the exact tail), adjacent rows
merged. The GUI shades them beside the answer's sources, so the user sees what RidgeFill looked at.

Read from the row record (backend/row_record.py) and the sources' placement of each document in the prompt
(backend/sources.py `place_documents`): no decode. A document all of whose rows are exact (an `off` run, a
document wholly re-decoded) gets no span: there is nothing to tell apart.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

from .documents import DocumentText
from .sources import PlacedDocument, place_documents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExactSpan:
    document: str  # the file's name as attached
    start: int  # character offsets into the text the app read from the document
    end: int

    def as_dict(self) -> dict:
        return asdict(self)


def exact_spans(engine, tokens: list[int], documents: list[DocumentText],
                placed: list[PlacedDocument] | None = None) -> list[ExactSpan]:
    """The spans of each document's exact rows, in document order then text order; none when the cache no
    longer holds the prompt or no document row is approximated. Never fails the request. `placed`: the
    documents already placed in the prompt (place_documents)."""
    try:
        return _spans(engine, tokens, documents, placed)
    except Exception:  # noqa: BLE001 - the answer stands without its shading
        log.exception("exact spans failed")
        return []


def _spans(engine, tokens: list[int], documents: list[DocumentText],
           placed: list[PlacedDocument] | None) -> list[ExactSpan]:
    if not engine.slot.holds(tokens):
        return []
    approximated = engine.slot.record.approximated(0, len(tokens))
    if not approximated:  # every row exact (an `off` run): nothing to shade
        return []
    out: list[ExactSpan] = []
    for d in place_documents(engine, tokens, documents) if placed is None else placed:
        exact = ~np.isin(np.arange(d.rows.start, d.rows.stop), approximated)
        if exact.all() or not exact.any():
            continue
        # each row's text runs to the next row's first character; the last row's to the end of the body
        bounds = np.append(d.char_of_row, len(d.doc.text.rstrip()))
        padded = np.concatenate([[False], exact, [False]])
        edges = np.flatnonzero(padded[1:] != padded[:-1])  # run starts and ends, alternating
        for first, stop in zip(edges[::2], edges[1::2]):
            span = _trimmed(d.doc.text, int(bounds[first]), int(bounds[stop]))
            if span is not None:
                out.append(ExactSpan(d.doc.name, *span))
    return out


def _trimmed(text: str, start: int, end: int) -> tuple[int, int] | None:
    """[start, end) without white space at its ends; None when nothing else is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None
