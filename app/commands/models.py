"""`python -m app models`: the catalogue with installed/available state, size, fit and maps."""
from __future__ import annotations

import json

from app.commands.download import add_hub_options, catalogue, hub_settings
from backend.hub.catalogue import add_hub, add_local, user_models_file
from backend.hub.recommend import recommended_model
from backend.hub.status import model_rows


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

    entries = catalogue()
    rows = model_rows(entries, settings)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'MODEL':<32} {'ARCH':<7} {'QUANT':<7} {'SIZE':>9} {'CONTEXT':>7}  {'STATE':<22} {'RAM':<5} LICENCE")
    for r in rows:
        size = f"{r['size_mb']:,.0f} MB" if r["size_mb"] else "?"
        state = r["state"] + (" (embedded)" if r["embedded"] else "")
        if r["fits_disk"] is False:
            state += ", disk too small"
        ctx = f"{r['context_length'] // 1024}K" if r.get("context_length") else "?"
        ram = {True: "fits", False: "tight", None: "?"}[r["fits_ram"]]
        print(f"{r['id']:<32} {r['architecture']:<7} {r['quantization']:<7} {size:>9} {ctx:>7}  {state:<22} {ram:<5} {r['licence']}")
    if settings.offline:
        print("\noffline: only installed models can be used; the others need the network.")
    print("\nDownload one: python -m app download MODEL    Maps: python -m app maps MODEL")
    offer = recommended_model(entries, rows)
    if offer is not None:  # the embedded models are for trying the app
        print(f"For documents on this machine: {offer.id} ({offer.name}, {offer.context_length // 1024}K context): "
              f"python -m app download {offer.id}")
    return 0


def _is_path(text: str) -> bool:
    from pathlib import Path

    return Path(text).exists()
