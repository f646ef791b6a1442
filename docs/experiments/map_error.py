"""The ridge map's relative error per real-QA document (MEASUREMENTS#where-guided-loses-real-answers-variants-the-maps-error-maps-fitted-on-technical-text).

For one prompt of each document: the exact streams entering the split and every later layer, the maps'
prediction from the first, and ||predicted - exact|| / ||exact|| per row, averaged over the late layers;
printed for the bulk rows and for the last T = 64 (the exact tail, where a request could see it)."""
import sys
from types import SimpleNamespace

import numpy as np
import torch

from app.commands.common import open_engine
from backend.evals.document_questions import question_items
from backend.protocol import AUTO_CTX, CompletionRequest
from backend.ridgefill.runtime import runtime
from backend.ridgefill.stream_capture import capture_streams

SPLIT = int(sys.argv[1]) if len(sys.argv) > 1 else 18
TAIL = 64
engine = open_engine(SimpleNamespace(model=None, ctx=AUTO_CTX, threads=2))
maps = runtime(engine).maps(SPLIT)
first_items = {}
for item in question_items(engine, "realqa"):
    first_items.setdefault(item.document, item)
print("document, tokens, bulk error, tail error")
for document, item in first_items.items():
    tokens = engine.prompt_tokens(CompletionRequest(messages=item.messages))
    streams = capture_streams(engine, [tokens], list(range(SPLIT, engine.info.n_layer)), dtype=np.float32)
    predicted = maps.predict_all(torch.from_numpy(streams[SPLIT]))
    errors = np.stack([((predicted[il] - torch.from_numpy(streams[il])).norm(dim=1)
                        / torch.from_numpy(streams[il]).norm(dim=1)).numpy() for il in maps.layers]).mean(0)
    n = len(tokens)
    print(document, n, round(float(errors[1:n - TAIL].mean()), 3), round(float(errors[n - TAIL:].mean()), 3), flush=True)
