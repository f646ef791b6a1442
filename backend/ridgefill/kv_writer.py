"""The torch K/V path of a late layer, from its input stream to F16 rows in llama.cpp's cache.

attn_norm (RMS) → K and V projections (+bias) → per-head k_norm (qwen3, gemma3) → RoPE at each row's
position with the parameters of the layer's own ROPE node → float16 → the layer's cache cells.
Weights are dequantized from the GGUF with the `gguf` package (K-quants included).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import RidgeFillError
from ..model_file import open_reader
from .cache_layout import GraphLayout, LayerLayout, RopeParams


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wk: torch.Tensor  # (n_embd_k_gqa, n_embd)
    wv: torch.Tensor
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    k_norm: torch.Tensor | None  # (head_dim,)


def _dequant(t) -> np.ndarray:
    from gguf.quants import dequantize

    a = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    shape = tuple(int(x) for x in reversed(t.shape))  # gguf lists ne0 first
    return a.reshape(shape)


def load_layer_weights(model_path: str, layers: list[int]) -> tuple[dict[int, LayerWeights], float]:
    """The K/V path weights of `layers` (float32 torch tensors) and the RMS-norm epsilon."""
    reader = open_reader(Path(model_path))
    arch = str(reader.fields["general.architecture"].contents())
    eps_field = reader.fields.get(f"{arch}.attention.layer_norm_rms_epsilon")
    eps = float(eps_field.contents()) if eps_field is not None else 1e-6
    wanted = {f"blk.{il}.{n}" for il in layers for n in
              ("attn_norm.weight", "attn_k.weight", "attn_v.weight", "attn_k.bias", "attn_v.bias", "attn_k_norm.weight")}
    tensors = {t.name: t for t in reader.tensors if t.name in wanted}
    out = {}
    for il in layers:
        def get(name, required=True):
            t = tensors.get(f"blk.{il}.{name}")
            if t is None:
                if required:
                    raise RidgeFillError(f"the model file lacks blk.{il}.{name}; RidgeFill cannot write layer {il}")
                return None
            return torch.from_numpy(np.array(_dequant(t), dtype=np.float32))
        out[il] = LayerWeights(get("attn_norm.weight").reshape(-1), get("attn_k.weight"), get("attn_v.weight"),
                               get("attn_k.bias", False), get("attn_v.bias", False), get("attn_k_norm.weight", False))
    return out, eps


def _corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def rope_cos_sin(p: RopeParams, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (n, n_dims/2) as ggml's rope_yarn computes them (YaRN ramp and freq factors included)."""
    half = p.n_dims // 2
    i0 = torch.arange(0, p.n_dims, 2, dtype=torch.float64)
    inv = p.freq_base ** (-i0 / p.n_dims)
    if p.freq_factors is not None:
        inv = inv / torch.tensor(p.freq_factors[:half], dtype=torch.float64)
    theta_extrap = pos.to(torch.float64)[:, None] * inv[None, :]
    theta = theta_extrap * p.freq_scale
    mscale = p.attn_factor
    if p.ext_factor != 0.0:
        lo = max(0.0, math.floor(_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base)))
        hi = min(p.n_dims - 1.0, math.ceil(_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base)))
        y = (i0 / 2 - lo) / max(0.001, hi - lo)
        ramp = (1 - y.clamp(0, 1)) * p.ext_factor
        theta = theta * (1 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / p.freq_scale)
    return (torch.cos(theta) * mscale).float(), (torch.sin(theta) * mscale).float()


def apply_rope(x: torch.Tensor, p: RopeParams, pos: torch.Tensor) -> torch.Tensor:
    """x (n, heads, head_dim) → roped copy. NORM rotates adjacent pairs, NEOX the two halves."""
    cos, sin = rope_cos_sin(p, pos)
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = x.clone()
    if p.neox:
        h = p.n_dims // 2
        x0, x1 = x[..., :h], x[..., h : p.n_dims]
        out[..., :h] = x0 * cos - x1 * sin
        out[..., h : p.n_dims] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0 : p.n_dims : 2], x[..., 1 : p.n_dims : 2]
        out[..., 0 : p.n_dims : 2] = x0 * cos - x1 * sin
        out[..., 1 : p.n_dims : 2] = x0 * sin + x1 * cos
    return out


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class KVWriter:
    """Computes and writes late layers' K/V for rows whose layer inputs are given."""

    def __init__(self, model_path: str, layout: GraphLayout, layers: list[int]):
        self.layout = layout
        self.weights, self.eps = load_layer_weights(model_path, layers)

    def compute(self, il: int, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (after RoPE) and V rows (n, n_embd_gqa) float32 for the input stream h (n, n_embd)."""
        w, ll = self.weights[il], self.layout.layers[il]
        x = _rms(h.float(), w.attn_norm, self.eps)
        k = x @ w.wk.T
        v = x @ w.wv.T
        if w.bk is not None:
            k = k + w.bk
        if w.bv is not None:
            v = v + w.bv
        k = k.view(-1, ll.n_head_kv, ll.head_dim_k)
        if w.k_norm is not None:
            k = _rms(k, w.k_norm, self.eps)
        k = apply_rope(k, ll.rope, pos)
        return k.reshape(k.shape[0], -1), v

    def write(self, il: int, h: torch.Tensor, pos: torch.Tensor, k_cells: np.ndarray, v_cells: np.ndarray) -> None:
        k, v = self.compute(il, h, pos)
        ll: LayerLayout = self.layout.layers[il]
        ll.k_cache.rows()[k_cells] = k.numpy().astype(np.float16)
        ll.v_cache.rows()[v_cells] = v.numpy().astype(np.float16)
