"""The bulk's layers below the split over 4,096 tokens of the prose corpus, against a plain exact prefill
of the same tokens, three times each, on the embedded SmolLM2 at its split 18: a phase of guided timed
alone, to compare two commits.

    cd CHECKOUT && .venv/bin/python PATH/TO/lower_pass_time.py LABEL

It imports the checkout it runs in (the bulk tap lived in backend/ridgefill/injection.py before
backend/ridgefill/bulk_tap.py), so the same file times an older commit. Recorded in
docs/measurements/speed.md#one-prefill-and-the-slots-own-context-speed-before-and-after.
"""
from __future__ import annotations

import sys
import time

sys.path.insert(0, ".")

from backend.engine import Engine, EngineConfig  # noqa: E402
from backend.embedded_models import smollm2_path  # noqa: E402
from backend.recall.haystacks import corpus_haystack  # noqa: E402
from backend.ridgefill.runtime import warm_up  # noqa: E402

from backend.ridgefill.bulk_tap import BulkTap  # noqa: E402

SPLIT, N = 18, 4096


def timed(engine, tokens: list[int], make_tap) -> float:
    """Seconds to decode `tokens` onto an empty sequence 0, a ubatch at a time, each with a fresh tap
    from `make_tap` (None: an exact decode)."""
    engine.slot.truncate(0)
    t0 = time.perf_counter()
    for p in range(0, len(tokens), engine.ubatch_rows):
        tap = make_tap()
        if tap is not None:
            tap.reset()
        kwargs = {"approx_tag": "timing", "hook": tap} if tap is not None else {}
        engine.slot.decode(tokens[p : p + engine.ubatch_rows], p, **kwargs)
    return time.perf_counter() - t0


def main(label: str) -> None:
    engine = Engine(EngineConfig(str(smollm2_path()), n_ctx=8192, n_threads=2))
    rt = warm_up(engine, SPLIT)
    tokens = engine.tokenize(corpus_haystack().text)[:N]
    times = []
    for _ in range(3):
        times.append(timed(engine, tokens, lambda: BulkTap(SPLIT, rt.layout)))
        times.append(timed(engine, tokens, lambda: None))
    print(label, "lower / exact:", " ".join(f"{t:.2f}" for t in times))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
