"""Tiny random-weight GGUF models (llama, qwen2, qwen3, gemma3) written with the `gguf` package.

F32 weights: llama.cpp then multiplies in F32 (no 8-bit activation rounding), so the plumb oracle can
be held to a tight tolerance. A small SentencePiece-style vocabulary with byte tokens lets llama.cpp
load the vocabulary and tokenize anything."""
from __future__ import annotations

from pathlib import Path

import numpy as np

D, N_HEAD, N_KV, HD, FF, VOCAB_WORDS = 64, 4, 2, 16, 128, 40


def _vocab():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ["▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁that", "▁was"]
    words += [f"▁w{i}" for i in range(VOCAB_WORDS - len(words))]
    tokens += words
    types += [1] * len(words)
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(len(words))]
    return tokens, scores, types


def write_tiny_gguf(path: Path, arch: str, n_layer: int = 4, seed: int = 0, sliding_window: int = 64,
                    sampling: dict | None = None) -> Path:
    """`sampling`: recommended-sampling keys to write, e.g. {"general.sampling.temp": 0.6} (floats as
    float32, whole numbers as int32, as llama.cpp's converter writes them)."""
    import gguf

    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_name(f"tiny-{arch}")
    wr.add_file_type(0)
    wr.add_context_length(4096)
    wr.add_embedding_length(D)
    wr.add_block_count(n_layer)
    wr.add_feed_forward_length(FF)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_KV)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_rope_freq_base(10000.0)
    wr.add_key_length(HD)
    wr.add_value_length(HD)
    if arch == "gemma3":
        wr.add_sliding_window(sliding_window)
    wr.add_tokenizer_model("llama")
    wr.add_token_list(tokens)
    wr.add_token_scores(scores)
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_unk_token_id(0)
    wr.add_add_bos_token(True)
    for key, value in (sampling or {}).items():
        (wr.add_int32 if isinstance(value, int) else wr.add_float32)(key, value)

    wr.add_tensor("token_embd.weight", w(n_vocab, D, scale=0.5))
    wr.add_tensor("output_norm.weight", norm(D))
    if arch != "gemma3":  # gemma3 ties the output to the embedding
        wr.add_tensor("output.weight", w(n_vocab, D))
    for il in range(n_layer):
        p = f"blk.{il}."
        wr.add_tensor(p + "attn_norm.weight", norm(D))
        wr.add_tensor(p + "attn_q.weight", w(N_HEAD * HD, D))
        wr.add_tensor(p + "attn_k.weight", w(N_KV * HD, D))
        wr.add_tensor(p + "attn_v.weight", w(N_KV * HD, D))
        wr.add_tensor(p + "attn_output.weight", w(D, N_HEAD * HD))
        if arch == "qwen2":
            wr.add_tensor(p + "attn_q.bias", w(N_HEAD * HD, scale=0.3))
            wr.add_tensor(p + "attn_k.bias", w(N_KV * HD, scale=0.3))
            wr.add_tensor(p + "attn_v.bias", w(N_KV * HD, scale=0.3))
        if arch in ("qwen3", "gemma3"):
            wr.add_tensor(p + "attn_q_norm.weight", norm(HD))
            wr.add_tensor(p + "attn_k_norm.weight", norm(HD))
        if arch == "gemma3":
            wr.add_tensor(p + "post_attention_norm.weight", norm(D))
            wr.add_tensor(p + "post_ffw_norm.weight", norm(D))
        wr.add_tensor(p + "ffn_norm.weight", norm(D))
        wr.add_tensor(p + "ffn_gate.weight", w(FF, D))
        wr.add_tensor(p + "ffn_up.weight", w(FF, D))
        wr.add_tensor(p + "ffn_down.weight", w(D, FF))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
