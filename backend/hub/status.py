"""One row per catalogue model for a list view (CLI `models`, the GUI's model picker)."""
from __future__ import annotations

from . import store
from .catalogue import ModelEntry
from .machine_fit import check_fit
from .settings import HubSettings


def model_rows(entries: list[ModelEntry], settings: HubSettings) -> list[dict]:
    """id, name, architecture, quantization, state (installed | available | not cached (offline)),
    size_mb, context_length, licence, source, embedded, path, fits_disk, fits_ram, fit (a sentence)."""
    rows = []
    for e in entries:
        path = store.model_path(e, settings)
        rec = store.read_record(settings.models_dir / e.id) if path and e.on_hub else None
        size = path.stat().st_size if path and path.is_file() else e.size_bytes  # the embedded Gemma: not yet assembled
        fit = check_fit(size, settings.models_dir, settings.disk_free) if size else None
        rows.append({
            "id": e.id, "name": e.name, "architecture": e.architecture or (rec or {}).get("architecture") or "?",
            "quantization": e.quantization,
            "state": "installed" if path else ("not cached (offline)" if settings.offline else "available"),
            "size_mb": round(size / 1e6, 1) if size else None,
            "context_length": e.context_length or (rec or {}).get("context_length"),
            "licence": e.licence, "source": e.local_path or (f"{e.repo_id}/{e.filename}" if e.repo_id else ""),
            "embedded": e.embedded, "path": str(path) if path else None,
            "fits_disk": None if path or not fit else fit.disk_ok, "fits_ram": fit.ram_ok if fit else None,
            "fit": fit.summary() if fit and not path else "",
        })
    return rows
