"""The ridge map's relative error per real-QA document (docs/measurements/real-questions.md#where-guided-loses-real-answers-variants-the-maps-error-maps-fitted-on-technical-text).

For one prompt of each document: the exact streams entering the split and every later layer, the maps'
prediction from the first, and ||predicted - exact|| / ||exact|| per row, averaged over the late layers;
printed for the bulk rows and for the last T = 64 (the exact tail, where a request could see it)."""
import sys

import numpy as np
import torch

from lab.experiments.document_streams import engine_and_maps, first_prompt_streams

SPLIT = int(sys.argv[1]) if len(sys.argv) > 1 else 18
TAIL = 64
engine, maps = engine_and_maps(SPLIT)
print("document, tokens, bulk error, tail error")
for document, tokens, streams in first_prompt_streams(engine, SPLIT):
    predicted = maps.predict_all(torch.from_numpy(streams[SPLIT]))
    errors = np.stack([((predicted[il] - torch.from_numpy(streams[il])).norm(dim=1)
                        / torch.from_numpy(streams[il]).norm(dim=1)).numpy() for il in maps.layers]).mean(0)
    n = len(tokens)
    print(document, n, round(float(errors[1:n - TAIL].mean()), 3), round(float(errors[n - TAIL:].mean()), 3), flush=True)
