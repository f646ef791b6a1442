"""A candidate for the per-document guard (issue "right on every document"): can a cheap probe on the
RidgeFill cache tell beforehand which documents RidgeFill moves exact's answers on?

The probe asks the model to copy: after the document, "\\n\\nQuote: " and the first PREFIX tokens of a span
from the bulk, then the span's next SCORED tokens are scored (teacher-forced). Copying a far span reads
the approximated rows' late K/V, as a look-up question does, at no decode of an answer. Per document:
the mean copy NLL on the exact cache, on the RidgeFill cache (speed, split 11) of each map set, and their
difference. `python -m lab.experiments.copy_probe OUT.jsonl HALF NAME=MAPS_FOLDER [NAME=MAPS_FOLDER ...]`
(HALF: judge, choose or all)
(resumed: a document and setting already in OUT is skipped). docs/measurements/calibration.md reads it
beside the fidelity runs.
"""
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from app.commands.common import open_engine
from backend.reply_score import score_after_head
from backend.ridgefill.maps import load_maps
from backend.ridgefill.plan import ridgefill_prefill
from backend.tuning.question_files import long_set

SPLIT, TAIL = 11, 512
PROBES, PREFIX, SCORED = 8, 16, 32
SPREAD = (0.05, 0.85)  # probe spans from this share of the bulk to this one


def probe_spans(tokens: list[int]) -> list[list[int]]:
    bulk = len(tokens) - TAIL
    starts = np.linspace(SPREAD[0] * bulk, SPREAD[1] * bulk, PROBES).astype(int)
    return [tokens[s : s + PREFIX + SCORED] for s in starts]


def copy_nll(engine, head: list[int], spans: list[list[int]]) -> list[float]:
    """Mean NLL of each span's scored tokens after the cue and its prefix, sequence 0 holding `head`."""
    cue = engine.tokenize("\n\nQuote: ", add_special=False)
    out = []
    for span in spans:
        engine.slot.truncate(len(head))
        lead = cue + span[:PREFIX]
        engine.slot.decode(lead, len(head), logits_last=True)
        out.append(float(-score_after_head(engine, span[PREFIX:], len(head) + len(lead)).mean()))
    engine.slot.truncate(len(head))
    return out


def main(out: str, half: str, *map_args: str) -> None:
    engine = open_engine(SimpleNamespace(model=None, ctx=32768, threads=2))
    settings = {"off": None, **{a.split("=", 1)[0]: load_maps(Path(a.split("=", 1)[1]), engine.info.path) for a in map_args}}
    done = {(r["document"], r["setting"]) for r in map(json.loads, Path(out).read_text().splitlines())} \
        if Path(out).exists() else set()
    for doc in long_set(None if half == "all" else half):
        head = engine.tokenize(doc.text)[: engine.n_ctx - 256]
        spans = probe_spans(head)
        for name, maps in settings.items():
            if (doc.name, name) in done:
                continue
            t0 = time.perf_counter()
            engine.slot.truncate(0)
            if maps is None:
                engine.slot.prefill(head, reuse_prefix=False)
            else:
                ridgefill_prefill(engine, head, "speed", SPLIT, TAIL, maps=maps)
            nll = copy_nll(engine, head, spans)
            line = {"document": doc.name, "half": doc.half, "setting": name, "tokens": len(head),
                    "copy_nll": float(np.mean(nll)), "per_probe": nll, "seconds": round(time.perf_counter() - t0, 1)}
            with open(out, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
            print(doc.name, name, f"{line['copy_nll']:.3f}", f"{line['seconds']} s", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
