"""`python -m app models`: the catalogue with installed/available state, size, fit and maps."""
from __future__ import annotations

import json

from app.commands.download import add_hub_options, catalogue, hub_settings, user_models_file
from backend.hub import store
from backend.hub.catalogue import add_hub, add_local
from backend.hub.fit import check_fit


def register(sub) -> None:
    p = sub.add_parser("models", help="list the model catalogue (installed / available), or add a model")
    p.add_argument("--add", metavar="PATH|OWNER/REPO[:FILE]", help="add a local GGUF file or a hub repo to the catalogue")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_hub_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    settings = hub_settings(args)
    if args.add:
        if _is_path(args.add):
            entry = add_local(args.add, user_models_file())
        else:
            repo, _, fname = args.add.partition(":")
            lister = None
            if not settings.offline:
                from huggingface_hub import HfApi

                api = HfApi(endpoint=settings.endpoint, token=settings.token or False)
                lister = api.list_repo_files
            entry = add_hub(repo, fname or None, user_models_file(), list_files=lister)
        print(f"added {entry.id}  ({entry.local_path or f'{entry.repo_id}/{entry.filename}'})")
        return 0

    rows = []
    for e in catalogue():
        path = store.model_path(e, settings)
        size = path.stat().st_size if path else e.size_bytes
        fit = check_fit(size, settings.models_dir, settings.disk_free) if size else None
        rec = store.read_record(settings.models_dir / e.id) if path and e.on_hub else None
        arch = e.architecture or (rec or {}).get("architecture") or "?"
        rows.append({
            "id": e.id, "name": e.name, "architecture": arch, "quantization": e.quantization,
            "state": "installed" if path else ("not cached (offline)" if settings.offline else "available"),
            "size_mb": round(size / 1e6, 1) if size else None, "context_length": e.context_length or (rec or {}).get("context_length"),
            "licence": e.licence, "source": e.local_path or (f"{e.repo_id}/{e.filename}" if e.repo_id else ""),
            "embedded": e.embedded, "path": str(path) if path else None,
            "fits_disk": None if path or not fit else fit.disk_ok, "fits_ram": fit.ram_ok if fit else None,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'MODEL':<32} {'ARCH':<7} {'QUANT':<7} {'SIZE':>9}  {'STATE':<22} {'RAM':<5} LICENCE")
    for r in rows:
        size = f"{r['size_mb']:,.0f} MB" if r["size_mb"] else "?"
        state = r["state"] + (" (embedded)" if r["embedded"] else "")
        if r["fits_disk"] is False:
            state += ", disk too small"
        ram = {True: "fits", False: "tight", None: "?"}[r["fits_ram"]]
        print(f"{r['id']:<32} {r['architecture']:<7} {r['quantization']:<7} {size:>9}  {state:<22} {ram:<5} {r['licence']}")
    if settings.offline:
        print("\noffline: only installed models can be used; the others need the network.")
    print("\nDownload one: python -m app download MODEL    Maps: python -m app maps MODEL")
    return 0


def _is_path(text: str) -> bool:
    from pathlib import Path

    return Path(text).exists()
