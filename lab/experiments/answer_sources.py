"""Sources ranked by the answer's attention as well as the question's, on the real questions (`off`)
(docs/measurements/sources.md#sources-the-answers-own-attention-tried): `answer_sources.py dump OUT.pkl`, resumable,
then `answer_sources.py replay OUT.pkl` (the real best_places on each ranking: top and any of 3).

The answer's attention: its generated rows (up to 32) as the probe window at the scoring layer, the
same softmax, head maximum and pooling as the question's, without a contrast."""
import json
import os
import pickle
import sys
from types import SimpleNamespace

import torch

from app.commands.common import open_engine
from backend.protocol import AUTO_CTX
from backend.recall.document_questions import load_questions, question_items
from backend.recall.run import SharedDocuments
from backend.ridgefill.defaults import default_split
from backend.ridgefill.guided import DEFAULT as G, combined, contrast_prompt, contrasted, layer_scores
from backend.ridgefill.injection import one_torch_thread
from backend.ridgefill.runtime import runtime
from backend.sources import best_places, place_documents, probe
from lab.evals.sources import holds, item_document

DEV = ("apt", "gnupg", "libxcrypt", "man-db")  # the half the joined passages were chosen on
RANKINGS = {"question": lambda q, a: q, "answer": lambda q, a: a, "q+0.5a": lambda q, a: q + 0.5 * a,
            "q+a": lambda q, a: q + a, "q+2a": lambda q, a: q + 2 * a, "q*a": lambda q, a: q.clamp_min(0) * a}


def scores(engine, tokens, answer, cands, layers):
    rt = runtime(engine)
    with one_torch_thread():
        own = layer_scores(engine, rt, tokens, cands, probe(engine, tokens, layers, G.window))
        other = contrast_prompt(engine, tokens, G.window)
        q = contrasted(own, layer_scores(engine, rt, other, cands, probe(engine, other, layers, G.window)),
                       layers, G.pool)
        full = tokens + answer
        a = combined(layer_scores(engine, rt, full, cands, probe(engine, full, layers, min(len(answer), G.window))),
                     layers, G.pool) if answer else torch.zeros_like(q)
    return q.numpy(), a.numpy()


def dump(engine, out):
    items = question_items(engine, "realqa")
    shared = SharedDocuments(engine, items, None)
    done = pickle.load(open(out, "rb")) if os.path.exists(out) else {}
    split = min(default_split(engine.info), engine.info.n_layer - 1)
    layers = G.scoring_layers(engine.info.n_layer, max(split, 2), runtime(engine).windows.windowed)
    for item in items:
        if item.id in done:
            continue
        doc, spans = item_document(item)
        request = item.request("off", None, None)
        request.documents = [doc]
        result = shared.complete(item, request)
        tokens = engine.prompt_tokens(request)
        held = 0  # the answer's rows in the cache (the last sampled token is never decoded)
        while held < len(result.tokens) and engine.slot.holds(tokens + list(result.tokens[:held + 1])):
            held += 1
        kept = set(engine.slot.record.with_cells(0, len(tokens) - G.window))
        cands = [p for d in place_documents(engine, tokens, [doc]) for p in d.rows if p in kept]
        q, a = scores(engine, tokens, list(result.tokens[:held]), cands, layers)
        done[item.id] = {"cands": cands, "q": q, "a": a, "spans": spans}
        pickle.dump(done, open(out + ".tmp", "wb"))
        os.replace(out + ".tmp", out)
        print(item.id, held, flush=True)


def replay(engine, path):
    dumped = pickle.load(open(path, "rb"))
    items = {i.id: i for i in question_items(engine, "realqa")}
    questions = load_questions("realqa")
    right = {r["id"] for r in map(json.loads, open("docs/data/realqa-smollm2-s18.jsonl"))
             if r["mode"] == "off" and r["correct"]}
    table = {name: {} for name in RANKINGS}
    for iid, d in dumped.items():
        doc, _ = item_document(items[iid])
        request = items[iid].request("off", None, None)
        placed = place_documents(engine, engine.prompt_tokens(request), [doc])
        half = "dev" if any(questions[int(iid[7:])]["document"].startswith(f"realqa-{p}-") for p in DEV) else "held"
        for name, rank in RANKINGS.items():
            found = [s.as_dict() for s in best_places(placed, d["cands"], rank(torch.tensor(d["q"]), torch.tensor(d["a"])), 3)]
            hit = (bool(found) and holds(found[0], d["spans"]), any(holds(s, d["spans"]) for s in found))
            for group in (half, "all") + (("exact right",) if iid in right else ()):
                n, top, anyh = table[name].get(group, (0, 0, 0))
                table[name][group] = (n + 1, top + hit[0], anyh + hit[1])
    for name, groups in table.items():
        print(f"{name:9s}", "  ".join(f"{g} n={n} top={t} any={a}" for g, (n, t, a) in sorted(groups.items())))


if __name__ == "__main__":
    engine = open_engine(SimpleNamespace(model=None, ctx=AUTO_CTX, threads=2))
    {"dump": dump, "replay": replay}[sys.argv[1]](engine, sys.argv[2])
