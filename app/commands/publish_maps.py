"""`python -m app publish-maps FOLDER REPO`: upload a map folder to the hub as REPO/split-<S>/.

Checks the folder first (manifest, every listed file present with its sha256, README.md not listed),
then HfApi.create_repo + upload_folder; a README.md describing the set goes to the repo root.
"""
from __future__ import annotations

from pathlib import Path

from app.commands.download import add_hub_options, hub_settings


def register(sub) -> None:
    p = sub.add_parser("publish-maps", help="upload a RidgeFill map folder to a hub repo (REPO/split-<S>/)")
    p.add_argument("folder", metavar="FOLDER", help="a map folder (ridgefill.json + safetensors)")
    p.add_argument("repo", metavar="REPO", help="hub repo id, e.g. OWNER/ridgefill-maps-<model id>")
    p.add_argument("--private", action="store_true", help="create the repo as private")
    add_hub_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.hub.maps_hub import publish_maps

    url = publish_maps(Path(args.folder), args.repo, hub_settings(args), private=args.private)
    print(url)
    return 0
