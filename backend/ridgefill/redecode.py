"""Bulk rows made exact again through every layer (quality and guided choose which).

After the speed pass has written every bulk row's late-layer K/V from predictions, the selected rows are
decoded again by llama.cpp at their own positions, each run on its own sequence, which shares sequence
0's cells before the run (so each row attends to the same history the tail will see). Then sequence 0
drops its approximate cells at those positions and takes the new ones. llama.cpp refuses
non-consecutive positions within one sequence, hence a sequence per run (on a unified cache, where
sharing a cell moves no data: see Engine).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import Cancelled
from . import run_mask
from .cache_layout import LayoutRefused
from .lower_skip import LowerLayersSkipped, SplitStreams

MERGE_GAP = 3  # selected rows this close are decoded as one run, the rows between them included


@dataclass(frozen=True)
class Run:
    start: int  # first position
    end: int  # one past the last

    def __len__(self) -> int:
        return self.end - self.start


def runs_of(positions, max_run: int) -> list[Run]:
    """Positions merged, in order, into runs where they lie within MERGE_GAP rows of each other (the
    rows between included), each at most `max_run` rows."""
    runs: list[Run] = []
    for p in sorted(set(positions)):
        if runs and p - runs[-1].end < MERGE_GAP and p + 1 - runs[-1].start <= max_run:
            runs[-1] = Run(runs[-1].start, p + 1)
        else:
            runs.append(Run(p, p + 1))
    return runs


def batches(runs: list[Run], max_rows: int, max_runs: int) -> list[list[Run]]:
    """Runs grouped, in order, into llama_decode calls of at most `max_rows` rows and `max_runs` runs;
    a run right after the one before it starts a new call (its sequence must end just before it)."""
    out: list[list[Run]] = []
    rows = 0
    for run in runs:
        touching = bool(out) and out[-1][-1].end == run.start
        if not out or touching or rows + len(run) > max_rows or len(out[-1]) >= max_runs:
            out.append([])
            rows = 0
        out[-1].append(run)
        rows += len(run)
    return out


def _batch_hook(engine, cells, group: list[Run], one_batch: bool, streams: SplitStreams | None,
                positions: list[int]):
    """The eval hook of one re-decode batch, made here and nowhere else: `cells` (a CellTap) records
    where its rows land; with `one_batch`, a mask edit shows each run the new rows of the runs before it
    (run_mask); where `streams` has every row's split stream and the cache knows every row's old cell,
    the layers below the split are skipped (lower_skip). Returns (the hook, the mask or None, the skip or
    None, the rows' old cells or None)."""
    cells.reset()
    mask = run_mask.EarlierRunsVisible(cells, [len(r) for r in group]) if one_batch else None
    inner = cells if mask is None else mask
    stream = None if streams is None else streams.rows(positions)
    old_cells = None if stream is None else engine.slot.record.cells(positions)
    if old_cells is None or min(old_cells) < 0:
        return inner, mask, None, None
    skip = LowerLayersSkipped(inner, streams.split, stream)
    return skip, mask, skip, old_cells


def redecode_exact(engine, tokens: list[int], runs: list[Run], cancel: Callable[[], bool] | None = None,
                   cells=None, chained: bool = False, streams: SplitStreams | None = None,
                   abort: Callable[[], bool] | None = None, clean: bool = False) -> int:
    """Replace sequence 0's cells at each run's positions with ones llama.cpp computes through every
    layer; returns the rows made exact. Each run of a batch goes on its own sequence, which shares
    sequence 0's cells before the run, so the whole batch is one llama_decode (a batch of a few rows
    costs more per row: docs/measurements/guided-design.md#exact-rows-in-one-decode). `chained`: each run sees the
    runs before it already exact (guided) - in one batch whose attention mask run_mask edits where
    `cells` (a CellTap) allows, else one run per llama_decode. Sequences 1.. are empty afterwards,
    whatever happens. `cells`: records where the new rows landed, so they can be scored again.
    `streams`: the bulk pass's streams entering the split; a batch whose rows all have one skips the
    layers below the split (lower_skip). `abort`: asked inside each llama_decode (Engine.decode_rows);
    a batch it stops raises Preempted and leaves sequence 0 as it was before that batch. `clean`: every row
    before the runs is clean (refinement in prompt order), so the runs are clean too."""
    single_cache = cells is not None and run_mask.supported(cells)
    one_batch = chained and single_cache
    # every cache gives a row the same cell (no sliding-window cache, or Engine.pin_seq keeps them so)
    same_cells = single_cache or (cells is not None and getattr(engine, "pin_seq", None) is not None)
    done = 0
    groups = batches(runs, engine.ubatch_rows, 1 if chained and not one_batch else len(engine.spares))
    try:
        for i, group in enumerate(groups):
            if cancel is not None and cancel():
                raise Cancelled(f"prefill cancelled after {i} of {len(groups)} batches of exact rows")
            toks, pos, seqs = _on_own_sequences(engine, tokens, group, one_batch)
            if cells is None:
                engine.spares.decode_rows(toks, pos, seqs, abort=abort)
                new_cells = None
            else:
                new_cells = _decode_recorded(engine, toks, pos, seqs, group, cells, one_batch,
                                             streams if same_cells else None, abort)
            done += _hand_to_sequence_0(engine, group, new_cells, clean)
    finally:
        engine.spares.clear()
    return done


def _on_own_sequences(engine, tokens: list[int], group: list[Run], one_batch: bool):
    """(tokens, positions, sequence ids) of a batch whose run s goes on sequence s, which first shares
    sequence 0's cells before the run (less the earlier runs of the batch when `one_batch`)."""
    toks, pos, seqs = [], [], []
    for s, run in enumerate(group, start=1):
        engine.spares.copy(0, s, 0, run.start)  # its history: everything before the run
        if one_batch:
            for before in group[: s - 1]:  # it sees their new rows instead (run_mask)
                engine.spares.remove(s, before.start, before.end)
        toks += tokens[run.start : run.end]
        pos += range(run.start, run.end)
        seqs += [s] * len(run)
    return toks, pos, seqs


def _decode_recorded(engine, toks, pos, seqs, group: list[Run], cells, one_batch: bool,
                     streams: SplitStreams | None, abort: Callable[[], bool] | None = None) -> list[int]:
    """Decode the batch with `cells` recording where its rows land (with the earlier-runs mask when
    `one_batch`, and the layers below the split skipped where `streams` allows); the new cells."""
    hook, mask, skip, old_cells = _batch_hook(engine, cells, group, one_batch, streams, pos)
    try:
        with engine.hooked(hook):
            engine.spares.decode_rows(toks, pos, seqs, abort=abort)
    finally:
        if skip is not None:
            skip.restore()
    if mask is not None and len(group) > 1 and (mask.error or not mask.edited):
        raise LayoutRefused(f"exact rows: {mask.error or 'the attention mask was not seen'}")
    if skip is not None and (skip.error or not skip.written):
        raise LayoutRefused(f"exact rows: {skip.error or 'the split stream was not written'}")
    new_cells = cells.first_layer_cells()
    if skip is not None:
        engine.slot.write_late(streams.lower_kv(old_cells, new_cells))
    return new_cells


def _hand_to_sequence_0(engine, group: list[Run], new_cells, clean: bool) -> int:
    """Sequence 0 drops its approximate cells at each run's positions and takes the exact ones; the
    rows made exact."""
    at = 0  # where each run's rows sit in the batch
    for s, run in enumerate(group, start=1):
        engine.slot.take_rows(s, run.start, run.end, None if new_cells is None else new_cells[at : at + len(run)],
                              clean=clean)
        at += len(run)
    return at
