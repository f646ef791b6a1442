"""Maps for one split fitted on long prompts: the shipped calibration cuts every text to 1,024 tokens, so
a global layer's stream is never seen reading a long context. Here the prose corpus is joined into long
sequences (in the app's document prompt, and as plain prose in another order), every 4th row captured
through the exact model, and the ridge fitted as the app fits it (fitting.fit_layers, λ chosen on
held-out blocks of rows). Writes OUT.pt for late_inputs_exact.py's `--maps`.

    .venv/bin/python -m lab.experiments.long_context_maps GEMMA.gguf OUT.pt [--split 5] [--tokens 12000]
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch

from backend.corpus import corpus_texts
from backend.documents import document_messages
from backend.engine import Engine, EngineConfig
from backend.protocol import CompletionRequest
from backend.ridgefill.fitting import fit_layers, heldout_documents
from backend.ridgefill.stream_capture import capture_streams

STRIDE = 4
BLOCK_ROWS = 256  # captured rows per "document" of the held-out choice: held out in whole blocks


def long_sequences(engine, tokens_each: int) -> list[list[int]]:
    """The corpus joined in its order as a document prompt with a question, and in a shuffled order as
    plain prose; each cut to `tokens_each`."""
    texts = [t.strip() for t in corpus_texts() if t.strip()]
    as_document = engine.prompt_tokens(CompletionRequest(
        messages=document_messages("\n\n".join(texts), "What does the document say about the harbour?")))
    shuffled = texts[:]
    random.Random(5).shuffle(shuffled)
    return [as_document[:tokens_each], engine.tokenize("\n\n".join(shuffled))[:tokens_each]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--split", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=12000, help="tokens per long sequence")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(EngineConfig(model_path=args.model, n_ctx=args.tokens + 64, n_threads=args.threads))
    layers = list(range(args.split, engine.info.n_layer))
    parts, t0 = {il: [] for il in layers}, time.time()
    counter = 0
    for seq in long_sequences(engine, args.tokens):
        got = capture_streams(engine, [seq], layers, stride=STRIDE, dtype=np.float32, counter0=counter)
        counter += len(seq)
        for il in layers:
            parts[il].append(got[il])
        print(f"captured {len(seq)} tokens, {time.time() - t0:.0f} s", flush=True)
    streams = {il: torch.from_numpy(np.concatenate(v)) for il, v in parts.items()}
    n = len(streams[args.split])
    blocks = torch.arange(n) // BLOCK_ROWS
    late = {il: y for il, y in streams.items() if il > args.split}
    fits = fit_layers(streams[args.split], late, heldout_documents(blocks))
    torch.save({"split": args.split, "weights": {il: f.weight for il, f in fits.items()},
                "biases": {il: f.bias for il, f in fits.items()},
                "cos": {il: f.heldout_cosine for il, f in fits.items()}, "rows": n}, args.out)
    print(args.out, n, "rows", {il: round(f.heldout_cosine, 4) for il, f in fits.items()}, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
