"""Ridge fitting on synthetic data (known answers), and calibration + refit on the real model."""
from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from backend.ridgefill import calibration
from backend.ridgefill.activation_store import load_activations
from backend.ridgefill.calibration_corpus import calibration_sequences
from backend.ridgefill.fitting import ALPHAS, fit_layers, fit_map_set, heldout_documents, mean_cosine
from backend.ridgefill.maps import load_maps


def synthetic(n=2000, d=48, noise=0.0, offset=1000.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 3 + 5  # not centred: the fit must centre it
    a = torch.randn(d, d, generator=g) / d**0.5
    b = torch.full((d,), offset) + torch.randn(d, generator=g)
    y = x @ a.T + b + noise * torch.randn(n, d, generator=g)
    return x, y, a, b


def test_ridge_recovers_a_known_linear_relation():
    x, y, a, b = synthetic()
    doc = torch.arange(len(x)) // 200
    fits = fit_layers(x, {7: y}, heldout_documents(doc))
    f = fits[7]
    assert f.heldout_cosine > 0.99999
    assert (f.weight - a).abs().max() < 1e-3
    assert (f.bias - b).abs().max() < 5e-2  # an offset of 1000 comes back (float32, centred fit)
    assert f.alpha == min(ALPHAS)  # no noise: the least shrinkage is best


def test_bias_is_not_penalised():
    # Even with heavy shrinkage of W, the prediction at the mean input is the mean output: the
    # bias absorbs the offset of 1000 exactly, instead of being shrunk towards 0 with W.
    x, y, a, b = synthetic(noise=0.5)
    fit = fit_layers(x, {0: y}, torch.arange(len(x)) % 5 == 0, alphas=(10.0,))[0]  # refitted on all rows
    w, bias, lam = fit.weight, fit.bias, fit.lam
    assert w.abs().max() < 0.5 * a.abs().max()  # W is shrunk a lot
    at_mean = x.mean(0) @ w.T + bias
    assert torch.allclose(at_mean, y.mean(0), atol=1e-2)
    assert lam > 0
    # An uncentred ridge (bias as a penalised column of ones) would not recover the offset:
    x1 = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    lam_abs = float(lam)
    beta = torch.linalg.solve(x1.T @ x1 + lam_abs * torch.eye(x1.shape[1], dtype=torch.float64), x1.T @ y.double())
    penalised_at_mean = (x1.mean(0) @ beta).float()
    assert (penalised_at_mean - y.mean(0)).abs().max() > 1.0


def test_lambda_selection_finds_the_held_out_optimum():
    # Few noisy rows for 64 inputs: no shrinkage overfits, too much underfits; the optimum is inside.
    g = torch.Generator().manual_seed(1)
    d = 64
    a = torch.randn(d, d, generator=g) / 8
    x = torch.randn(400, d, generator=g)
    y = x @ a + torch.randn(400, d, generator=g)
    alphas = [10.0**e for e in range(-4, 4)]
    fit = fit_layers(x, {1: y}, torch.arange(400) >= 80, alphas=alphas)[1]
    scores = fit.cosine_by_alpha
    assert fit.alpha not in (alphas[0], alphas[-1])
    assert fit.heldout_cosine == max(scores.values())
    assert fit.heldout_cosine > scores[alphas[0]] + 0.05 and fit.heldout_cosine > scores[alphas[-1]] + 0.05


def test_held_out_rows_are_whole_documents():
    doc = torch.tensor([0] * 10 + [1] * 10 + [2] * 10 + [3] * 10 + [4] * 10 + [5] * 10)
    mask = heldout_documents(doc)
    assert mask.any() and not mask.all()
    for d in doc.unique():
        assert mask[doc == d].all() or not mask[doc == d].any()  # never half a document
    single = heldout_documents(torch.zeros(100, dtype=torch.long))
    assert single[80:].all() and not single[:80].any()


def test_mean_cosine():
    v = torch.randn(10, 5)
    assert mean_cosine(v, 3 * v) == pytest.approx(1.0, abs=1e-6)
    assert mean_cosine(v, -v) == pytest.approx(-1.0, abs=1e-6)


def test_small_calibration_on_the_real_model_refits_from_cache(small_engine, model_path, tmp_path, capsys):
    t0 = time.perf_counter()
    acts = calibration.capture_activations(small_engine, stride=2, max_tokens=384)
    capture_s = time.perf_counter() - t0
    facts = acts.facts
    assert (facts["tokens"], facts["rows"], facts["stride"]) == (384, 192, 2)
    assert facts["chat_sequences"] == 0 and facts["prose_sequences"] == 1  # the first text is long enough
    assert acts.layer(20).shape == (192, 576) and acts.layer(1).dtype == torch.float32
    assert load_activations(model_path).facts == facts  # found again by fingerprint

    t1 = time.perf_counter()
    folder = fit_map_set(model_path, 27, out_dir=tmp_path / "a", engine=small_engine)
    refit_s = time.perf_counter() - t1
    maps = load_maps(folder, model_path)
    assert maps.layers == [28, 29] and maps.warnings == []
    cos = maps.manifest["heldout_cosine"]
    assert all(0.5 < c <= 1.0 for c in cos.values())
    assert maps.manifest["calibration"]["rows"] == 192
    print(f"capture {capture_s:.1f} s, refit {refit_s:.1f} s")

    # A fit from a fresh capture equals the refit from the cache (capture is deterministic).
    shutil.rmtree(acts.folder)
    assert load_activations(model_path) is None
    calibration.capture_activations(small_engine, stride=2, max_tokens=384)
    again = load_maps(fit_map_set(model_path, 27, out_dir=tmp_path / "b", engine=small_engine), model_path)
    for l in maps.layers:
        assert torch.allclose(again.weights[l], maps.weights[l], atol=1e-3)
        assert torch.allclose(again.biases[l], maps.biases[l], atol=1e-3)

    # The CLI refits from the same cache and prints the per-layer cosines.
    from app.cli import run_cli

    capsys.readouterr()
    assert run_cli(["fit-maps", "--split", "28", "--out", str(tmp_path / "cli"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == 28 and list(out["heldout_cosine"]) == ["29"] and out["calibration"]["rows"] == 192


def test_chat_copies_use_the_models_template(small_engine):
    seqs = calibration_sequences(small_engine, ["A short note. It has two sentences. And a third."], 100)
    (d0, k0, prose), (d1, k1, chat) = seqs
    assert (d0, k0, d1, k1) == (0, "prose", 0, "chat")
    (im_start,) = small_engine.tokenize("<|im_start|>", add_special=False)
    assert chat.count(im_start) >= 2  # user and assistant turns, rendered by SmolLM2's own template
    assert "A short note." in small_engine.detokenize(chat) and len(chat) > len(prose)
