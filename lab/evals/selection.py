"""Selection hit rate: does guided mode's choice of rows to make exact hold the asked needle?

No generation: for each needle item, the bulk pass (layers below the split, the graph cut there, no
late writes: scoring reads only exact lower-layer keys), then one probe per window size capturing the
stream entering every layer below the split, then, for each configuration (window, scoring layers,
head pooling, row pooling, contrast question or not, forward window, budget), the rows guided mode would
select. A hit: every
row from the asked needle's key to the end of its value is selected (all asked needles, multivalue).
Results go to a JSONL file, one line per item, so a long run resumes.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from backend.errors import Cancelled
from backend.recall.needles import NeedleItem
from backend.ridgefill.guided import (NEWLINE_RULES, GuidedParams, combined, contrast_prompt, contrasted, layer_scores,
                                      probe_streams, select, sentence_ends)
from backend.ridgefill.injection import bulk_pass, one_torch_thread
from backend.ridgefill.plan import RidgeFillPlan
from backend.ridgefill.runtime import runtime


@dataclass(frozen=True)
class Grid:
    windows: tuple[int, ...] = (16, 32)
    layer_sets: tuple[tuple[int, ...], ...] = ((3,), (5,), (7,), (9,), (5, 7), (7, 9), (6, 7, 8))
    # (heads, softmax over): the design is max over heads, each query's softmax over the bulk and the
    # window's own earlier rows; the other two are ablations, run at window 32 and layer 7 only.
    variants: tuple[tuple[str, str], ...] = (("max", "bulk+window"), ("sum", "bulk+window"), ("max", "bulk"))
    pools: tuple[int, ...] = (1, 5)
    # a fixed 20 rows, or to the sentence's end (at most 40) with line breaks read by one of
    # guided.NEWLINE_RULES (the needle haystacks have none: the licence texts are hard-wrapped)
    forwards: tuple[str, ...] = ("20", "line", "wrap", "paragraph")
    peaks: tuple[int, ...] = (4, 6, 8)
    # scores as they are, or minus a question about nothing in particular's (guided.contrast_prompt);
    # the contrast is run with the design's heads and softmax only
    contrasts: tuple[bool, ...] = (False, True)
    also_peaks: tuple[int, ...] = (0, 4)  # with the contrast: then places by the question's own scores
    back: int = 4
    budget: int = 256


def config_key(w, layers, head, norm, pool, fwd, peaks, contrast: bool = False) -> str:
    return f"W{w}|L{'-'.join(map(str, layers))}|{head}|{norm}|p{pool}|f{fwd}|k{peaks}" + ("|contrast" if contrast else "")


def needed_rows(engine, tokens: list[int], item: NeedleItem) -> list[int]:
    """Rows from each asked needle's key to the end of its value."""
    rows = []
    for nd in item.asked:
        key_at = next((p for p in range(nd.start, nd.end) if nd.key in engine.detokenize(tokens[nd.start : p + 1])),
                      nd.start)
        while key_at > nd.start and nd.key in engine.detokenize(tokens[key_at : nd.end]):
            key_at -= 1  # back to the first token that holds part of the key
        if nd.key not in engine.detokenize(tokens[key_at : nd.end]):
            key_at += 1
        rows += range(key_at, nd.end)
    return rows


def item_hits(engine, item: NeedleItem, split: int, tail: int, grid: Grid) -> dict:
    tokens = engine.prompt_tokens(item.request())
    bulk_end = len(tokens) - tail
    need = needed_rows(engine, tokens, item)
    if max(need) >= bulk_end:
        return {"id": item.id, "bulk": False}
    engine.make_room(len(tokens), 1)
    setup = runtime(engine)
    engine.slot.truncate(0)  # the bulk pass writes from position 0 of an empty context
    # the bulk pass stops above the highest scoring layer: what is below is all scoring reads
    cut = min(split, max(il for ls in grid.layer_sets for il in ls) + 1)
    plan = RidgeFillPlan("guided", cut, tail, tag="hit-rate", write_late=False)
    with engine.scratch(), one_torch_thread():
        bulk_pass(engine, plan, tokens, 0, bulk_end, None)
        candidates = list(range(bulk_end))
        pieces = [engine.token_text(t) for t in tokens[:bulk_end]]
        ends = {rule: sentence_ends(pieces, rule) for rule in grid.forwards if rule in NEWLINE_RULES}
        layers = sorted({il for ls in grid.layer_sets for il in ls if il < split})
        hits, ranks = {}, {}
        for w in grid.windows:
            streams = probe_streams(engine, tokens, layers, w)
            per_layer_other = None
            if any(grid.contrasts):
                other = contrast_prompt(engine, tokens, w)
                per_layer_other = layer_scores(engine, setup, other, candidates, probe_streams(engine, other, layers, w))
            for head, norm in grid.variants:
                ablation = (head, norm) != grid.variants[0]
                if ablation and w != 32:
                    continue
                per_layer = layer_scores(engine, setup, tokens, candidates, streams, heads=head,
                                         with_window=norm == "bulk+window")
                for ls, pool, contrast in itertools.product(grid.layer_sets, grid.pools, grid.contrasts):
                    if max(ls) >= split or (ablation and (ls != (7,) or contrast)):
                        continue
                    score = contrasted(per_layer, per_layer_other, ls, pool) if contrast else combined(per_layer, ls, pool)
                    order = torch.argsort(score, descending=True)
                    rank_of = torch.empty_like(order)
                    rank_of[order] = torch.arange(len(order))
                    ranks[config_key(w, ls, head, norm, pool, "-", 0, contrast)] = int(rank_of[need].min())
                    own = combined(per_layer, ls, pool)
                    for fwd, peaks, also in itertools.product(grid.forwards, grid.peaks, grid.also_peaks):
                        if also and not contrast:
                            continue
                        sentence = fwd in NEWLINE_RULES
                        p = GuidedParams(window=w, pool=pool, back=grid.back, forward=40 if sentence else int(fwd),
                                         peaks=peaks, budget=grid.budget, also_peaks=also)
                        runs = select(candidates, score, bulk_end, p, engine.ubatch_rows,
                                      ends[fwd] if sentence else None, also=own)
                        chosen = {q for r in runs for q in range(r.start, r.end)}
                        key = config_key(w, ls, head, norm, pool, fwd, peaks, contrast) + (f"+own{also}" if also else "")
                        hits[key] = {"hit": all(q in chosen for q in need), "rows": len(chosen)}
    return {"id": item.id, "bulk": True, "length": item.length, "depth": item.depth, "variant": item.variant,
            "haystack": item.haystack, "needle_pos": item.needle_pos, "bulk_end": bulk_end, "hits": hits,
            "best_rank": ranks}


def run_hit_rate(engine, items: list[NeedleItem], split: int, tail: int, out: str | Path, grid: Grid = Grid(),
                 on_item: Callable[[int, int, dict], None] | None = None,
                 cancel: Callable[[], bool] | None = None) -> list[dict]:
    """One JSONL line per item in `out`; items already there are not run again."""
    out = Path(out)
    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["id"]] = rec
    results = []
    for i, item in enumerate(items):
        if cancel is not None and cancel():
            raise Cancelled("hit-rate run cancelled")
        rec = done.get(item.id)
        if rec is None:
            rec = item_hits(engine, item, split, tail, grid)
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        results.append(rec)
        if on_item is not None:
            on_item(i + 1, len(items), rec)
    return results


def summarise(results: list[dict]) -> list[tuple[str, int, int, dict]]:
    """(config, hits, n, hits per haystack, mean rows selected) over bulk items, best first."""
    bulk = [r for r in results if r.get("bulk")]
    if not bulk:
        return []
    keys = bulk[0]["hits"].keys()
    rows = []
    for k in keys:
        per: dict[str, list[int]] = {}
        for r in bulk:
            per.setdefault(r["haystack"], []).append(int(r["hits"][k]["hit"]))
        hits = sum(sum(v) for v in per.values())
        mean_rows = sum(r["hits"][k]["rows"] for r in bulk) / len(bulk)
        rows.append((k, hits, len(bulk), {h: f"{sum(v)}/{len(v)}" for h, v in per.items()}, mean_rows))
    return sorted(rows, key=lambda r: (-r[1], r[4], r[0]))
