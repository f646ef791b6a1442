"""Which of the probe's rows, heads and aggregations rank the real questions' sources best (`off`;
docs/measurements/sources.md#sources-the-questions-rows-alone): `query_rows.py dump DIR` keeps, a file per question
(resumable), the scoring layer's attention logits of every probe row and head over the document's rows,
for the question and the contrast question; `query_rows.py replay DIR` ranks them each way and runs the
real best_places on each ranking (top and any of 3), on the half of the documents the choices are made
on and on the held-out half.

"kept" is the ranking the app had before (the last 32 rows, softmax with the window's own keys, sum over
rows, max over heads, pool 5, minus the contrast question's); replay gives the recorded 140 / 171 back
with it. The app's ranking now is "rows after the document, rows max"."""
import json
import os
import pickle
import sys
from types import SimpleNamespace

import numpy as np
import torch

from app.commands.common import open_engine
from backend.protocol import AUTO_CTX
from backend.recall.document_questions import load_questions, question_items
from backend.recall.run import SharedDocuments
from backend.ridgefill.defaults import default_split
from backend.ridgefill.guided import DEFAULT as G, contrast_prompt, pooled
from backend.ridgefill.injection import one_torch_thread
from backend.ridgefill.runtime import runtime
from backend.sources import best_places, place_documents, probe
from lab.evals.sources import holds, item_document

DEV = ("apt", "gnupg", "libxcrypt", "man-db")  # the half choices are made on (as for the joined passages)


def window_logits(engine, rt, tokens, cands, layer):
    """(n_head, window, n_cands + window) attention logits of the last G.window rows at `layer`, the
    window's own keys last (future ones -inf), and the window's token ids."""
    streams = probe(engine, tokens, [layer], G.window)
    w = G.window
    pos = torch.arange(len(tokens) - w, len(tokens))
    ll = rt.layout.layers[layer]
    h = torch.from_numpy(np.asarray(streams[layer], dtype=np.float32))
    q = rt.query_path([layer]).queries(layer, h, pos)
    cells = np.asarray(engine.slot.record.cells(cands))
    k = torch.from_numpy(ll.k_cache.rows()[cells].astype(np.float32)).view(len(cells), ll.n_head_kv, ll.head_dim_k)
    own = rt.writer.compute(layer, h, pos)[0].view(w, ll.n_head_kv, ll.head_dim_k)
    keys = torch.cat([k, own]).repeat_interleave(q.shape[1] // ll.n_head_kv, dim=1)
    logits = torch.einsum("whd,nhd->hwn", q, keys) / ll.head_dim_k**0.5
    future = torch.triu(torch.ones(w, w, dtype=torch.bool), diagonal=1)
    logits[:, :, len(cands):] = logits[:, :, len(cands):].masked_fill(future, float("-inf"))
    return logits.to(torch.float16).numpy(), list(tokens[-w:])


def dump(engine, out):
    items = question_items(engine, "realqa")
    shared = SharedDocuments(engine, items, None)
    os.makedirs(out, exist_ok=True)
    rt = runtime(engine)
    split = min(default_split(engine.info), engine.info.n_layer - 1)
    layer, = G.scoring_layers(engine.info.n_layer, max(split, 2), rt.windows.windowed)
    for item in items:
        path = os.path.join(out, item.id.replace("/", "-") + ".pkl")
        if os.path.exists(path):
            continue
        doc, spans = item_document(item)
        request = item.request("off", None, None)
        request.documents = [doc]
        request.max_tokens = 1
        shared.complete(item, request)
        tokens = engine.prompt_tokens(request)
        kept = set(engine.slot.record.with_cells(0, len(tokens) - G.window))
        cands = [p for d in place_documents(engine, tokens, [doc]) for p in d.rows if p in kept]
        with one_torch_thread():
            q, qt = window_logits(engine, rt, tokens, cands, layer)
            other = contrast_prompt(engine, tokens, G.window)
            c, ct = window_logits(engine, rt, other, cands, layer)
        with open(path + ".tmp", "wb") as f:
            pickle.dump({"cands": cands, "q": q, "c": c, "q_tokens": qt, "c_tokens": ct, "spans": spans}, f)
        os.replace(path + ".tmp", path)
        print(item.id, len(cands), flush=True)


def row_scores(logits, n, rows=None, heads="max", per_row="sum", pool=G.pool):
    """The ranking of the n candidates from (h, w, n + w) logits: softmax per head and row over all keys,
    the rows in `rows` (all by default), summed (or max) over them, max (or sum) over heads, pooled,
    scaled to a maximum of 1."""
    # no sink row to zero (layer_scores): a real-QA document never starts at the prompt's row 0
    probs = torch.from_numpy(logits.astype(np.float32)).softmax(dim=-1)[:, :, :n]
    if rows is not None:
        probs = probs[:, rows]
    probs = probs.sum(dim=1) if per_row == "sum" else probs.amax(dim=1)
    s = probs.amax(dim=0) if heads == "max" else probs.sum(dim=0)
    s = pooled(s, pool)
    return s / s.max().clamp_min(1e-12)


def question_rows(engine, window_tokens):
    """The window rows from the last "Question:" on (the question and the template after it)."""
    text = [engine.token_bytes(t, special=True).decode("utf-8", "replace") for t in window_tokens]
    for i in range(len(text) - 1, -1, -1):
        if "Question" in text[i]:
            return list(range(i, len(text)))
    return list(range(len(text)))


def variants(engine, d, after_doc: int):
    """Each ranking tried, by name; `after_doc`: the prompt's rows after the document's last row."""
    n = len(d["cands"])
    qrows, crows = question_rows(engine, d["q_tokens"]), question_rows(engine, d["c_tokens"])
    tail = lambda k: list(range(G.window - k, G.window))  # noqa: E731
    q_all, c_all = row_scores(d["q"], n), row_scores(d["c"], n)
    out = {"kept": q_all - c_all, "no contrast": q_all}
    q_q, c_q = row_scores(d["q"], n, qrows), row_scores(d["c"], n, crows)
    out["question rows only"] = q_q - c_q
    out["question rows, contrast all"] = q_q - c_all
    after = tail(min(G.window, after_doc))
    out["rows after the document"] = row_scores(d["q"], n, after) - c_q
    out["rows after the document, rows max"] = row_scores(d["q"], n, after, per_row="max") - \
        row_scores(d["c"], n, crows, per_row="max")
    for k in (1, 4, 8, 16):
        out[f"last {k} rows"] = row_scores(d["q"], n, tail(k)) - row_scores(d["c"], n, tail(k))
    out["heads summed"] = row_scores(d["q"], n, heads="sum") - row_scores(d["c"], n, heads="sum")
    out["rows max"] = row_scores(d["q"], n, per_row="max") - row_scores(d["c"], n, per_row="max")
    out["question rows, rows max"] = row_scores(d["q"], n, qrows, per_row="max") - \
        row_scores(d["c"], n, crows, per_row="max")
    out["pool 1"] = row_scores(d["q"], n, pool=1) - row_scores(d["c"], n, pool=1)
    out["ratio"] = q_all / (c_all + 0.1)
    return out


def replay(engine, path):
    dumped = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".pkl"):
            with open(os.path.join(path, name), "rb") as f:
                dumped[name[:-4].replace("-", "/", 1)] = pickle.load(f)
    items = {i.id: i for i in question_items(engine, "realqa")}
    questions = load_questions("realqa")
    right = {r["id"] for r in map(json.loads, open("docs/data/realqa-smollm2-s18.jsonl"))
             if r["mode"] == "off" and r["correct"]}
    table = {}
    for iid, d in dumped.items():
        doc, _ = item_document(items[iid])
        tokens = engine.prompt_tokens(items[iid].request("off", None, None))
        placed = place_documents(engine, tokens, [doc])
        half = "dev" if any(questions[int(iid[7:])]["document"].startswith(f"realqa-{p}-") for p in DEV) else "held"
        for name, rank in variants(engine, d, len(tokens) - placed[-1].rows.stop).items():
            found = [s.as_dict() for s in best_places(placed, d["cands"], rank, 3)]
            hit = (bool(found) and holds(found[0], d["spans"]), any(holds(s, d["spans"]) for s in found))
            for group in (half, "all") + (("exact right",) if iid in right else ()):
                n, top, anyh = table.setdefault(name, {}).get(group, (0, 0, 0))
                table[name][group] = (n + 1, top + hit[0], anyh + hit[1])
    groups = ("dev", "held", "all", "exact right")
    print("| ranking (top / any of 3) | " + " | ".join(f"{g} (n={table['kept'].get(g, (0,))[0]})" for g in groups) + " |")
    for name, by in table.items():
        cells = (by.get(g, (0, 0, 0)) for g in groups)
        print(f"| {name} | " + " | ".join(f"{top} / {anyh}" for _, top, anyh in cells) + " |")


if __name__ == "__main__":
    engine = open_engine(SimpleNamespace(model=None, ctx=AUTO_CTX, threads=int(os.environ.get("THREADS", 2))))
    {"dump": dump, "replay": replay}[sys.argv[1]](engine, sys.argv[2])
