"""Maps fitted to what the late layers' attention reads, not to their input stream, for guided_variants.py
(`kv:FILE.pt`): `kv_maps.py OUT.pt [SPLIT]`.

The shipped maps predict each late layer's input stream from the stream entering the split; the layer's
own norm and projections then make K and V from that prediction, and a row's error in K and V is what
the question's and the answer's attention meet. Here one ridge map per late layer and per K and V goes
from the split stream, RMS-normed (a K or V row does not scale with its stream), straight to the layer's
K (before RoPE) and V, on the same calibration rows as the shipped maps (the prose corpus, each text and
its chat copy, 2,560 tokens, every 4th row; λ chosen on every 5th document held out).
`kv_maps.py compare OUT.pt` prints both ways' K and V cosines and norms on real-QA documents;
`kv_maps.py scales OUT.pt` writes per-layer factors for guided_variants.py `scale:OUT.pt`."""
import os
import sys
from types import SimpleNamespace

import torch

from app.commands.common import open_engine
from backend.corpus import corpus_texts
from backend.ridgefill.fitting import fit_layers, heldout_documents
from backend.ridgefill.kv_writer import apply_rope
from backend.ridgefill.runtime import runtime
from lab.experiments.refit_maps import capture


def normed(h: torch.Tensor) -> torch.Tensor:
    return h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6)


def fitted_kv(fit: dict, il: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `il`'s K (before RoPE) and V rows from the split stream h, through the maps fitted here."""
    x = normed(h)
    return (x @ fit["weights"][2 * il].T + fit["biases"][2 * il],
            x @ fit["weights"][2 * il + 1].T + fit["biases"][2 * il + 1])


def calibration_engine():
    return open_engine(SimpleNamespace(model=None, ctx=4096, threads=int(os.environ.get("THREADS", 2))))


def main(out: str, split: int = 18) -> None:
    engine = calibration_engine()
    rt = runtime(engine)
    streams, docs = capture(engine, corpus_texts(), split)
    targets = {}
    for il in range(split + 1, engine.info.n_layer):
        h = streams.pop(il)
        k, v = rt.writer.compute(il, h, torch.zeros(len(h), dtype=torch.long))  # RoPE at 0 leaves K as it is
        targets[2 * il], targets[2 * il + 1] = k, v
    fits = fit_layers(normed(streams[split]), targets, heldout_documents(docs))
    torch.save({"split": split, "weights": {t: f.weight for t, f in fits.items()},
                "biases": {t: f.bias for t, f in fits.items()}}, out)
    print(out, {f"{t // 2}{'kv'[t % 2]}": round(f.heldout_cosine, 4) for t, f in fits.items()}, flush=True)


class KVMaps:
    """The shipped maps' stand-in for the plan: every late layer's "input" is the split stream itself,
    which the plan's `kv` (fitted_kv_of) turns into K and V through the fitted maps."""

    def __init__(self, maps, path: str):
        self.split, self.layers, self.warnings = maps.split, maps.layers, []
        self.folder = f"{maps.folder}-kv-{path}"

    def predict_all(self, h):
        return {il: h for il in self.layers}


def fitted_kv_of(path: str):
    """A plan's `kv`: the late layers fitted here turn the split stream they are given into K and V."""
    fit = torch.load(path)
    kv_layers = {t // 2 for t in fit["weights"]}

    def kv(writer, il, h, pos):
        if il not in kv_layers:
            return writer.compute(il, h, pos)
        ll = writer.layout.layers[il]
        k, v = fitted_kv(fit, il, h)
        k = apply_rope(k.view(-1, ll.n_head_kv, ll.head_dim_k), ll.rope, pos)
        return k.reshape(k.shape[0], -1), v
    return kv


def compare(path: str, documents: int = 4) -> None:
    """The late K and V of the real-QA documents' first prompts (bulk rows), made from the shipped maps'
    predicted streams and from the maps fitted here, against the exact model's: the mean cosine and the
    mean norm ratio per layer, averaged over the documents."""
    from document_streams import engine_and_maps, first_prompt_streams

    fit = torch.load(path)
    split = fit["split"]
    engine, maps = engine_and_maps(split)
    writer = runtime(engine).writer
    cos = {"shipped": {}, "fitted here": {}}
    for document, tokens, streams in first_prompt_streams(engine, split, documents):
        h = torch.from_numpy(streams[split])[1:]  # row 0, the attention sink, left out
        predicted = maps.predict_all(h)
        zero = torch.zeros(len(h), dtype=torch.long)
        for il in maps.layers:
            exact = writer.compute(il, torch.from_numpy(streams[il])[1:], zero)
            for name, kv in (("shipped", writer.compute(il, predicted[il], zero)),
                             ("fitted here", fitted_kv(fit, il, h))):
                for part, got, true in zip("kv", kv, exact):
                    c = torch.nn.functional.cosine_similarity(got, true, dim=1).mean().item()
                    r = (got.norm(dim=1) / true.norm(dim=1)).mean().item()
                    cos[name].setdefault(f"{il}{part}", []).append((c, r))
        print(document, flush=True)
    for name, by in cos.items():  # per layer and part: the mean cosine, and the mean norm over the exact one's
        print(name, {k: tuple(round(sum(x) / len(v), 3) for x in zip(*v)) for k, v in by.items()})


def scales(out: str, split: int = 18, sequences: int = 8) -> None:
    """Per late layer, the factors that bring the shipped maps' K and V rows to the exact rows' norms on
    average, on the calibration corpus's first `sequences` sequences (not the real-QA set): for
    guided_variants.py `scale:OUT.pt`."""
    from backend.ridgefill.calibration_corpus import calibration_sequences
    from backend.ridgefill.stream_capture import capture_streams
    import numpy as np

    engine = calibration_engine()
    rt = runtime(engine)
    maps, ratios = rt.maps(split), {}
    for seq in calibration_sequences(engine, corpus_texts(), 2560)[:sequences]:
        streams = capture_streams(engine, [seq.tokens], list(range(split, engine.info.n_layer)), dtype=np.float32)
        h = torch.from_numpy(streams[split])[1:]
        predicted, zero = maps.predict_all(h), torch.zeros(len(h), dtype=torch.long)
        for il in maps.layers:
            exact = rt.writer.compute(il, torch.from_numpy(streams[il])[1:], zero)
            for part, got, true in zip("kv", rt.writer.compute(il, predicted[il], zero), exact):
                ratios.setdefault((il, part), []).append((true.norm(dim=1) / got.norm(dim=1)).mean().item())
    factors = {key: sum(v) / len(v) for key, v in ratios.items()}
    torch.save({"split": split, "factors": factors}, out)
    print(out, {f"{il}{part}": round(f, 3) for (il, part), f in factors.items()})


def scaled_kv_of(path: str):
    """A plan's `kv`: the late layers' K and V scaled by the factors `scales` wrote."""
    factors = torch.load(path)["factors"]

    def kv(writer, il, h, pos):
        k, v = writer.compute(il, h, pos)
        return k * factors.get((il, "k"), 1.0), v * factors.get((il, "v"), 1.0)
    return kv


if __name__ == "__main__" and sys.argv[1] == "scales":
    scales(sys.argv[2])
elif __name__ == "__main__" and sys.argv[1] == "compare":
    compare(sys.argv[2])
elif __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 18)
