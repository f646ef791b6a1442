"""How large a context is: an automatic one starts at CTX_STEP tokens and grows with the document, up to
the model's trained context and a K/V cache of KV_RAM_SHARE of the RAM and KV_AVAILABLE_SHARE of what is
available when the engine starts (another window's or the server's engine holds its own); room is kept for the answer."""
from __future__ import annotations

from .errors import DocumentTooLongError
from .machine_memory import memory
from .model_file import ModelInfo, kv_bytes_per_token
from .protocol import DEFAULT_N_CTX

CTX_STEP = 4096  # an automatic context grows in steps of this many tokens
KV_RAM_SHARE = 0.25  # an automatic context's K/V cache takes at most this share of the machine's RAM
KV_AVAILABLE_SHARE = 0.5  # ... and of the memory available at the engine's start, which other engines' caches have taken


def kv_budget() -> int | None:
    """The bytes an automatic context's K/V cache may take now; None where the OS does not say."""
    total, available = memory()
    budgets = [int(total * KV_RAM_SHARE)] if total else []
    if available is not None:
        budgets.append(int(available * KV_AVAILABLE_SHARE))
    return min(budgets) if budgets else None


def context_cap(info: ModelInfo) -> int:
    """The most tokens an automatic context grows to: the model's trained context, and no more than a
    K/V cache of kv_budget() holds, but never less than DEFAULT_N_CTX (or the trained context)."""
    cap = info.n_ctx_train or DEFAULT_N_CTX
    budget = kv_budget()
    if budget:
        cap = min(cap, max(min(cap, DEFAULT_N_CTX), budget // kv_bytes_per_token(info)))
    return cap


def answer_reserve(n_ctx_max: int, max_tokens: int) -> int:
    """Room kept after the prompt for an answer of up to `max_tokens` (at most half the context)."""
    return max(1, min(max_tokens, n_ctx_max // 2))


def check_fits(n_ctx_max: int, n_prompt: int, max_tokens: int) -> None:
    """DocumentTooLongError unless the prompt and its answer fit a context of at most `n_ctx_max`."""
    reserve = answer_reserve(n_ctx_max, max_tokens)
    if n_prompt + reserve > n_ctx_max:
        raise DocumentTooLongError(n_prompt, n_ctx_max, reserve)


def grown_size(n_ctx: int, n_ctx_max: int, need: int) -> int | None:
    """The size an automatic context of `n_ctx` grows to, to hold `need` tokens (None: it holds them)."""
    if need <= n_ctx:
        return None
    return min(n_ctx_max, -(-need // CTX_STEP) * CTX_STEP)
