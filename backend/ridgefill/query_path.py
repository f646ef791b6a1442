"""The torch Q path of a layer below the split: attn_norm (RMS) → Q projection (+bias) → per-head
q_norm (qwen3, gemma3) → RoPE at each row's position, with the layer's own parameters (the same
steps and activation rounding as kv_writer's K path, so scores compare with llama.cpp's own keys)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import RidgeFillError
from ..model_file import open_reader
from .cache_layout import GraphLayout
from .kv_writer import _act_kind, _block_mins, _dequant, _matmul, _rms, apply_rope


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
        reader = open_reader(Path(model_path))
        arch = str(reader.fields["general.architecture"].contents())
        eps_field = reader.fields.get(f"{arch}.attention.layer_norm_rms_epsilon")
        self.eps = float(eps_field.contents()) if eps_field is not None else 1e-6
        tensors = {t.name: t for t in reader.tensors}
        self.weights: dict[int, QueryWeights] = {}
        for il in layers:
            def get(name, required=True):
                t = tensors.get(f"blk.{il}.{name}")
                if t is None:
                    if required:
                        raise RidgeFillError(f"the model file lacks blk.{il}.{name}; guided mode cannot score")
                    return None
                return torch.from_numpy(np.array(_dequant(t), dtype=np.float32))

            wq_t = tensors.get(f"blk.{il}.attn_q.weight")
            wq = get("attn_q.weight")
            q_min = _block_mins(wq_t)
            if q_min is not None:
                wq = wq - q_min.repeat_interleave(32, dim=1)
            self.weights[il] = QueryWeights(get("attn_norm.weight").reshape(-1), wq, get("attn_q.bias", False),
                                            get("attn_q_norm.weight", False), _act_kind(wq_t.tensor_type), q_min)

    def queries(self, il: int, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Q after RoPE, (n, n_head, head_dim) float32, for the layer input h (n, n_embd)."""
        w, ll = self.weights[il], self.layout.layers[il]
        x = _rms(h.float(), w.attn_norm, self.eps)
        q = _matmul(x, w.wq, w.act, w.q_min)
        if w.bq is not None:
            q = q + w.bq
        q = q.view(q.shape[0], self.n_head, -1)
        if w.q_norm is not None:
            q = _rms(q, w.q_norm, self.eps)
        return apply_rope(q, ll.rope, pos)
