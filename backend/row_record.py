"""The row record: what each row of sequence 0 in the KV cache holds, the one record of it (the K/V
themselves are in llama.cpp's cache).

The engine's slot keeps it and is its only writer, together with the K/V (backend/slot.py); everyone
else reads it as `engine.slot.record`.

Each row is a token and how its K/V were written: exactly (through every layer), or approximated by
RidgeFill under a tag that names the split and maps that wrote it. Prefix reuse reads this record,
like a llama.cpp server slot reads its cache tokens:
- an exact request reuses only the clean prefix: rows computed exactly while every row before them
  was exact too (a row decoded exactly after an approximated one saw approximated history, and stays
  unclean even when that earlier row is made exact later);
- a RidgeFill request may also reuse rows approximated under its own tag (the same split and maps
  would write the same K/V again).
Rows decoded again through every layer (quality, guided) are marked exact, so a follow-up question
knows which rows it still has to make exact. The record also keeps, for rows a RidgeFill bulk pass
computed, the stream entering its split (exact: the layers below the split run exactly for every row),
so rows made exact later, by this request or a follow-up, need not run those layers again.
"""
from __future__ import annotations

import numpy as np


class RowRecord:
    def __init__(self) -> None:
        self._tokens: list[int] = []
        self._how: list[str | None] = []  # per row: None = exact, else the approximation's tag
        # per row: its cell in the cache of the lower layers, where known (-1 else). RidgeFill records
        # it for the rows it writes or makes exact; guided scoring reads their exact lower-layer keys there.
        self._cell: list[int] = []
        self._n_clean = 0  # the leading rows exactly as the exact model would have written them
        # per position: the stream entering split `_stream_split` (rows `_has_stream` only), float32: at
        # 8,000 rows of SmolLM2 18 MB
        self._stream_split: int | None = None
        self._streams = np.zeros((0, 0), dtype=np.float32)
        self._has_stream = np.zeros(0, dtype=bool)

    # ---- reading ---------------------------------------------------------------------------------
    @property
    def tokens(self) -> list[int]:
        """The cached tokens, in position order (a copy)."""
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def all_exact(self) -> bool:
        return self._n_clean == len(self._tokens)

    def with_cells(self, start: int = 0, end: int | None = None) -> list[int]:
        """Positions in [start, end) whose cell is known: rows RidgeFill wrote or made exact."""
        end = len(self._cell) if end is None else min(end, len(self._cell))
        return [p for p in range(max(0, start), end) if self._cell[p] >= 0]

    def approximated(self, start: int = 0, end: int | None = None) -> list[int]:
        """Positions in [start, end) whose rows are approximated."""
        end = len(self._how) if end is None else min(end, len(self._how))
        return [p for p in range(max(0, start), end) if self._how[p] is not None]

    def cells(self, positions: list[int]) -> list[int]:
        return [self._cell[p] for p in positions]

    def split_streams(self, split: int, positions: list[int]) -> np.ndarray | None:
        """The streams entering `split` of `positions`, in that order, or None unless every one is kept."""
        at = np.asarray(positions, dtype=np.int64)
        if self._stream_split != split or len(at) == 0 or at.min() < 0 or at.max() >= len(self._has_stream) \
                or not self._has_stream[at].all():
            return None
        return self._streams[at]

    @property
    def stream_split(self) -> int | None:
        """The split whose entering streams are kept (None: none are)."""
        return self._stream_split

    def streams_kept(self, start: int, end: int) -> np.ndarray:
        """Per row in [start, end): whether its stream entering `stream_split` is kept."""
        out = np.zeros(max(0, end - start), dtype=bool)
        have = self._has_stream[start:end]
        out[: len(have)] = have
        return out

    def reusable_prefix(self, tokens: list[int], accept_tag: str | None = None) -> int:
        """How many leading `tokens` are cached and may be reused: rows that match, each exact or
        approximated under `accept_tag`. At least one token is always left to decode, so the request
        gets fresh logits."""
        n = 0
        for cached, how, tok in zip(self._tokens, self._how, tokens):
            if cached != tok or (how is not None and how != accept_tag):
                break
            n += 1
        if accept_tag is None:
            n = min(n, self._n_clean)
        return max(0, min(n, len(tokens) - 1))

    @property
    def n_clean(self) -> int:
        """The leading rows exactly as the exact model would have written them."""
        return self._n_clean

    def saved(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The record as JSON-able facts and arrays (for the prompt cache on disk), cells left out: after
        a state load they are where llama.cpp put them."""
        runs: list[list] = []  # [start, end, tag] of each run of rows approximated the same way
        for p, how in enumerate(self._how):
            if how is None:
                continue
            if runs and runs[-1][1] == p and runs[-1][2] == how:
                runs[-1][1] = p + 1
            else:
                runs.append([p, p + 1, how])
        facts = {"tokens": list(self._tokens), "approximated": runs, "n_clean": self._n_clean,
                 "stream_split": self._stream_split}
        kept = np.flatnonzero(self._has_stream[: len(self._tokens)]).astype(np.int64)
        arrays = {"stream_rows": kept, "streams": np.ascontiguousarray(self._streams[kept])} if len(kept) else {}
        return facts, arrays

    @classmethod
    def from_saved(cls, facts: dict, arrays: dict[str, np.ndarray], cells: np.ndarray) -> "RowRecord":
        """A record made from `saved()`'s output, each row in its cell `cells[row]`; ValueError when the
        parts disagree with each other."""
        rows = cls()
        tokens = [int(t) for t in facts["tokens"]]
        n = len(tokens)
        if len(cells) != n or not 0 <= int(facts["n_clean"]) <= n:
            raise ValueError(f"the record has {n} rows, {len(cells)} cells and {facts['n_clean']} clean rows")
        rows._tokens, rows._how, rows._cell = tokens, [None] * n, [int(c) for c in cells]
        for start, end, tag in facts["approximated"]:
            if not (0 <= start < end <= n and isinstance(tag, str)) or start < int(facts["n_clean"]):
                raise ValueError(f"approximated rows {start}..{end} do not fit the record")
            rows._how[start:end] = [tag] * (end - start)
        rows._n_clean = int(facts["n_clean"])
        kept = arrays.get("stream_rows")
        if kept is not None and len(kept):
            h = arrays["streams"]
            if facts.get("stream_split") is None or h.ndim != 2 or len(h) != len(kept) or kept.min() < 0 \
                    or kept.max() >= n:
                raise ValueError("the kept split streams do not fit the record")
            rows._stream_split = int(facts["stream_split"])
            rows._streams = np.zeros((n, h.shape[1]), dtype=np.float32)
            rows._streams[kept] = h
            rows._has_stream = np.zeros(n, dtype=bool)
            rows._has_stream[kept] = True
        return rows

    # ---- writing (only backend/slot.py calls these) ---------------------------------------------------
    def append(self, tokens: list[int], tag: str | None = None) -> None:
        if tag is None and self._n_clean == len(self._tokens):
            self._n_clean += len(tokens)
        self._tokens.extend(tokens)
        self._how.extend([tag] * len(tokens))
        self._cell.extend([-1] * len(tokens))

    def record_cells(self, start: int, cells) -> None:
        """The cells that rows start.. were written to (as the decode's cell-index input said)."""
        if cells is not None:
            self._cell[start : start + len(cells)] = [int(c) for c in cells]

    def keep_split_streams(self, split: int, start: int, h: np.ndarray) -> None:
        """Rows start.. were computed below `split` by a bulk pass; `h` (rows, n_embd) their streams
        entering it. Streams kept for another split are dropped."""
        end = start + len(h)
        if self._stream_split != split or self._streams.shape[1:] != h.shape[1:]:
            self._stream_split = split
            self._streams = np.zeros((0, h.shape[1]), dtype=np.float32)
            self._has_stream = np.zeros(0, dtype=bool)
        if end > len(self._streams):
            grown = np.zeros((end, h.shape[1]), dtype=np.float32)
            grown[: len(self._streams)] = self._streams
            self._streams = grown
            self._has_stream = np.concatenate([self._has_stream, np.zeros(len(grown) - len(self._has_stream), bool)])
        self._streams[start:end] = h
        self._has_stream[start:end] = True

    def mark_exact(self, start: int, end: int, cells=None) -> None:
        """Rows decoded again through every layer, into `cells` where known."""
        for p in range(max(0, start), min(end, len(self._how))):
            self._how[p] = None
            self._cell[p] = -1 if cells is None else int(cells[p - start])
        if start <= self._n_clean and end == len(self._tokens):  # nothing after them saw the old rows
            self._n_clean = max(self._n_clean, end)

    def mark_clean(self, start: int, end: int) -> None:
        """Rows [start, end), exact, were decoded again after every row before them was clean (the idle
        refinement, in prompt order): the clean prefix reaches `end`."""
        if any(how is not None for how in self._how[start:end]):
            raise ValueError(f"rows {start}..{end} are not all exact")
        if start <= self._n_clean:
            self._n_clean = max(self._n_clean, min(end, len(self._tokens)))

    def truncate(self, n_keep: int) -> None:
        del self._tokens[max(0, n_keep):]
        del self._how[max(0, n_keep):]
        del self._cell[max(0, n_keep):]
        self._has_stream[max(0, n_keep):] = False  # what follows will be other rows
        self._n_clean = min(self._n_clean, len(self._tokens))
