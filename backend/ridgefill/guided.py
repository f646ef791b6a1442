"""guided mode: the question's own attention at the exact lower layers picks the bulk rows to make exact.

After the bulk pass, the last WINDOW prompt rows (the question and the template's assistant header) run
through the layers below the split on a spare sequence that shares sequence 0's bulk cells (the probe;
the cache is left as it was). At each scoring layer, their queries (the captured layer input through
the layer's own Q path, RoPE at their true positions) meet every approximated bulk row's exact key,
read from the cache: softmax over the bulk per head and window row, summed over the window, max over
heads (retrieval heads are few), average-pooled over neighbouring rows, combined over layers. The
same scores for a question about nothing in particular are taken off (what every question looks at). The
best rows, then a few by the question's own scores, each with a window that reaches forward to the value
it introduces, are decoded again through every layer, each run seeing the runs before it exact
(redecode.redecode_exact, chained: one llama_decode whose mask run_mask edits; the layers below the
split are not run again: lower_skip), then the exact tail runs.

Llama.cpp wants each sequence's positions consecutive, so the probe's rows sit right after the bulk
instead of at their true positions: only the layers below the scoring layer see that shift.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..protocol import ChatMessage
from .cache_layout import LayoutRefused
from .stream_capture import StreamTap
from .redecode import Run, runs_of


@dataclass(frozen=True)
class GuidedParams:
    window: int = 32  # prompt rows whose attention scores the bulk
    # scoring layers as shares of the model's depth (kept below the split): 0.24 of SmolLM2's 30 is layer
    # 7, which holds its retrieval heads (docs/measurements/guided-design.md#selection-hit-rate-the-design-grid)
    layers: tuple[float, ...] = (0.24,)
    pool: int = 5  # average-pooling kernel over neighbouring rows
    # rows taken before a selected row: back to its sentence's start, at least back_min and at most back
    # rows (a fixed 4 lost real questions whose answer's rows were exact: the question's own words before
    # them were not; docs/measurements/real-questions.md#real-questions-about-real-documents)
    back: int = 32
    back_min: int = 4
    forward: int = 40  # rows taken after it, at most: to the end of its sentence (the value follows the key)
    # distinct places the question points to, made exact: 8 lost fewer multivalue needles than 4 or 6
    # (docs/measurements/guided-design.md#places-8-not-4-or-6); 16, with twice the budget, fewer real questions
    # (docs/measurements/real-questions.md#real-questions-about-real-documents)
    peaks: int = 16
    budget: int = 512  # no place is taken once this many rows are (the last one is taken whole)
    # Rows before this are never picked: the prompt's frame (system prompt, instructions) draws every
    # question's attention (docs/measurements/guided-design.md#prompt-head-left-out).
    head: int = 64
    # The question's scores minus a question about nothing in particular's (CONTRAST_QUESTION), each
    # scaled to a maximum of 1: what any question looks at (paragraph starts, a few "magnet" sentences,
    # recent rows) drops out, and real questions' answers get selected
    # (docs/measurements/guided-design.md#contrast-question).
    contrast: bool = True
    # which line breaks end a sentence (sentence_ends): docs/measurements/guided-design.md#contrast-question
    newlines: str = "wrap"
    # Then places by the question's own scores, without the contrast: what every question looks at,
    # which in a needle haystack is every needle: the rival needles must be exact for the model to tell
    # them apart (docs/measurements/guided-design.md#contrast-question).
    also_peaks: int = 4
    # Rows made exact besides the question's choice: an eval's oracle (the answer's rows,
    # backend/recall/run.py), never set by a request.
    also_rows: tuple[int, ...] = ()

    def scoring_layers(self, n_layer: int, split: int, windowed=frozenset()) -> list[int]:
        """The layers whose attention scores the bulk, below the split; on a sliding-window model the
        global layer nearest to each (a sliding-window layer sees only the last rows), the split layer
        included: its keys come from the exact stream entering it (Gemma 3 at S = 5); with none there,
        the first global layer above the split, whose keys the maps predict (Gemma 3 at S < 5)."""
        wanted = {min(split - 1, max(1, round(f * n_layer))) for f in self.layers}
        glob = [il for il in range(1, split + 1) if il not in windowed] or \
            [il for il in range(split + 1, n_layer) if il not in windowed][:1]
        if not windowed or not glob:
            return sorted(wanted)
        return sorted({min(glob, key=lambda g: (abs(g - il), g)) for il in wanted})


DEFAULT = GuidedParams()
CONTRAST_QUESTION = "What does the document say?"
SENTENCE_END = (".", "?", "!")
NEWLINE_RULES = ("line", "wrap", "paragraph")


def sentence_ends(pieces: list[str], newlines: str = "wrap") -> list[int]:
    """For each row p, the first row from p + 2 on whose text ends a sentence (the last row if none):
    one with . ? or !, a blank line, or a line break where `newlines` says so: every one ("line"), one
    whose next line does not go on in lower case ("wrap": hard-wrapped prose breaks lines mid-sentence),
    or none ("paragraph")."""
    n = len(pieces)
    next_end = [n - 1] * (n + 2)
    for q in range(n - 1, -1, -1):
        next_end[q] = q if _ends_sentence(pieces, q, newlines) else next_end[q + 1]
    return [next_end[min(p + 2, n)] for p in range(n)]


def sentence_starts(pieces: list[str], newlines: str = "wrap") -> list[int]:
    """For each row p, the first row of its sentence: the row after the last one before p that ends a
    sentence (by the rule of sentence_ends), or 0."""
    starts, start = [], 0
    for p in range(len(pieces)):
        starts.append(start)
        if _ends_sentence(pieces, p, newlines):
            start = p + 1
    return starts


def _ends_sentence(pieces: list[str], q: int, newlines: str) -> bool:
    piece = pieces[q]
    if any(c in piece for c in SENTENCE_END) or "\n\n" in piece:
        return True
    if "\n" not in piece:
        return False
    after = (piece.rsplit("\n", 1)[1] + "".join(pieces[q + 1 : q + 3])).lstrip(" \t")
    if after.startswith("\n") or newlines == "line":  # a blank line, or every line break
        return True
    return newlines == "wrap" and not after[:1].islower()  # wrap: goes on if the next line starts in lower case


def probe_streams(engine, tokens: list[int], layers: list[int], window: int) -> dict[int, np.ndarray]:
    """The streams entering `layers` for the last `window` prompt rows, from a decode on sequence 1
    through the layers below max(layers) only. Sequence 1 shares sequence 0's cells for the decode and
    lets go of every cell after, so the cache is as it was."""
    n_cached = len(engine.slot.record)
    rows = tokens[-window:]
    tap = StreamTap(layers, cut_after=f"l_out-{max(layers) - 1}")
    engine.spares.copy(0, 1, 0, n_cached)
    try:
        with engine.hooked(tap):
            engine.spares.decode_rows(rows, range(n_cached, n_cached + len(rows)), [1] * len(rows))
    finally:
        engine.spares.clear()
    if tap.error or any(il not in tap.rows for il in layers):
        raise LayoutRefused(f"guided probe: {tap.error or 'a scoring layer stream was not seen'}")
    return tap.rows


def attention_scores(queries: torch.Tensor, keys: torch.Tensor, head_dim: int,
                     own_keys: torch.Tensor | None = None, heads: str = "max", rows: str = "sum") -> torch.Tensor:
    """Per bulk row, the attention it gets: queries (w, n_head, d), keys (n, n_head_kv, d) → softmax
    per head and query over the n rows and (causally) the window's own keys (w, n_head_kv, d), summed
    (or max) over the w queries, max (or sum) over heads: (n,). The window's own keys keep a query that
    looks at its neighbours from spreading that mass over the bulk."""
    n_head, n_head_kv = queries.shape[1], keys.shape[1]
    n = keys.shape[0]
    if own_keys is not None:
        keys = torch.cat([keys, own_keys])
    k = keys.repeat_interleave(n_head // n_head_kv, dim=1)  # (n + w, n_head, d): grouped-query heads
    logits = torch.einsum("whd,nhd->hwn", queries, k) / head_dim**0.5
    if own_keys is not None:
        w = queries.shape[0]
        future = torch.triu(torch.ones(w, w, dtype=torch.bool), diagonal=1)
        logits[:, :, n:] = logits[:, :, n:].masked_fill(future, float("-inf"))
    probs = logits.softmax(dim=-1)[:, :, :n]
    probs = probs.sum(dim=1) if rows == "sum" else probs.amax(dim=1)
    return probs.amax(dim=0) if heads == "max" else probs.sum(dim=0)


def pooled(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    if kernel <= 1:
        return scores
    return torch.nn.functional.avg_pool1d(scores[None, None], kernel, stride=1, padding=kernel // 2,
                                          count_include_pad=False)[0, 0][: scores.shape[0]]


def layer_scores(engine, rt, tokens: list[int], candidates: list[int], streams: dict[int, np.ndarray],
                 *, heads: str = "max", rows: str = "sum", with_window: bool = True) -> dict[int, torch.Tensor]:
    """Per scoring layer, the attention each candidate row (bulk positions with a known cell, in order)
    gets from the window's queries (attention_scores), before pooling."""
    window = len(next(iter(streams.values())))
    pos = torch.arange(len(tokens) - window, len(tokens))
    cells = np.asarray(engine.slot.record.cells(candidates))
    qpath = rt.query_path(sorted(streams))
    out = {}
    for il, h in streams.items():
        ll = rt.layout.layers[il]
        h = torch.from_numpy(np.asarray(h, dtype=np.float32))
        q = qpath.queries(il, h, pos)
        k = torch.from_numpy(ll.k_cache.rows()[cells].astype(np.float32)).view(len(cells), ll.n_head_kv, ll.head_dim_k)
        own = rt.writer.compute(il, h, pos)[0].view(window, ll.n_head_kv, ll.head_dim_k) if with_window else None
        s = attention_scores(q, k, ll.head_dim_k, own, heads=heads, rows=rows)
        if candidates[0] == 0:
            s[0] = 0.0  # the first row is an attention sink, whatever the question
        out[il] = s
    return out


def combined(per_layer: dict[int, torch.Tensor], layers, pool: int) -> torch.Tensor:
    """Each layer's pooled scores scaled to a maximum of 1, averaged over `layers`."""
    total = sum(pooled(per_layer[il], pool) / pooled(per_layer[il], pool).max().clamp_min(1e-12) for il in layers)
    return total / len(layers)


def score_rows(engine, rt, tokens: list[int], candidates: list[int], streams: dict[int, np.ndarray],
               params: GuidedParams, contrast: tuple[list[int], dict[int, np.ndarray]] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per candidate row: the score that ranks it (minus the contrast question's, where given) and the
    question's own score, each combined over the scoring layers."""
    per_layer = layer_scores(engine, rt, tokens, candidates, streams)
    own = combined(per_layer, list(streams), params.pool)
    if contrast is None:
        return own, own
    other_tokens, other_streams = contrast
    return contrasted(per_layer, layer_scores(engine, rt, other_tokens, candidates, other_streams),
                      list(streams), params.pool), own


def contrasted(per_layer: dict[int, torch.Tensor], per_layer_other: dict[int, torch.Tensor], layers,
               pool: int) -> torch.Tensor:
    """The question's combined scores minus the contrast question's, each scaled to a maximum of 1."""
    return combined(per_layer, layers, pool) - combined(per_layer_other, layers, pool)


def contrast_prompt(engine, tokens: list[int], window: int) -> list[int]:
    """The prompt as it would be if its last turn ended with CONTRAST_QUESTION instead of the user's
    question: the rows before the window, then the question and the chat template's assistant header
    (the probe reads only the last `window` rows)."""
    mark = "\u2063"  # an invisible separator no template writes
    turn_end = engine.format_chat([ChatMessage("user", mark)]).split(mark)[-1]
    ask = engine.tokenize(f"\n\nQuestion: {CONTRAST_QUESTION}{turn_end}", add_special=False, parse_special=True)
    return tokens[: len(tokens) - window] + ask[-window:]


def select(candidates: list[int], scores: torch.Tensor, bulk_end: int, params: GuidedParams, max_run: int,
           ends: list[int] | None = None, also: torch.Tensor | None = None,
           starts: list[int] | None = None) -> list[Run]:
    """Peaks first: the best row not yet covered (from row `head` on), with `back` rows before it and the
    rows after it to the end of its sentence (`ends`, at most `forward`), until `peaks` places or
    `budget` rows; then `also_peaks` more places by the scores `also`, where given."""
    chosen: set[int] = set()
    for ranking, places in ((scores, params.peaks), (also, params.also_peaks)):
        if ranking is None or places <= 0:
            continue
        taken = 0
        for i in torch.argsort(ranking, descending=True).tolist():
            if taken >= places or len(chosen) >= params.budget:
                break
            p = candidates[i]
            if p in chosen or p < params.head:
                continue
            last = min(bulk_end - 1, p + params.forward)
            if ends is not None:
                last = min(last, max(ends[p], p))
            first = max(0, p - params.back)
            if starts is not None:  # back to its sentence's start, at most `back` and at least `back_min` rows
                first = max(first, min(starts[p], p - params.back_min))
            chosen.update(range(max(0, first), last + 1))
            taken += 1
    return runs_of(chosen, max_run)


def guided_runs(engine, rt, plan, tokens: list[int], bulk_end: int, phases,
                params: GuidedParams = DEFAULT) -> list[Run]:
    """The runs this question wants exact. Rows made exact before (a follow-up) are scored too and
    count towards the budget, so a question asked again selects what is already exact."""
    if not engine.slot.record.approximated(0, bulk_end):
        return []
    # the re-decode's rows take cells beside the bulk's until they replace them (up to a ubatch a call): a
    # nearly full context takes fewer, keeping room for the last place whole
    free = engine.n_ctx - bulk_end
    if free < min(params.budget, engine.ubatch_rows):
        params = replace(params, budget=max(0, free - min(params.back + params.forward + 1, free // 2)))
    candidates = engine.slot.record.with_cells(0, bulk_end)
    layers = params.scoring_layers(engine.info.n_layer, plan.split, rt.windows.windowed)
    with phases("probe"):
        streams = probe_streams(engine, tokens, layers, params.window)
        contrast = None
        if params.contrast:
            other = contrast_prompt(engine, tokens, params.window)
            contrast = (other, probe_streams(engine, other, layers, params.window))
    with phases("score"):
        scores, own = score_rows(engine, rt, tokens, candidates, streams, params, contrast)
        pieces = [engine.token_text(t) for t in tokens[:bulk_end]]
        ends = sentence_ends(pieces, params.newlines)
        starts = sentence_starts(pieces, params.newlines) if params.back_min < params.back else None
    runs = select(candidates, scores, bulk_end, params, engine.ubatch_rows, ends, also=own, starts=starts)
    return runs + runs_of(sorted(p for p in params.also_rows if p < bulk_end), engine.ubatch_rows)
