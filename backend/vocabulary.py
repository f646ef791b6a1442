"""The model's vocabulary: text to tokens and back, and its own chat template (from the GGUF)."""
from __future__ import annotations

import ctypes

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from .errors import EngineError
from .protocol import ChatMessage, CompletionRequest

# A base model (no chat template) is not taught to answer a chat: its prompt is plain text that ends in
# "Answer:", which it completes, and its answer ends where it would start the next paragraph or invent
# the next question (docs/LONG_DOCUMENTS.md#a-prompt-a-pretrained-model-completes).
ANSWER_CUE = "Answer:"
PLAIN_ANSWER_STOPS = ("\n\n", "\nQuestion:", "\nAnswer:")


class Vocabulary:
    """Tokens of one loaded model (the Engine is one; `chat_template` from its GGUF metadata)."""

    def __init__(self, model, chat_template: str | None):
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._bos_text = self.token_text(llama_cpp.llama_vocab_bos(self._vocab))
        eos_text = self.token_text(llama_cpp.llama_vocab_eos(self._vocab))
        self._formatter = (
            Jinja2ChatFormatter(chat_template, eos_token=eos_text, bos_token=self._bos_text) if chat_template else None
        )

    @property
    def vocab(self):
        """llama.cpp's vocabulary handle (the sampler chain is built on it)."""
        return self._vocab

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is what it needs
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise EngineError("tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        return self.token_bytes(token, special=True).decode("utf-8", "replace")

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # ---- chat ----------------------------------------------------------------------------------
    def format_chat(self, messages: list[ChatMessage]) -> str:
        """Render messages with the model's own chat template (from its GGUF metadata)."""
        msgs = [{"role": m.role, "content": m.content} for m in messages]
        if self._formatter is None:
            return plain_prompt(msgs)
        return self._formatter(messages=msgs).prompt

    @property
    def answer_stops(self) -> tuple[str, ...]:
        """Where a chat answer ends besides the end of generation: a base model's paragraph's end."""
        return PLAIN_ANSWER_STOPS if self._formatter is None else ()

    def prompt_tokens(self, request: CompletionRequest) -> list[int]:
        if (request.messages is None) == (request.prompt is None):
            raise ValueError("a request has either messages or a prompt")
        text = request.prompt if request.prompt is not None else self.format_chat(request.messages)
        # A template that writes the BOS text itself must not get a second BOS from the tokenizer.
        add_special = not (self._bos_text and text.startswith(self._bos_text))
        return self.tokenize(text, add_special=add_special)


def plain_prompt(messages: list[dict]) -> str:
    """A base model's chat as plain text: each turn's text, each answer after the cue, and the cue last."""
    text = ""
    for m in messages:
        if m["role"] == "assistant":
            text += f"\n{ANSWER_CUE} {m['content'].strip()}"
        else:
            text += ("\n\n" if text else "") + m["content"].strip()
    return text if messages and messages[-1]["role"] == "assistant" else f"{text}\n{ANSWER_CUE}"
