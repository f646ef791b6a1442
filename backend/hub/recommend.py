"""Which catalogue model to recommend for reading documents on this machine.

The embedded models are for trying the app (docs/LONG_DOCUMENTS.md, "The default model on the long
set"). For documents the app recommends the largest chat model of the catalogue that
- is an instruct model (it answers questions; a pretrained one continues the text),
- holds a long document (a trained context of at least 32K tokens),
- fits the machine: its file in a quarter of the memory and on the disk, and at most MB_PER_CORE per
  CPU core, since prefill time grows with the weights and shrinks with the cores: on two cores Gemma 3
  270M (253 MB) reads 16K tokens in 68-84 s (docs/LONG_DOCUMENTS.md), a 491 MB model about twice that.
"""
from __future__ import annotations

import os

from ..machine_memory import memory
from .catalogue import ModelEntry

MIN_CONTEXT = 32768
MB_PER_CORE = 250  # 2 cores: 500 MB, a 0.5B model at Q4; 8 cores: 2 GB; 16 cores: 4 GB
RAM_SHARE = 4  # the file may take at most a quarter of the memory: K/V, the documents and the desktop need the rest


def is_instruct(entry: ModelEntry) -> bool:
    name = f"{entry.id} {entry.name}".lower()
    return "instruct" in name or "-it" in name or " it" in name


def recommended_model(entries: list[ModelEntry], rows: list[dict], cores: int | None = None,
                      ram_bytes: int | None = None) -> ModelEntry | None:
    """The entry to offer (installed or not), or None when nothing in the catalogue fits. `rows` are
    backend.hub.status.model_rows of the same entries (fits_disk, path); `cores` and `ram_bytes` (the
    machine's total memory) are read from this machine when not given (memory the OS does not tell: no limit)."""
    cores = cores or os.cpu_count() or 1
    ram_bytes = ram_bytes if ram_bytes is not None else memory()[0]
    budget = cores * MB_PER_CORE * 10**6
    if ram_bytes:
        budget = min(budget, ram_bytes // RAM_SHARE)
    fitting = [e for e, row in zip(entries, rows)
               if e.on_hub and not e.embedded and is_instruct(e) and (e.context_length or 0) >= MIN_CONTEXT
               and e.size_bytes and e.size_bytes <= budget and row.get("fits_disk") is not False]
    return max(fitting, key=lambda e: e.size_bytes, default=None)
