"""The torch Q path of a layer below the split: attn_norm (RMS) → Q projection (+bias) → per-head
q_norm (qwen3, gemma3) → RoPE at each row's position, with the layer's own parameters (the same
steps and activation rounding as kv_writer's K path, so scores compare with llama.cpp's own keys)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache_layout import GraphLayout
from .kv_writer import apply_rope, layer_tensor, matmul_weight, open_weights, quantized_matmul, rms_norm


@dataclass
class QueryWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # (n_head * head_dim, n_embd); Q4_1/Q5_1: w - min, with q_min
    bq: torch.Tensor | None
    q_norm: torch.Tensor | None
    act: str
    q_min: torch.Tensor | None


class QueryPath:
    def __init__(self, model_path: str, layout: GraphLayout, layers: list[int], n_head: int):
        self.layout, self.n_head = layout, n_head
        tensors, self.eps = open_weights(model_path)
        self.weights: dict[int, QueryWeights] = {}
        for il in layers:
            wq, act, q_min = matmul_weight(tensors, il, "attn_q.weight")
            self.weights[il] = QueryWeights(layer_tensor(tensors, il, "attn_norm.weight").reshape(-1), wq,
                                            layer_tensor(tensors, il, "attn_q.bias", False),
                                            layer_tensor(tensors, il, "attn_q_norm.weight", False), act, q_min)
    def queries(self, il: int, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Q after RoPE, (n, n_head, head_dim) float32, for the layer input h (n, n_embd)."""
        w, ll = self.weights[il], self.layout.layers[il]
        x = rms_norm(h.float(), w.attn_norm, self.eps)
        q = quantized_matmul(x, w.wq, w.act, w.q_min)
        if w.bq is not None:
            q = q + w.bq
        q = q.view(q.shape[0], self.n_head, -1)
        if w.q_norm is not None:
            q = rms_norm(q, w.q_norm, self.eps)
        return apply_rope(q, ll.rope, pos)
