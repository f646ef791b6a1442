"""Where a windowed model's bulk pass spends its lower layers: sequence 0's full-size window cache
against a context of its own with a window-sized cache, and what a decode that only places rows costs.

    .venv/bin/python -m lab.experiments.window_cache_lower GEMMA.gguf 32000 [SPLIT]

Times, on the same prompt (the shipped prose corpus, repeated), each alone:
- `main`: the bulk's layers below SPLIT (default 5) in the engine's own context, as the prefill runs them
  (llama.cpp's full-size sliding-window cache, which guided keeps for its re-decodes);
- `window-sized`: the same decodes in a sibling context without the full-size window cache, where a
  windowed layer's attention spans the window instead of every cell;
- `placing`: a decode in the engine's context that stops at the first cache write (what giving the rows
  their cells there would cost if their lower layers ran elsewhere).
Recorded in docs/LONG_DOCUMENTS.md#the-lower-layers-in-a-window-sized-cache.
"""
from __future__ import annotations

import sys

from backend.engine import Engine, EngineConfig
from backend.recall.haystacks import corpus_haystack
from backend.ridgefill.bulk_tap import BulkTap
from backend.ridgefill.cache_layout import CellTap, discover
from backend.ridgefill.runtime import warm_up
from lab.experiments.lower_pass_time import timed


class _PlacingTap(CellTap):
    """Stops the graph at the first cache write: the rows get their cells, nothing else is computed."""

    def reset(self) -> None:
        super().reset()
        self.stop = False

    def wants(self, tensor: int) -> bool:
        self.stop = self.stop or self.read_cells(tensor)
        return self.stop

    def seen(self, tensor: int) -> bool:  # noqa: ARG002
        return False


def main(argv: list[str]) -> None:
    path, n = argv[0], int(argv[1])
    split = int(argv[2]) if len(argv) > 2 else 5
    with Engine(EngineConfig(path, n_ctx=n + 1024, n_threads=2)) as engine:
        rt = warm_up(engine, split)
        tokens = engine.tokenize(corpus_haystack().text)
        tokens = (tokens * (n // len(tokens) + 1))[:n]
        sibling = engine.sibling(n + 1024, swa_full=False)
        layout = discover(sibling)
        print(f"{n:,} tokens, split {split}, 2 threads")
        print(f"main          {timed(engine, tokens, lambda: BulkTap(split, rt.layout)):6.1f} s")
        print(f"window-sized  {timed(sibling, tokens, lambda: BulkTap(split, layout)):6.1f} s")
        print(f"placing       {timed(engine, tokens, lambda: _PlacingTap(rt.layout)):6.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
