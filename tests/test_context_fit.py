"""A document too long for the model: the advice names the catalogue models whose context holds it."""
from __future__ import annotations

import pytest

from backend.hub.catalogue import load_catalogue
from backend.hub.context_fit import advice, models_that_hold
from backend.hub.settings import HubSettings
from lab.evals.nll import token_logprobs


def test_only_models_whose_context_holds_the_prompt_are_named_installed_first(tmp_path):
    hs = HubSettings(cache_root=tmp_path, offline=True)
    entries = load_catalogue()
    rows = models_that_hold(20_000, entries, hs)
    assert rows and all(r["context_length"] >= 20_000 for r in rows)
    assert "SmolLM2 135M Instruct" not in [r["name"] for r in rows]  # 8K: does not hold 20,000 tokens
    assert {r["name"] for r in models_that_hold(100_000, entries, hs)} >= {"Gemma 3 4B IT", "Llama 3.1 8B Instruct"}
    assert "Qwen3 8B" not in {r["name"] for r in models_that_hold(100_000, entries, hs)}  # 32K
    sizes = [r["size_mb"] for r in rows if r["state"] != "installed"]
    assert sizes == sorted(sizes)  # the smallest first
    # the embedded model is installed: it comes first whenever it holds the prompt
    assert models_that_hold(4_000, entries, hs)[0]["name"] == "SmolLM2 135M Instruct"


def test_advice_names_context_and_size_or_says_none_holds_it(tmp_path):
    hs = HubSettings(cache_root=tmp_path, offline=True)
    text = advice(20_000, load_catalogue(), hs)
    assert "Gemma 3 270M IT (32K context, 292 MB" in text and "SmolLM2" not in text
    assert "No model in the catalogue holds" in advice(10_000_000, load_catalogue(), hs)


def test_a_too_long_request_names_the_models_that_hold_it(small_engine):
    import pytest

    from backend.completion import complete
    from backend.errors import DocumentTooLongError
    from backend.protocol import CompletionRequest

    with pytest.raises(DocumentTooLongError) as err:  # a 2K context; the embedded model's 8K holds it
        complete(small_engine, CompletionRequest(prompt="word " * 3000, max_tokens=16))
    assert "Models whose context holds it: SmolLM2 135M Instruct (8K context" in str(err.value)
    assert err.value.prompt_tokens > 2048 and err.value.advice


def test_an_automatic_context_follows_the_document():
    """--ctx 0: the context starts small and grows to hold a longer prompt and its answer (up to the
    model's trained context), and RidgeFill runs on the grown context."""
    from backend.completion import complete
    from backend.context_size import CTX_STEP
    from backend.engine import Engine, EngineConfig
    from backend.embedded_models import embedded_model_path
    from backend.protocol import AUTO_CTX, CompletionRequest
    from backend.ridgefill.runtime import runtime

    with Engine(EngineConfig(str(embedded_model_path()), n_ctx=AUTO_CTX, n_threads=2)) as e:
        assert e.n_ctx == CTX_STEP and e.n_ctx_max == 8192
        short = complete(e, CompletionRequest(prompt="The sky is", max_tokens=2))
        assert short.prompt_tokens < 100 and e.n_ctx == CTX_STEP and runtime(e).refused is None
        words = "The harbour log, page by page. " * 700  # about 5,000 tokens
        res = complete(e, CompletionRequest(prompt=words, max_tokens=4, mode="speed", split=18))
        assert res.prompt_tokens > CTX_STEP and e.n_ctx == 8192
        assert res.timings.mode == "speed" and res.timings.bulk_n > 0, res.timings.note  # the layout followed


def test_the_evaluations_own_prefills_grow_an_automatic_context_too(tmp_path):
    """nll and hitrate prefill without a request (the ΔNLL document, the bulk pass): at 16K on Gemma
    they stopped with llama_decode's "no room" at position 4,096, the context's first size."""
    from backend.context_size import CTX_STEP
    from backend.engine import Engine, EngineConfig
    from lab.evals import selection
    from backend.recall.haystacks import filler_haystack
    from backend.recall.needles import build_item
    from backend.embedded_models import embedded_model_path
    from backend.protocol import AUTO_CTX

    with Engine(EngineConfig(str(embedded_model_path()), n_ctx=AUTO_CTX, n_threads=2)) as e:
        item = build_item(e, length=CTX_STEP + 300, depth=0.5, variant="single", haystack=filler_haystack())
        grid = selection.Grid(windows=(32,), layer_sets=((7,),), variants=(("max", "bulk+window"),), pools=(5,),
                              forwards=("wrap",), peaks=(8,), contrasts=(False,), also_peaks=(0,))
        rec = selection.run_hit_rate(e, [item], 12, 64, tmp_path / "hits.jsonl", grid=grid)[0]
        assert rec["bulk"] and rec["hits"] and e.n_ctx > CTX_STEP
        tokens = e.prompt_tokens(item.request())
    with Engine(EngineConfig(str(embedded_model_path()), n_ctx=AUTO_CTX, n_threads=2)) as e:
        assert len(token_logprobs(e, tokens, 4)) == 4 and e.n_ctx > CTX_STEP


def test_a_context_that_cannot_grow_refuses_the_prompt_and_the_engine_goes_on(monkeypatch):
    """Out of memory while growing: a clear refusal that says why, and the engine keeps its old size
    (it used to free the model, leaving a dead engine)."""
    import llama_cpp

    from backend.completion import complete
    from backend.context_size import CTX_STEP
    from backend.engine import Engine, EngineConfig
    from backend.errors import DocumentTooLongError
    from backend.embedded_models import embedded_model_path
    from backend.protocol import AUTO_CTX, CompletionRequest

    real = llama_cpp.llama_init_from_model

    def no_memory_beyond_the_first_step(model, cparams):
        return None if cparams.n_ctx > CTX_STEP else real(model, cparams)

    with Engine(EngineConfig(str(embedded_model_path()), n_ctx=AUTO_CTX, n_threads=2)) as e:
        monkeypatch.setattr(llama_cpp, "llama_init_from_model", no_memory_beyond_the_first_step)
        with pytest.raises(DocumentTooLongError, match="not enough free memory"):
            e.make_room(5000, 64)
        words = "The harbour log, page by page. " * 700  # about 5,000 tokens, through the request path
        with pytest.raises(DocumentTooLongError, match="not enough free memory") as refused:
            complete(e, CompletionRequest(prompt=words, max_tokens=4))
        # the model holds the prompt: neither a larger context setting nor a larger model is the way out
        assert "raise the context size" not in str(refused.value) and "Models whose" not in str(refused.value)
        assert e.n_ctx == CTX_STEP
        res = complete(e, CompletionRequest(prompt="The sky is", max_tokens=2))
        assert res.tokens and res.finish_reason in ("stop", "length")


def test_an_automatic_context_counts_the_memory_other_engines_hold(monkeypatch):
    """A second window's or the server's engine has taken memory: the K/V budget is half of what is left,
    not a quarter of the RAM as if it were alone (issue 55, item 2)."""
    from backend import context_size
    from backend.model_file import ModelInfo

    info = ModelInfo(path="m.gguf", architecture="gemma3", name="m", n_layer=18, n_embd=640, n_head=4,
                     n_head_kv=1, n_ctx_train=32768, file_type=None, size_bytes=1, chat_template=None, head_dim=256)
    per_token = context_size.kv_bytes_per_token(info)  # 18 KB: 32K tokens take 604 MB
    gb = 10**9
    monkeypatch.setattr(context_size, "memory", lambda: (24 * gb, 20 * gb))
    assert context_size.context_cap(info) == 32768  # alone on a 24 GB machine: the trained context
    monkeypatch.setattr(context_size, "memory", lambda: (24 * gb, int(0.4 * gb)))  # the others hold the rest
    assert context_size.context_cap(info) == int(0.2 * gb) // per_token < 32768
    monkeypatch.setattr(context_size, "memory", lambda: (None, None))  # the OS does not say: the model's own
    assert context_size.context_cap(info) == 32768
