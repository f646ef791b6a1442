"""The maps' relative error on a document's rows before and after a correction fitted on 576 of its own
rows (its last 64 and 16 random runs of 32), for the first prompt of 8 real-QA documents
(docs/measurements/real-questions.md#where-guided-loses-real-answers-variants-the-maps-error-maps-fitted-on-technical-text).
Prints, per document and per λ scale (λ = scale · trace(XᵀX) / d), the error without and with it."""
import numpy as np
import torch

from lab.experiments.document_streams import engine_and_maps, first_prompt_streams

SPLIT = 18
engine, maps = engine_and_maps(SPLIT)
g = torch.Generator().manual_seed(0)
for document, tokens, streams in first_prompt_streams(engine, SPLIT, 8):
    x, n = torch.from_numpy(streams[SPLIT]), len(tokens)
    starts = torch.randint(64, n - 96, (16,), generator=g).tolist()
    fitted = torch.unique(torch.cat([torch.arange(n - 64, n)] + [torch.arange(s, s + 32) for s in starts]))
    rest = torch.ones(n, dtype=torch.bool)
    rest[fitted], rest[0], rest[n - 64:] = False, False, False  # row 0 (the sink) is left to the maps
    xf = x[fitted]
    mean = xf.mean(0)
    xc = xf - mean
    line = []
    for scale in (0.1, 1.0, 10.0):
        gram = xc.T @ xc + scale * xc.pow(2).sum() / xc.shape[1] * torch.eye(xc.shape[1])
        before, after = [], []
        for il in maps.layers:
            y = torch.from_numpy(streams[il])
            resid = y[fitted] - maps.predict(il, xf)
            delta = torch.linalg.solve(gram, xc.T @ (resid - resid.mean(0)))
            p0 = maps.predict(il, x[rest])
            p1 = p0 + (x[rest] - mean) @ delta + resid.mean(0)
            t = y[rest]
            before.append(float(((p0 - t).norm(dim=1) / t.norm(dim=1)).mean()))
            after.append(float(((p1 - t).norm(dim=1) / t.norm(dim=1)).mean()))
        line.append(f"λ×{scale:g}: {np.mean(before):.3f} -> {np.mean(after):.3f}")
    print(document, n, "; ".join(line), flush=True)
