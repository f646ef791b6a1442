"""The answer's sources: the places in the attached documents the question itself attends to.

After a request's prefill (any mode) the prompt's rows after its documents (the question and the
template's assistant header, at most `window`) are decoded again on a spare sequence through the layers
below the scoring layer, at their true positions, seeing sequence 0's rows before them (the probe of
guided mode: backend/ridgefill/guided.py). Their queries meet each document row's exact key at that
layer, read from the cache by the row's cell; the scores of a question about nothing in particular are
taken off, as guided does. The best rows, distinct passages (two a sentence apart joined), become up to
MAX_SOURCES sources: the document, the page (PDF), character offsets into the text the app read and the
sentence around the place.

Rows need known cells: RidgeFill's passes, refinement and a prompt-cache reload record them; an exact
prefill records them where its plan says so (ridgefill/plan.plan_prefill gives a request with documents
a cell-recording hook). Rows with none (a RidgeFill request's exact tail) are not scored.
"""
from __future__ import annotations

import bisect
import logging
import re
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from .documents import DocumentText
from .errors import EngineError, RidgeFillError
from .ridgefill.cache_layout import LayoutRefused
from .ridgefill.defaults import default_split
from .ridgefill.guided import DEFAULT as GUIDED, combined, contrast_prompt, contrasted, layer_scores
from .ridgefill.injection import one_torch_thread
from .ridgefill.runtime import runtime
from .ridgefill.stream_capture import StreamTap

log = logging.getLogger(__name__)

MAX_SOURCES = 3
PROBE_ROWS = GUIDED.window  # cells the probe takes beside the prompt and its answer (completion.py makes room)
BACK_ROWS = GUIDED.back_min  # a place starts this many rows before its best row (the key before the value)
PASSAGE_CHARS = 400  # a passage longer than this (a long sentence) is cut around its place
# A shorter one takes the sentences after it too: a question in a FAQ, a key before its value, a heading
# before its paragraph (the place's own sentence alone missed the answer on the real-QA set).
MIN_PASSAGE_CHARS = 120
# Short lines beside the passage join it, up to this many characters a side: the option before its
# description, the line ending in a colon before its code, the command after the step it names (the
# real-QA misses: docs/measurements/sources.md#sources-on-all-191-real-questions-with-their-lead-in-lines).
LEAD_CHARS = 100
# Two of the question's places this close (characters between their passages) are one passage, up to
# JOINED_CHARS: a FAQ's question and its answer, a key and its value a line apart
# (docs/measurements/sources.md#sources-neighbouring-places-joined).
JOIN_GAP = 100
JOINED_CHARS = 600
# A row's score is the most any one of the question's rows gives it, not their sum: more real questions'
# answers among the sources (docs/measurements/sources.md#sources-the-questions-rows-alone).
ROWS = "max"
RANKS_LOOKED_AT = 400  # best rows looked at for distinct places
# A sentence ends at . ? or ! before white space, at a blank line, or at a line break whose next line does
# not go on in lower case (hard-wrapped prose goes on; a list item or heading does not): guided's "wrap".
_SENTENCE_END = re.compile(r"[.?!][\"')\]]*\s+|\n[ \t]*\n\s*|\n(?=[ \t]*[^a-z \t\n])")


@dataclass(frozen=True)
class Source:
    document: str  # the file's name as attached
    page: int | None  # the PDF page (from 1) that holds `start`; None without pages
    start: int  # character offsets into the text the app read from the document
    end: int
    text: str  # the passage: the sentence (or a few lines) around the place
    score: float  # the place's attention score (the best is near 1)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class PlacedDocument:
    """One document found in the prompt: its rows, and each row's first character in its text."""
    doc: DocumentText
    rows: range
    char_of_row: np.ndarray  # per row of `rows`: the offset in doc.text of its first character


def find_sources(engine, tokens: list[int], documents: list[DocumentText], timings,
                 placed: list[PlacedDocument] | None = None) -> list[Source]:
    """The answer's sources, best first; the time taken goes to timings.sources_ms and a reason for none
    to timings.note. Never fails the request. `placed`: the documents already placed in the prompt."""
    t0 = time.perf_counter()
    try:
        found, why = answer_sources(engine, tokens, documents, placed=placed)
    except (RidgeFillError, EngineError) as exc:
        found, why = [], str(exc)
    except Exception as exc:  # noqa: BLE001 - the answer stands without its sources
        log.exception("sources failed")
        found, why = [], f"{type(exc).__name__}: {exc}"
    timings.sources_ms = (time.perf_counter() - t0) * 1000
    if why:
        timings.note = " ".join(n for n in (timings.note, f"no sources: {why}") if n)
    return found


def answer_sources(engine, tokens: list[int], documents: list[DocumentText], *, contrast: bool = GUIDED.contrast,
                   window: int = GUIDED.window, n: int = MAX_SOURCES,
                   placed: list[PlacedDocument] | None = None) -> tuple[list[Source], str]:
    """Up to `n` sources and "" or no sources and why. `placed`: place_documents(documents), when done."""
    rt = runtime(engine)
    if rt.refused is not None:
        return [], rt.refused
    if not engine.slot.holds(tokens):
        return [], "the cache no longer holds the prompt"
    placed = place_documents(engine, tokens, documents) if placed is None else placed
    if not placed:
        return [], "the documents' text was not found in the prompt"
    window = question_window(tokens, placed, window)
    cand_set = set(engine.slot.record.with_cells(0, len(tokens) - window))
    candidates = [p for d in placed for p in d.rows if p in cand_set]
    if not candidates:
        return [], "no document row has a known cache cell (RidgeFill's layout was not known at prefill)"
    split = min(default_split(engine.info), engine.info.n_layer - 1)
    layers = GUIDED.scoring_layers(engine.info.n_layer, max(split, 2), rt.windows.windowed)
    with one_torch_thread():
        per_layer = layer_scores(engine, rt, tokens, candidates, probe(engine, tokens, layers, window), rows=ROWS)
        if contrast:
            other = contrast_prompt(engine, tokens, window)
            asked = min(window, len(other) - (len(tokens) - window))  # the contrast question's own rows
            others = layer_scores(engine, rt, other, candidates, probe(engine, other, layers, asked), rows=ROWS)
            scores = contrasted(per_layer, others, layers, GUIDED.pool)
        else:
            scores = combined(per_layer, layers, GUIDED.pool)
    return best_places(placed, candidates, scores, n), ""


def question_window(tokens: list[int], placed: list[PlacedDocument], window: int) -> int:
    """The probe's rows: the prompt's rows after its last document (the question and the template), at
    most `window`. The document's own last rows among them ranked the real questions' sources worse
    (docs/measurements/sources.md#sources-the-questions-rows-alone)."""
    return max(1, min(window, len(tokens) - max(d.rows.stop for d in placed)))


def probe(engine, tokens: list[int], layers: list[int], window: int) -> dict[int, np.ndarray]:
    """The streams entering `layers` of the last `window` rows of `tokens`, decoded on sequence 1 at their
    true positions after sequence 0's rows before them (what the prefill computed below those layers),
    through the layers below max(layers) only. The cache is left as it was."""
    before = len(tokens) - window
    tap = StreamTap(layers, cut_after=f"l_out-{max(layers) - 1}")
    engine.spares.copy(0, 1, 0, before)
    try:
        with engine.hooked(tap):
            engine.spares.decode_rows(tokens[before:], range(before, len(tokens)), [1] * window)
    finally:
        engine.spares.clear()
    if tap.error or any(il not in tap.rows for il in layers):
        raise LayoutRefused(f"sources probe: {tap.error or 'a scoring layer stream was not seen'}")
    return tap.rows


def place_documents(engine, tokens: list[int], documents: list[DocumentText]) -> list[PlacedDocument]:
    """Each document's rows in the prompt, found in order in the text of the prompt's tokens; a document
    whose text is not there verbatim (a template that changed it) is left out."""
    pieces = [engine.token_bytes(t, special=True) for t in tokens]
    row_start = np.cumsum([0] + [len(b) for b in pieces])  # byte offset of each row, and the end
    prompt = b"".join(pieces)
    out, cursor = [], 0
    for doc in documents:
        body = doc.text.strip()
        lead = len(doc.text) - len(doc.text.lstrip())
        raw = body.encode("utf-8")
        at = prompt.find(raw, cursor) if raw else -1
        if at < 0:
            continue
        cursor = at + len(raw)
        first = int(np.searchsorted(row_start, at, side="right")) - 1
        last = int(np.searchsorted(row_start, cursor, side="left"))  # one past the last row it touches
        # each byte's character in the body: characters start at bytes that are not UTF-8 continuations
        char_of_byte = np.cumsum((np.frombuffer(raw, dtype=np.uint8) & 0xC0) != 0x80) - 1
        byte_in_body = np.clip(row_start[first:last] - at, 0, len(raw) - 1)
        out.append(PlacedDocument(doc, range(first, last), char_of_byte[byte_in_body] + lead))
    return out


def best_places(placed: list[PlacedDocument], candidates: list[int], scores: torch.Tensor, n: int) -> list[Source]:
    """The best-scoring rows, each made a passage; a row inside a passage already taken is skipped, and a
    passage near one already taken joins it (JOIN_GAP)."""
    where = {}
    for d in placed:
        for i, p in enumerate(d.rows):
            where[p] = (d, i)
    taken: list[Source] = []
    for i in torch.argsort(scores, descending=True)[:RANKS_LOOKED_AT].tolist():
        if len(taken) >= n:
            break
        d, k = where[candidates[i]]
        at = int(d.char_of_row[k])
        if any(s.document == d.doc.name and s.start <= at < s.end for s in taken):
            continue
        lo, hi = page_bounds(d.doc, at)
        start, end = passage(d.doc.text, max(lo, int(d.char_of_row[max(0, k - BACK_ROWS)])), at, (lo, hi))
        j = _joinable(taken, d.doc.name, start, end, (lo, hi))
        if j is not None:  # the better place's source grows, keeping its score
            a, b = min(start, taken[j].start), max(end, taken[j].end)
            taken[j] = replace(taken[j], start=a, end=b, text=d.doc.text[a:b])
        elif not _overlapped(taken, d.doc.name, start, end):
            taken.append(Source(d.doc.name, d.doc.page_at(start), start, end, d.doc.text[start:end],
                                round(float(scores[i]), 4)))
    return taken


def _joinable(taken: list[Source], document: str, start: int, end: int, page: tuple[int, int]) -> int | None:
    """The index of a source of `document` on the same page within JOIN_GAP characters of [start, end)
    that together with it stays within JOINED_CHARS and clear of the other sources, or None."""
    for j, s in enumerate(taken):
        a, b = min(start, s.start), max(end, s.end)
        if (s.document == document and page[0] <= s.start and s.end <= page[1]
                and start - s.end <= JOIN_GAP and s.start - end <= JOIN_GAP and b - a <= JOINED_CHARS
                and not _overlapped([o for o in taken if o is not s], document, a, b)):
            return j
    return None


def _overlapped(taken: list[Source], document: str, start: int, end: int) -> bool:
    """Whether a source of `document` in `taken` shares a character with [start, end)."""
    return any(s.document == document and s.start < end and start < s.end for s in taken)


def page_bounds(doc: DocumentText, at: int) -> tuple[int, int]:
    """The offsets where the page holding `at` starts and ends (the whole text without pages): a passage
    stays on its page, so the page it names holds all of it."""
    if not doc.page_starts:
        return 0, len(doc.text)
    i = bisect.bisect_right(doc.page_starts, at) - 1
    return max(0, doc.page_starts[max(0, i)]), (doc.page_starts[i + 1] if i + 1 < len(doc.page_starts) else len(doc.text))


def passage(text: str, first: int, at: int, bounds: tuple[int, int] | None = None) -> tuple[int, int]:
    """[start, end) of the sentences from the one holding `first` to the one holding `at`, and those after
    it up to MIN_PASSAGE_CHARS, with the short lines beside them, within `bounds` (its page); cut to
    PASSAGE_CHARS around `at` when longer; no white space at the ends."""
    page_lo, hi = bounds or (0, len(text))
    lo = max(page_lo, first - PASSAGE_CHARS)  # no sentence starts between here and `first`: cut below
    starts = [lo] + [m.end() for m in _SENTENCE_END.finditer(text, lo, min(hi, at + PASSAGE_CHARS))]
    i = max(0, bisect.bisect_right(starts, first) - 1)
    nxt = bisect.bisect_right(starts, at)
    while nxt < len(starts) and starts[nxt] - starts[i] < MIN_PASSAGE_CHARS:
        nxt += 1
    i, nxt = _with_short_lines(text, starts, i, nxt, first_is_real=lo == page_lo)
    start = starts[i]
    end = min(hi, starts[nxt] if nxt < len(starts) else at + PASSAGE_CHARS)
    if end - start > PASSAGE_CHARS:
        start = max(start, min(first, at - PASSAGE_CHARS // 3))
        end = min(end, start + PASSAGE_CHARS)
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _with_short_lines(text: str, starts: list[int], i: int, nxt: int, first_is_real: bool) -> tuple[int, int]:
    """The sentences starts[i]..starts[nxt] widened by the short lines around them, LEAD_CHARS at most a
    side: sentences before that end a line, and after a line break sentences that follow. starts[0] is a
    sentence's start only when `first_is_real` (the text's or the page's start)."""
    lowest, opening = (0 if first_is_real else 1), starts[i]
    while i > lowest and opening - starts[i - 1] <= LEAD_CHARS and _ends_line(text, starts[i - 1], starts[i]):
        i -= 1
    if 0 < nxt < len(starts) and _ends_line(text, starts[nxt - 1], starts[nxt]):
        closing = starts[nxt]
        while nxt + 1 < len(starts) and starts[nxt + 1] - closing <= LEAD_CHARS:
            nxt += 1
    return i, nxt


def _ends_line(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] ends in white space that holds a line break."""
    piece = text[start:end]
    return "\n" in piece[len(piece.rstrip()):]
