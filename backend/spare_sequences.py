"""The sequences beside sequence 0 (the slot's, backend/slot.py): rows decoded again and probes run there,
sharing sequence 0's cells for their history (one cache: no data moves) and letting go of them after.
Made with each context (Engine._make_context), like the slot."""
from __future__ import annotations

from .llama_context import CancelCheck, LlamaContext


class SpareSequences:
    def __init__(self, context: LlamaContext, ids: range):
        self.context = context
        self.ids = ids  # 1.., less the sequence that pins the sliding windows (Engine.pin_seq)

    def __len__(self) -> int:
        return len(self.ids)

    def decode_rows(self, tokens: list[int], positions, seqs: list[int], *, logits_last: bool = False,
                    logits_all: bool = False, abort: CancelCheck | None = None) -> None:
        """Rows onto the spare sequences (LlamaContext.decode_rows)."""
        self.context.decode_rows(tokens, positions, seqs, logits_last=logits_last, logits_all=logits_all,
                                 abort=abort)

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Let spare sequence `dst` share `src`'s cells at positions [p0, p1)."""
        self.context.seq_copy(src, dst, p0, p1)

    def remove(self, seq: int, p0: int, p1: int) -> None:
        """Take spare sequence `seq` off its cells at positions [p0, p1) (-1, -1: all)."""
        self.context.seq_remove(seq, p0, p1)

    def clear(self) -> None:
        """Every spare sequence lets go of every cell."""
        for s in self.ids:
            self.remove(s, -1, -1)
