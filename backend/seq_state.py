"""What the bytes of llama.cpp's sequence state (llama_state_seq_get_data) hold, read without loading them.

The layout, as this llama.cpp build writes one sequence of a unified cache (checked whole: a state that
does not parse to its last byte is refused): 8 bytes, the build's own mark (kept and compared, never
interpreted); then per KV cache (two for a model with sliding-window layers):
  u32       streams (1 for one sequence)
  u32       cell count; then per cell, in cell order: i32 position, u32 sequence count, i32 sequence ids
  u32 u32   V transposed (0 with flash attention), layer count
  per layer: i32 K type, u64 K row bytes, the K rows of every cell in cell order
  per layer: i32 V type, u64 V row bytes, the V rows (not transposed)
Loaded into an empty cache, llama.cpp puts each cache's cells back in that order from cell 0 (`cells_after_load`:
the cells of the cache that holds every row, the global one on a sliding-window model).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MARK_BYTES = 8


class StateFormatError(ValueError):
    """Bytes that are not a sequence state as this build writes it."""


@dataclass(frozen=True)
class CacheSection:
    """One KV cache's part of the state (a model with sliding-window layers has two caches)."""
    positions: np.ndarray  # per saved cell, in cell order
    n_layer: int
    k0_offset: int  # where its first layer's K rows start
    k0_row_bytes: int


@dataclass(frozen=True)
class StateLayout:
    mark: bytes  # the build's leading bytes
    sections: list[CacheSection]

    @property
    def n_rows(self) -> int:
        return len(self.sections[0].positions)

    def full_section(self) -> int | None:
        """The index of the first section holding every position 0..n-1 once (the global cache: llama.cpp
        writes it before the sliding-window one, which holds the last window only); None if none does."""
        whole = np.arange(self.n_rows)
        for i, sec in enumerate(self.sections):
            if len(sec.positions) == self.n_rows and np.array_equal(np.sort(sec.positions), whole):
                return i
        return None

    def k0_rows(self, blob: bytes, section: int = 0) -> np.ndarray:
        """A section's first layer's K rows of every saved cell, (cells, row bytes) uint8, in cell order."""
        sec = self.sections[section]
        n = len(sec.positions)
        return np.frombuffer(blob, dtype=np.uint8, count=n * sec.k0_row_bytes,
                             offset=sec.k0_offset).reshape(n, sec.k0_row_bytes)

    def cells_after_load(self) -> np.ndarray | None:
        """Per position 0..n-1: the cell it lands in when loaded into an empty cache, in the cache of
        `full_section` (each cache is filled from cell 0 in its section's order); None when no section
        holds every position."""
        i = self.full_section()
        if i is None:
            return None
        positions = self.sections[i].positions
        cells = np.empty(len(positions), dtype=np.int64)
        cells[positions] = np.arange(len(positions))
        return cells


CELL_HEADER_BYTES = 8  # each cell's position and sequence count ("<iI"), before its sequence ids


class _Reader:
    def __init__(self, blob: bytes):
        self.blob, self.at = blob, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.at + size > len(self.blob):
            raise StateFormatError(f"the state ends at byte {len(self.blob):,}, inside its header")
        out = struct.unpack_from(fmt, self.blob, self.at)
        self.at += size
        return out

    def skip(self, n: int) -> None:
        if self.at + n > len(self.blob):
            raise StateFormatError(f"the state ends at byte {len(self.blob):,}, {self.at + n - len(self.blob):,} "
                                   "bytes short of its rows")
        self.at += n


def read_layout(blob: bytes) -> StateLayout:
    """The layout of `blob`; StateFormatError unless it is one sequence's caches, the first holding
    positions 0..n-1 once each (a sliding-window cache: some of them), with every layer's K and V rows,
    and nothing after them."""
    r = _Reader(blob)
    mark = bytes(r.take(f"<{MARK_BYTES}s")[0])
    sections = [_section(r)]
    while r.at < len(blob):
        sections.append(_section(r))
    n = len(sections[0].positions)
    if sorted(sections[0].positions.tolist()) != list(range(n)):
        raise StateFormatError(f"the state's {n:,} cells do not hold positions 0..{n - 1} once each")
    for sec in sections[1:]:
        if len(set(sec.positions.tolist())) != len(sec.positions) or (len(sec.positions) and (
                sec.positions.min() < 0 or sec.positions.max() >= n)):
            raise StateFormatError("a sliding-window cache of the state holds positions the first one does not")
    return StateLayout(mark, sections)


def _section(r: _Reader) -> CacheSection:
    n_stream, n_cells = r.take("<II")
    if n_stream != 1:
        raise StateFormatError(f"the state holds {n_stream} streams, not one sequence's")
    if n_cells * CELL_HEADER_BYTES > len(r.blob) - r.at:  # checked before an array is sized by it
        raise StateFormatError(f"the state says {n_cells:,} cells, more than its {len(r.blob):,} bytes hold")
    positions = np.empty(n_cells, dtype=np.int64)
    for i in range(n_cells):
        positions[i], n_seq = r.take("<iI")
        r.skip(4 * n_seq)
    v_trans, n_layer = r.take("<II")
    if v_trans:
        raise StateFormatError("the state's V rows are transposed (a cache without flash attention)")
    k0_offset = k0_row = 0
    for kind in ("K", "V"):
        for il in range(n_layer):
            _type, row_bytes = r.take("<iQ")
            if kind == "K" and il == 0:
                k0_offset, k0_row = r.at, int(row_bytes)
            r.skip(int(row_bytes) * n_cells)
    return CacheSection(positions, int(n_layer), k0_offset, k0_row)
