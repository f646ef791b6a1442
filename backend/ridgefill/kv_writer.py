"""The torch K/V path of a late layer, from its input stream to F16 rows in llama.cpp's cache.

attn_norm (RMS) → K and V projections (+bias) → per-head k_norm (qwen3, gemma3) → RoPE at each row's
position with the parameters of the layer's own ROPE node → float16 → the layer's cache cells.
Weights are dequantized from the GGUF with the `gguf` package (K-quants included). llama.cpp's CPU
matmul quantizes the activations to the weight's "vec_dot" type first (Q8_1 for Q4_1, Q8_0 for Q4_0/Q8_0,
Q8_K for K-quants, F16 for F16); doing the same here cuts the error against its own K/V
(docs/measurements/speed.md#injection-torch-threads-and-activation-quantization).
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
    k_act: str = "f32"  # how llama.cpp quantizes the activations for the K / V matmuls
    v_act: str = "f32"
    k_min: torch.Tensor | None = None  # Q4_1/Q5_1: per-block mins (rows, blocks); wk/wv then hold w - min
    v_min: torch.Tensor | None = None


def _act_kind(qtype) -> str:
    name = getattr(qtype, "name", str(qtype))
    if name in ("Q4_1", "Q5_1"):
        return "q8_1"
    if name in ("Q4_0", "Q5_0", "Q8_0"):
        return "q8_0"
    if name.endswith("_K") or name.startswith("IQ"):
        return "q8_k"
    if name == "F16":
        return "f16"
    if name == "BF16":
        return "bf16"
    return "f32"


def _q8_blocks(x: torch.Tensor):
    n, d = x.shape
    xb = x.reshape(n, d // 32, 32)
    dd = xb.abs().amax(-1, keepdim=True) / 127.0
    q = torch.round(xb * torch.where(dd == 0, torch.zeros_like(dd), 1.0 / dd))
    return q, dd


def q8_1_with_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_1 activations (dequantized, fp16 block scale) and each block's fp16 `s = d·Σq`, which
    ggml's Q4_1/Q5_1 dot product multiplies with the weight block's min."""
    q, dd = _q8_blocks(x)
    s = (dd[..., 0] * q.sum(-1)).half().float()
    return (q * dd.half().float()).reshape(x.shape), s


def quantize_activations(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x (n, d) rounded the way ggml quantizes a matmul's activations (returned dequantized)."""
    n, d = x.shape
    if kind in ("q8_0", "q8_1") and d % 32 == 0:
        q, dd = _q8_blocks(x)
        return (q * dd.half().float()).reshape(n, d)  # the block scale is stored as fp16
    if kind == "q8_k" and d % 256 == 0:
        xb = x.reshape(n, d // 256, 256)
        mx = torch.gather(xb, -1, xb.abs().argmax(-1, keepdim=True))  # signed value of largest magnitude
        safe = torch.where(mx == 0, torch.ones_like(mx), mx)
        iscale = -127.0 / safe
        q = torch.round(xb * iscale).clamp(max=127)
        return torch.where(mx == 0, torch.zeros_like(xb), q / iscale).reshape(n, d)
    if kind == "f16":
        return x.half().float()
    if kind == "bf16":
        return x.bfloat16().float()
    return x


def _dequant(t) -> np.ndarray:
    from gguf.quants import dequantize

    a = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    shape = tuple(int(x) for x in reversed(t.shape))  # gguf lists ne0 first
    return a.reshape(shape)


def _block_mins(t) -> torch.Tensor | None:
    """Q4_1/Q5_1 blocks start with fp16 d then fp16 m (the block's min): (rows, blocks) float32."""
    name = getattr(t.tensor_type, "name", "")
    if name not in ("Q4_1", "Q5_1"):
        return None
    rows = int(t.shape[1]) if len(t.shape) > 1 else 1
    raw = np.asarray(t.data, dtype=np.uint8).reshape(rows, -1)
    bsize = 20 if name == "Q4_1" else 24
    blocks = raw.reshape(rows, -1, bsize)
    m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0]
    return torch.from_numpy(m.astype(np.float32))


def quantized_matmul(x: torch.Tensor, w: torch.Tensor, act: str, mins: torch.Tensor | None) -> torch.Tensor:
    if mins is not None and act == "q8_1":
        xq, s = q8_1_with_sums(x)
        return xq @ w.T + s @ mins.T
    return quantize_activations(x, act) @ w.T


def open_weights(model_path: str):
    """(the GGUF's tensors by name, its RMS-norm epsilon) for loading layer weights."""
    reader = open_reader(Path(model_path))
    arch = str(reader.values["general.architecture"])
    eps = reader.values.get(f"{arch}.attention.layer_norm_rms_epsilon")
    return {t.name: t for t in reader.tensors}, (float(eps) if isinstance(eps, (int, float)) else 1e-6)


def layer_tensor(tensors: dict, il: int, name: str, required: bool = True) -> torch.Tensor | None:
    """blk.{il}.{name} dequantized to float32 (None when absent and not required)."""
    t = tensors.get(f"blk.{il}.{name}")
    if t is None:
        if required:
            raise RidgeFillError(f"the model file lacks blk.{il}.{name}; RidgeFill cannot use layer {il}")
        return None
    return torch.from_numpy(np.array(_dequant(t), dtype=np.float32))


def matmul_weight(tensors: dict, il: int, name: str) -> tuple[torch.Tensor, str, torch.Tensor | None]:
    """A projection's (weight, activation kind, Q4_1/Q5_1 block mins); with mins, the weight holds w - min."""
    w = layer_tensor(tensors, il, name)  # raises when the file lacks it
    mins = _block_mins(tensors[f"blk.{il}.{name}"])
    if mins is not None:
        w = w - mins.repeat_interleave(32, dim=1)
    return w, _act_kind(tensors[f"blk.{il}.{name}"].tensor_type), mins


def load_layer_weights(model_path: str, layers: list[int]) -> tuple[dict[int, LayerWeights], float]:
    """The K/V path weights of `layers` (float32 torch tensors) and the RMS-norm epsilon."""
    tensors, eps = open_weights(model_path)
    out = {}
    for il in layers:
        wk, k_act, k_min = matmul_weight(tensors, il, "attn_k.weight")
        wv, v_act, v_min = matmul_weight(tensors, il, "attn_v.weight")
        out[il] = LayerWeights(layer_tensor(tensors, il, "attn_norm.weight").reshape(-1), wk, wv,
                               layer_tensor(tensors, il, "attn_k.bias", False),
                               layer_tensor(tensors, il, "attn_v.bias", False),
                               layer_tensor(tensors, il, "attn_k_norm.weight", False), k_act, v_act, k_min, v_min)
    return out, eps


def _corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def rope_cos_sin(p: RopeParams, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (n, n_dims/2) as ggml's CPU rope computes them, in float32 and in the same order
    (theta *= theta_scale per pair: at position 2,000 that recurrence drifts ~3e-3 rad from the exact
    angle, which matters for matching its cache), YaRN ramp and freq factors included."""
    half = p.n_dims // 2
    f32 = torch.float32
    theta_scale = torch.tensor(p.freq_base, dtype=f32).pow(torch.tensor(-2.0 / p.n_dims, dtype=f32))
    theta = pos.to(f32).clone()
    cols = []
    for _ in range(half):
        cols.append(theta)
        theta = theta * theta_scale
    theta_extrap = torch.stack(cols, dim=1)
    if p.freq_factors is not None:
        theta_extrap = theta_extrap / torch.tensor(p.freq_factors[:half], dtype=f32)
    theta_interp = theta_extrap * torch.tensor(p.freq_scale, dtype=f32)
    mscale = p.attn_factor
    theta = theta_interp
    if p.ext_factor != 0.0:
        lo = max(0.0, math.floor(_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base)))
        hi = min(p.n_dims - 1.0, math.ceil(_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base)))
        y = (torch.arange(half, dtype=f32) - lo) / max(0.001, hi - lo)
        ramp = (1 - y.clamp(0, 1)) * p.ext_factor
        theta = theta_interp * (1 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / p.freq_scale)
    return torch.cos(theta) * mscale, torch.sin(theta) * mscale


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


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class KVWriter:
    """Computes and writes late layers' K/V for rows whose layer inputs are given."""

    def __init__(self, model_path: str, layout: GraphLayout, layers: list[int]):
        self.layout = layout
        self.weights, self.eps = load_layer_weights(model_path, layers)

    def compute(self, il: int, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (after RoPE) and V rows (n, n_embd_gqa) float32 for the input stream h (n, n_embd)."""
        w, ll = self.weights[il], self.layout.layers[il]
        x = rms_norm(h.float(), w.attn_norm, self.eps)
        k = quantized_matmul(x, w.wk, w.k_act, w.k_min)
        v = quantized_matmul(x, w.wv, w.v_act, w.v_min)
        if w.bk is not None:
            k = k + w.bk
        if w.bv is not None:
            v = v + w.bv
        k = k.view(-1, ll.n_head_kv, ll.head_dim_k)
        if w.k_norm is not None:
            k = rms_norm(k, w.k_norm, self.eps)
        k = apply_rope(k, ll.rope, pos)
        return k.reshape(k.shape[0], -1), v

    def writes(self, il: int, h: torch.Tensor, pos: torch.Tensor, k_cells: np.ndarray, v_cells: np.ndarray,
               compute=None) -> list:
        """Layer `il`'s K and V rows for `h` at `pos`, as the slot's writes into those cells (backend/slot.py);
        `compute(writer, il, h, pos)` in place of the layer's own projections (a plan's `kv`)."""
        k, v = self.compute(il, h, pos) if compute is None else compute(self, il, h, pos)
        ll: LayerLayout = self.layout.layers[il]
        return [(ll.k_cache, k_cells, k.numpy().astype(np.float16)), (ll.v_cache, v_cells, v.numpy().astype(np.float16))]
