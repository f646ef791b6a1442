"""Maps for one split fitted on the shipped prose corpus plus the texts of a folder, for guided_variants.py
(docs/measurements/real-questions.md#where-guided-loses-real-answers-variants-the-maps-error-maps-fitted-on-technical-text): `refit_maps.py OUT.pt FOLDER [SPLIT]`.

The app's own calibration (calibration_sequences: each text and its chat copy, cut to 2,560 tokens, every
4th row, every 5th document held out to choose λ) on the exact model; writes OUT.pt (prose and folder)
and OUT-prose.pt (the prose alone, the same rows the shipped maps were fitted on: the control)."""
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from app.commands.common import open_engine
from backend.corpus import corpus_texts
from backend.ridgefill.calibration_corpus import calibration_sequences
from backend.ridgefill.fitting import fit_layers, heldout_documents
from backend.ridgefill.stream_capture import capture_streams

STRIDE, SEQ_TOKENS = 4, 2560


def capture(engine, texts: list[str], split: int):
    layers = list(range(split, engine.info.n_layer))
    streams, docs, counter, t0 = {il: [] for il in layers}, [], 0, time.time()
    seqs = calibration_sequences(engine, texts, min(engine.n_ctx - 8, SEQ_TOKENS))
    for k, seq in enumerate(seqs):
        got = capture_streams(engine, [seq.tokens], layers, stride=STRIDE, dtype=np.float32, counter0=counter)
        counter += len(seq.tokens)
        for il in layers:
            streams[il].append(got[il])
        docs += [seq.doc] * len(got[split])
        print(f"{k + 1}/{len(seqs)} {seq.kind} {len(seq.tokens)} tokens, {time.time() - t0:.0f} s", flush=True)
    return {il: torch.from_numpy(np.concatenate(v)) for il, v in streams.items()}, torch.tensor(docs)


def fit(streams, docs, keep, split: int, path: str) -> None:
    late = {il: y[keep] for il, y in streams.items() if il > split}
    fits = fit_layers(streams[split][keep], late, heldout_documents(docs[keep]))
    torch.save({"weights": {il: f.weight for il, f in fits.items()}, "biases": {il: f.bias for il, f in fits.items()},
                "cos": {il: f.heldout_cosine for il, f in fits.items()}, "rows": int(keep.sum())}, path)
    print(path, {il: round(f.heldout_cosine, 4) for il, f in fits.items()}, flush=True)


def main(out: str, folder: str, split: int = 18) -> None:
    engine = open_engine(SimpleNamespace(model=None, ctx=4096, threads=2))
    prose = corpus_texts()
    extra = [p.read_text(encoding="utf-8") for p in sorted(Path(folder).glob("*.txt"))]
    streams, docs = capture(engine, prose + extra, split)
    fit(streams, docs, torch.ones(len(docs), dtype=torch.bool), split, out)
    fit(streams, docs, docs < len(prose), split, out.removesuffix(".pt") + "-prose.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 18)
