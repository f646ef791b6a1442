"""Guided variants on the real questions exact or guided answered at the default
(docs/measurements/real-questions.md#where-guided-loses-real-answers-variants-the-maps-error-maps-fitted-on-technical-text):
`guided_variants.py OUT.jsonl VARIANT,... [ID,...]`.

Variants: `default`; `sN` (split N); `wide` (32 places in 1,024 rows); `fwd` (80 rows forward);
`qwin` (the probe's window cut to the rows after the document); `zero` (every late layer's K/V of an
approximated row written as zeros); `leadN` (rows 0..N-1 exact too); `bandA-B` (rows A..B-1 exact
too); `maps:FILE.pt` (the default with maps fitted by refit_maps.py); `kv:FILE.pt` (the late K/V from
maps fitted to K and V by kv_maps.py); `scale:FILE.pt` (the late K and V scaled to the exact rows'
norms: kv_maps.py scales); `adapt` (the default maps plus a correction fitted on the document's own
exact rows). Exact itself, for its noise floor: `exact` (off, as recorded), `exact-kvq8` (off with a
q8_0 K/V cache), `exact-ubN` (off with llama.cpp's micro-batch of N rows, not 512). One line per
(item, variant); a rerun resumes. `guided_variants.py summary OUT.jsonl` prints, per variant, the right
answers, those lost and gained against exact, and the losses per document; with exact-* variants, also
the answers exact itself loses under them and guided's losses among those and apart."""
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

from app.commands.common import model_path, open_engine
from backend.engine import Engine, EngineConfig
from backend.protocol import AUTO_CTX
from backend.recall.document_questions import question_items
from backend.recall.run import SharedDocuments
from backend.recall.scoring import score
from backend.ridgefill.maps import RidgeMaps
from backend.ridgefill.plan import plan_prefill, plan_ridgefill

RESULTS = "docs/data/realqa-smollm2-s18.jsonl"


class ZeroMaps:
    """Maps that predict a zero stream: RMS-normed and projected, every late K and V is zero."""

    def __init__(self, maps):
        self.split, self.layers, self.folder, self.warnings = maps.split, maps.layers, f"{maps.folder}-zero", []

    def predict_all(self, h):
        zero = torch.zeros(h.shape, dtype=torch.float32)
        return {il: zero for il in self.layers}


class AdaptedMaps:
    """The maps plus a ridge correction fitted on 576 of the document's own exact rows (its last 64 and 16
    random runs of 32, about as many as guided makes exact), pulled toward zero by λ = trace(XᵀX) / d."""

    def __init__(self, maps, engine, item):
        from backend.protocol import CompletionRequest
        from backend.ridgefill.stream_capture import capture_streams
        import numpy as np

        tokens = engine.prompt_tokens(CompletionRequest(messages=item.messages))
        n, split = len(tokens), maps.split
        streams = capture_streams(engine, [tokens], [split, *maps.layers], dtype=np.float32)
        g = torch.Generator().manual_seed(len(tokens))
        starts = torch.randint(64, n - 96, (16,), generator=g).tolist()
        rows = torch.unique(torch.cat([torch.arange(n - 64, n)] + [torch.arange(s, s + 32) for s in starts]))
        x = torch.from_numpy(streams[split])[rows]
        self.mean = x.mean(0)
        xc = x - self.mean
        gram = xc.T @ xc + (xc.pow(2).sum() / xc.shape[1]) * torch.eye(xc.shape[1])
        base = maps.predict_all(x)
        self.delta, self.offset = {}, {}
        for il in maps.layers:
            resid = torch.from_numpy(streams[il])[rows] - base[il]
            self.offset[il] = resid.mean(0)
            self.delta[il] = torch.linalg.solve(gram, xc.T @ (resid - self.offset[il]))
        self.largest = float(x.norm(dim=1).max())  # rows far outside (row 0, the attention sink) keep the maps' own
        self.maps, self.split, self.layers, self.warnings = maps, maps.split, maps.layers, []
        self.folder = f"{maps.folder}-adapted-{item.document}"

    def predict_all(self, h):
        out = self.maps.predict_all(h)
        hc = (h.float() - self.mean) * (h.float().norm(dim=1, keepdim=True) <= 2 * self.largest)
        return {il: out[il] + hc @ self.delta[il] + self.offset[il] for il in self.layers}


_adapted = {}


def fitted_maps(path: str, like) -> RidgeMaps:
    fit = torch.load(path)
    return RidgeMaps(like.split, like.n_layer, list(like.layers), Path(path), [], {}, fit["weights"], fit["biases"])


def plan_for(engine, name, item, request):
    base = plan_prefill(engine, request, item.length)
    g = base.guided
    if name == "default":
        return base
    if name == "zero":
        return replace(base, maps=ZeroMaps(base.maps), tag=base.tag + "-zero")
    if name == "adapt":
        if item.document not in _adapted:
            _adapted[item.document] = AdaptedMaps(base.maps, engine, item)
        maps = _adapted[item.document]
        return replace(base, maps=maps, tag=f"{base.tag}-{maps.folder}")
    if name.startswith("maps:"):
        return replace(base, maps=fitted_maps(name[5:], base.maps), tag=f"{base.tag}-{name}")
    if name.startswith("scale:"):
        from kv_maps import scaled_kv_of

        return replace(base, kv=scaled_kv_of(name[6:]), tag=f"{base.tag}-{name}")
    if name.startswith("kv:"):
        from kv_maps import KVMaps, fitted_kv_of

        return replace(base, maps=KVMaps(base.maps, name[3:]), kv=fitted_kv_of(name[3:]), tag=f"{base.tag}-{name}")
    if name == "qwin":  # the probe's rows cut to those after the document (the question and the template)
        from lab.evals.sources import item_document
        from backend.sources import place_documents

        tokens = engine.prompt_tokens(request)
        end = place_documents(engine, tokens, [item_document(item)[0]])[-1].rows.stop
        return replace(base, guided=replace(g, window=min(g.window, len(tokens) - end)))
    if name == "wide":
        return replace(base, guided=replace(g, peaks=32, budget=1024))
    if name == "fwd":
        return replace(base, guided=replace(g, forward=80))
    if name.startswith("lead"):
        return replace(base, guided=replace(g, also_rows=tuple(range(int(name[4:])))))
    if name.startswith("band"):
        a, b = map(int, name[4:].split("-"))
        return replace(base, guided=replace(g, also_rows=tuple(range(a, b))))
    if name.startswith("s"):
        return plan_ridgefill(engine, item.length, "guided", int(name[1:]), base.tail)
    raise SystemExit(f"unknown variant {name}")


def engine_for(name):
    """The default engine, or for `exact-kvq8` / `exact-ubN` one whose arithmetic differs a little."""
    args = SimpleNamespace(model=None, ctx=AUTO_CTX, threads=int(os.environ.get("THREADS", 2)))  # 1 beside another run
    if name == "exact-kvq8":
        return Engine(EngineConfig(model_path(args), n_ctx=AUTO_CTX, n_threads=args.threads, kv_type="q8_0"))
    if name.startswith("exact-ub"):
        return Engine(EngineConfig(model_path(args), n_ctx=AUTO_CTX, n_threads=2, n_ubatch=int(name[8:])))
    return open_engine(args)


def main(out, names, only=None):
    answered = {r["id"] for r in map(json.loads, open(RESULTS)) if r["correct"]}
    try:
        done = {(r["id"], r["variant"]) for r in map(json.loads, open(out))}
    except FileNotFoundError:
        done = set()
    with open(out, "a") as f:
        for name in names:
            engine = engine_for(name)
            items = [i for i in question_items(engine, "realqa") if i.id in answered and (not only or i.id in only)]
            shared = SharedDocuments(engine, items, None)
            for item in items:
                if (item.id, name) in done:
                    continue
                if name.startswith("exact"):
                    request = item.request("off", None, None)
                    result = shared.complete(item, request, None)
                else:
                    request = item.request("guided", None, None)
                    result = shared.complete(item, request, None, plan_for(engine, name, item, request))
                correct, _ = score(result.text, item.answers, "phrase")
                f.write(json.dumps({"id": item.id, "variant": name, "correct": correct, "reply": result.text[:200]}) + "\n")
                f.flush()
                print(name, item.id, correct, flush=True)
            engine.close()


def summary(out):
    from collections import Counter

    from backend.recall.document_questions import load_questions

    documents = [q["document"] for q in load_questions("realqa")]
    exact = {r["id"]: r["correct"] for r in map(json.loads, open(RESULTS)) if r["mode"] == "off"}
    by_variant = {}
    for r in map(json.loads, open(out)):
        by_variant.setdefault(r["variant"], {})[r["id"]] = r["correct"]
    for name, got in by_variant.items():
        lost = [i for i in got if exact[i] and not got[i]]
        gained = [i for i in got if got[i] and not exact[i]]
        per_doc = Counter(documents[int(i.rsplit("/", 1)[1])] for i in lost)
        print(f"{name}: n {len(got)}, right {sum(got.values())}, lost {len(lost)}, gained {len(gained)}, "
              f"lost per document {dict(per_doc.most_common())}")
    noisy = [got for name, got in by_variant.items() if name.startswith("exact")]
    if noisy:  # exact's answers that exact itself loses under a change of arithmetic, against guided's losses
        guided = {r["id"]: r["correct"] for r in map(json.loads, open(RESULTS)) if r["mode"] == "guided"}
        fragile = {i for got in noisy for i in got if exact[i] and not got[i]}
        lost = {i for i in noisy[0] if exact[i] and not guided[i]}
        steady = Counter(documents[int(i.rsplit("/", 1)[1])] for i in lost - fragile)
        print(f"exact's answers lost by an exact-* variant: {sorted(fragile)}; guided's losses {len(lost)}, "
              f"{len(lost & fragile)} of them among those; the rest per document {dict(steady.most_common())}")


if __name__ == "__main__" and sys.argv[1] == "summary":
    summary(sys.argv[2])
elif __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None)
