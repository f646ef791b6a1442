"""Stream capture: run tokens through the exact model and record the residual stream entering chosen
layers, read from the graph's `l_out-(il-1)` nodes through the eval callback (in memory; calibration.py
stores the calibration run's streams on disk)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import Cancelled, RidgeFillError
from . import ggml_graph
from .ggml_graph import Node

# The stream entering layer 0 is the input embedding (named "embd" or "inp_embd"); gemma3 scales it (√n_embd) in a later node,
# so the last of these seen in a ubatch wins.
INPUT_NODES = ("embd", "inp_embd", "inp_scaled")


def stream_node_names(il: int) -> tuple[str, ...]:
    """Graph node names whose output is the stream entering layer il."""
    return INPUT_NODES if il == 0 else (f"l_out-{il - 1}",)


class StreamTap:
    """Eval hook that copies the wanted streams of one ubatch; optionally stops the graph after the
    node `cut_after` has been read (then: yes to every ask, no to every 'go on', per docs/RIDGEFILL.md)."""

    def __init__(self, layers: list[int], cut_after: str | None = None):
        self.by_name: dict[str, int] = {}
        for il in layers:
            for name in stream_node_names(il):
                self.by_name[name] = il
        self.cut_after = cut_after
        self.reset()

    def reset(self) -> None:
        self.rows: dict[int, np.ndarray] = {}
        self.cut = False
        self.error: str | None = None

    def wants(self, tensor: int) -> bool:
        if self.cut:
            return True
        name = ggml_graph.view(tensor).name.decode("utf-8", "replace")
        return name in self.by_name or name == self.cut_after

    def seen(self, tensor: int) -> bool:
        if self.cut:
            return False
        node = Node(tensor)
        name = node.name
        try:
            il = self.by_name.get(name)
            if il is not None:
                self.rows[il] = node.rows_f32()
        except Exception as exc:  # never raise into C; the caller checks `error`
            self.error = f"{name}: {exc}"
        if name == self.cut_after:
            self.cut = True
            return False
        return True


def capture_streams(
    engine,
    token_seqs: list[list[int]],
    layers: list[int],
    stride: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    dtype=np.float16,
    counter0: int = 0,
) -> dict[int, np.ndarray]:
    """For each layer il in `layers`, the stream entering il (il=0: the input embedding) of the
    exact model, float16 (or `dtype`), shape (rows, n_embd), the same rows for every layer.

    Rows are kept where a running row counter over all sequences (in order) is a multiple of
    `stride`, so short sequences do not all contribute their first (BOS) row; the counter starts at
    `counter0` (a capture done sequence by sequence passes the rows before each one). Each sequence starts
    from an empty cache; the cache is left empty. Raises Cancelled between chunks."""
    problem = ggml_graph.layout_problem()
    if problem:
        raise RidgeFillError(problem)
    n_layer = engine.info.n_layer
    layers = sorted(set(int(il) for il in layers))
    if not layers or layers[0] < 0 or layers[-1] >= n_layer:
        raise ValueError(f"layers must lie in 0..{n_layer - 1}")
    if stride < 1:
        raise ValueError("stride must be >= 1")
    deepest = layers[-1]
    # Nothing past the deepest wanted stream is needed: stop the graph there (the cache is cleared
    # after, by scratch(), since later layers' cells then hold stale rows).
    cut = f"l_out-{deepest - 1}" if deepest >= 1 else None
    tap = StreamTap(layers, cut_after=cut)
    chunk_n = engine.ubatch_rows
    total = sum(len(s) for s in token_seqs)
    out: dict[int, list[np.ndarray]] = {il: [] for il in layers}
    done = 0
    counter = counter0
    with engine.scratch():
        for seq in token_seqs:
            engine.slot.truncate(0)  # each sequence starts from an empty cache
            for start in range(0, len(seq), chunk_n):
                if cancel is not None and cancel():
                    raise Cancelled(f"capture cancelled after {done} of {total} tokens")
                chunk = seq[start : start + chunk_n]
                tap.reset()
                with engine.hooked(tap):  # rows past the cut are not computed: never exact
                    engine.slot.decode(chunk, start, logits_last=False, approx_tag="capture")
                if tap.error:
                    raise RidgeFillError(f"capture failed reading {tap.error}")
                keep = np.nonzero((counter + np.arange(len(chunk))) % stride == 0)[0]
                counter += len(chunk)
                for il in layers:
                    rows = tap.rows.get(il)
                    if rows is None or rows.shape[0] != len(chunk):
                        got = None if rows is None else rows.shape
                        raise RidgeFillError(
                            f"capture: stream entering layer {il} not found or wrong shape ({got}) in the "
                            f"{engine.info.architecture} graph; this architecture is not supported for capture."
                        )
                    out[il].append(rows[keep].astype(dtype, copy=False))
                done += len(chunk)
                if on_progress is not None:
                    on_progress(done, total)
    n_embd = engine.info.n_embd
    return {il: (np.concatenate(v) if v else np.zeros((0, n_embd), dtype)) for il, v in out.items()}
