"""What map_error.py and map_correction.py share: the embedded model's engine, the maps for a split, and
for the first question of each real-QA document its prompt's exact streams entering the split and every
later layer."""
import os
from types import SimpleNamespace

import numpy as np

from app.commands.common import open_engine
from backend.protocol import AUTO_CTX, CompletionRequest
from backend.recall.document_questions import question_items
from backend.ridgefill.runtime import runtime
from backend.ridgefill.stream_capture import capture_streams


def engine_and_maps(split: int):
    engine = open_engine(SimpleNamespace(model=None, ctx=AUTO_CTX, threads=int(os.environ.get("THREADS", 2))))
    return engine, runtime(engine).maps(split)


def first_prompt_streams(engine, split: int, documents: int | None = None):
    """(document, tokens, streams by layer) for the first question of each document, in the set's order;
    the first `documents` of them when given."""
    firsts = {}
    for item in question_items(engine, "realqa"):
        firsts.setdefault(item.document, item)
    for document, item in list(firsts.items())[:documents]:
        tokens = engine.prompt_tokens(CompletionRequest(messages=item.messages))
        yield document, tokens, capture_streams(engine, [tokens], list(range(split, engine.info.n_layer)),
                                                dtype=np.float32)
