"""Closed-form ridge maps from the stream entering the split to the input of every late layer.

For a split S and each late layer l > S: centre X = h_S and Y = h_l by their means,
W = (XcᵀXc + λI)⁻¹ XcᵀYc and b = mean(Y) − W·mean(X) (the bias is never penalised).
λ = α · trace(XcᵀXc)/d (the Gram matrix's mean eigenvalue, so α means the same for any data scale
and row count), α chosen per layer from ALPHAS by the mean cosine between prediction and truth on
held-out rows (whole documents held out, so neighbouring rows do not leak). The chosen α is then
refitted on all rows. One eigendecomposition of the Gram matrix serves every α and every layer.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from backend.errors import Cancelled

ALPHAS = (1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)


@dataclass
class LayerFit:
    layer: int
    weight: torch.Tensor  # (d_out, d_in) float32: h_l ≈ weight @ h_S + bias
    bias: torch.Tensor  # (d_out,) float32
    alpha: float  # the chosen relative λ
    lam: float  # the absolute λ of the final fit
    heldout_cosine: float  # mean cosine on held-out rows, fit on the other rows at the chosen α
    cosine_by_alpha: dict[float, float]


class _Gram:
    """Centred Gram matrix of x (float64) and its eigendecomposition (kept in float32 for the solves)."""

    def __init__(self, xc: torch.Tensor):
        x64 = xc.double()
        m = x64.mean(0)
        g = x64.T @ x64 - len(x64) * torch.outer(m, m)
        self.n = len(x64)
        self.mean = m.float()  # the mean of xc (≈0 when xc was centred on these rows)
        self.scale = float(torch.trace(g)) / g.shape[0] or 1.0
        evals, evecs = torch.linalg.eigh(g)
        self.evals = evals.clamp_min(0).float()
        self.evecs = evecs.float()

    def weights(self, cross: torch.Tensor, alpha: float) -> torch.Tensor:
        """W (d_in, d_out) = (G + αsI)⁻¹ · cross, for a centred cross-product `cross`."""
        return self.evecs @ ((self.evecs.T @ cross) / (self.evals + alpha * self.scale).unsqueeze(1))


def mean_cosine(pred: torch.Tensor, true: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(pred, true, dim=1).double().mean())


MAX_SCORE_ROWS = 1024  # held-out rows used to score each α (an even subsample; enough for a mean)


def fit_layers(
    x: torch.Tensor,
    ys: dict[int, torch.Tensor],
    heldout: torch.Tensor,
    alphas=ALPHAS,
    on_progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> dict[int, LayerFit]:
    """Fit a map from `x` (n, d_in) to each `ys[l]` (n, d_out); `heldout` is a bool mask over rows.

    Work per layer is two (rows × d × d) products; Gram matrices and eigendecompositions are shared.
    Inputs are centred on all rows first, so the float32 products do not cancel catastrophically.
    """
    heldout = heldout.bool()
    if heldout.all() or not heldout.any():
        raise ValueError("the held-out mask must keep some rows for training and some for testing")
    tr = ~heldout
    score_idx = torch.nonzero(heldout).squeeze(1)
    if len(score_idx) > MAX_SCORE_ROWS:
        score_idx = score_idx[torch.linspace(0, len(score_idx) - 1, MAX_SCORE_ROWS).long()]
    x = x.float()
    mx = x.mean(0)
    xc = x - mx
    xtr, xh = xc[tr], xc[heldout]
    g_all, g_tr = _Gram(xc), _Gram(xtr)
    n_tr = int(tr.sum())
    z = (xc[score_idx] - g_tr.mean) @ g_tr.evecs  # held-out rows in the train Gram's eigenbasis
    fits: dict[int, LayerFit] = {}
    for i, (l, y) in enumerate(sorted(ys.items())):
        if cancel is not None and cancel():
            raise Cancelled(f"fitting cancelled after {i} of {len(ys)} layers")
        y = y.float()
        my = y.mean(0)
        yc = y - my
        s_tr = xtr.T @ yc[tr]
        s_all = s_tr + xh.T @ yc[heldout]
        my_tr = yc[tr].mean(0)
        p = g_tr.evecs.T @ (s_tr - n_tr * torch.outer(g_tr.mean, my_tr))
        truth = y[score_idx]
        scores = {}
        for a in alphas:
            pred = (z / (g_tr.evals + a * g_tr.scale)) @ p + (my + my_tr)
            scores[a] = mean_cosine(pred, truth)
        best = max(alphas, key=lambda a: scores[a])
        w = g_all.weights(s_all, best)
        fits[l] = LayerFit(l, w.T.contiguous(), my - mx @ w, best, best * g_all.scale, scores[best], scores)
        if on_progress is not None:
            on_progress(i + 1, len(ys))
    return fits


def heldout_documents(doc: torch.Tensor, every: int = 5, offset: int = 2) -> torch.Tensor:
    """Rows of every `every`-th document (by id) are held out; with under 2 documents, the last 20%."""
    ids = torch.unique(doc)
    if len(ids) >= 2:
        held = ids[(torch.arange(len(ids)) % every) == (offset % min(every, len(ids)))]
        return torch.isin(doc, held)
    mask = torch.zeros(len(doc), dtype=torch.bool)
    mask[int(len(doc) * 0.8):] = True
    return mask


def fit_map_set(
    model_path: str | os.PathLike,
    split: int,
    out_dir: str | os.PathLike | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    map_dtype: str = "float16",
    engine=None,
) -> Path:
    """Fit maps for `split` from the cached calibration activations (captured first if missing) and
    write a verified folder to `out_dir` (default: the user cache's maps dir). Returns the folder.

    on_progress(stage, done, total) with stage "capture" (tokens) or "fit" (layers).
    """
    from . import calibration
    from .fingerprint import model_fingerprint
    from .map_format import write_map_folder
    from .map_store import map_folder_name, user_maps_dir

    acts = calibration.ensure_activations(model_path, on_progress=on_progress, cancel=cancel, engine=engine)
    n_layer = acts.n_layer
    if not 0 < split < n_layer - 1:
        raise ValueError(f"split must lie in 1..{n_layer - 2} for a {n_layer}-layer model, not {split}")
    t0, c0 = time.perf_counter(), time.process_time()
    late = list(range(split + 1, n_layer))
    x = acts.layer(split)
    fits = fit_layers(
        x, {l: acts.layer(l) for l in late}, heldout_documents(acts.doc),
        on_progress=(lambda d, t: on_progress("fit", d, t)) if on_progress else None, cancel=cancel,
    )
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    fp = model_fingerprint(model_path, layers=list(range(split, n_layer)))
    calib = {k: v for k, v in acts.facts.items() if k not in ("fingerprint", "layers", "cache_version")}
    calib.update({"fit_seconds": round(fit_s, 2), "fit_cpu_seconds": round(fit_cpu, 2), "alphas": list(ALPHAS),
                  "lambda_rule": "lambda = alpha * trace(Xc^T Xc) / d, alpha per layer by held-out mean cosine",
                  "heldout": "every 5th document (prose and chat copies together)",
                  "lambda_abs": {str(l): f.lam for l, f in fits.items()}})
    folder = Path(out_dir) if out_dir is not None else user_maps_dir()
    return write_map_folder(
        folder / map_folder_name(fp, split),
        split=split, n_layer=n_layer,
        weights={l: f.weight for l, f in fits.items()}, biases={l: f.bias for l, f in fits.items()},
        fingerprint=fp, lambdas={l: f.alpha for l, f in fits.items()},
        heldout_cosine={l: f.heldout_cosine for l, f in fits.items()},
        calibration=calib, map_dtype=map_dtype,
    )
