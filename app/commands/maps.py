"""`python -m app maps MODEL`: the map sets of a model: on disk (verified or not), on the hub, and how to get one.

Hub convention: <owner>/ridgefill-maps-<model id>, one folder split-<S>/ per split (ridgefill.json +
safetensors); owner "ridgefill" unless --maps-owner says otherwise. README.md is never in a manifest.
"""
from __future__ import annotations

import sys

from app.commands.download import add_hub_options, chosen_model
from backend.hub.errors import describe_error


def register(sub) -> None:
    p = sub.add_parser("maps", help="list a model's RidgeFill map sets (local and on the hub)",
                       description=__doc__.split("\n", 1)[1])
    p.add_argument("name", metavar="MODEL", help="a catalogue id (see `models`)")
    add_hub_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.hub.maps_hub import fit_hint, local_map_sets, maps_repo_id, published_splits
    from backend.model_file import read_model_info
    from backend.ridgefill.defaults import default_split

    settings, entry, path = chosen_model(args)
    repo = maps_repo_id(entry, settings.maps_owner)
    print(f"model        {entry.id} ({'installed' if path else 'not installed'})")
    print(f"hub repo     {repo}  (folders split-<S>/)")
    split = None
    if path:
        split = default_split(read_model_info(path))
        print(f"default      split {split}")
        local = local_map_sets(path, settings)
        for s, verdict in sorted(local.items()):
            note = f"  warning: {'; '.join(verdict.reasons)}" if verdict.status == "warning" else ""
            print(f"local        split {s}: {verdict.status}  {verdict.folder}{note}")
        if not local:
            print("local        none")
    if settings.offline:
        print("hub          not checked (offline)")
    else:
        try:
            splits = published_splits(entry, settings)
            print(f"hub          {'splits ' + ', '.join(map(str, splits)) if splits else 'none published'}")
        except Exception as exc:  # the listing is advice: report and go on
            print(f"hub          unreachable: {describe_error(exc, repo)}", file=sys.stderr)
    print(f"\nDownload: python -m app download-maps {entry.id} [--split S]\n{fit_hint(entry, split, path)}")
    return 0
