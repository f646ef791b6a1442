"""The servers a person added ("Add a server…"), kept in servers.json in the user config dir, mode 0600
(it holds their API keys), beside settings.json. An address never keeps `user:pass@`: it is shown in every
answer's line and stored with each chat, so its password goes to `api_key` (the key's one place) instead."""
from __future__ import annotations

import json
import logging
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

from app.remote_wire import split_credentials
from backend import user_paths
from backend.config_lock import config_lock, lock_path
from backend.json_file import read_object, read_object_and_bytes, repair, write_private
from backend.private_files import tighten

FILE_NAME = "servers.json"
WHAT = "the servers file"
log = logging.getLogger(__name__)


@dataclass
class RemoteServer:
    url: str  # the API's base, ending in /v1 (app/remote_engine.api_base)
    model: str
    api_key: str = ""
    ours: bool = False  # this app's `serve`: RidgeFill controls and sources
    n_layer: int = 0  # this app's server: its model's layers and default split and tail (0: not known)
    default_split: int = 0
    default_tail: int = 0

    @property
    def label(self) -> str:
        return f"{self.model} at {self.url.removesuffix('/v1')}"


def servers_path() -> Path:
    return user_paths.config_dir() / FILE_NAME


def load_servers() -> list[RemoteServer]:
    """The saved servers. A file that is not a JSON object is set aside as servers.json.bad-<time>; one with an
    entry or a value of the wrong shape is kept so and rewritten with what was right (a wrong value: its default;
    an entry without an address and a model: left out); the user is told (backend/json_file.tell)."""
    path = servers_path()
    tighten(path.parent, path, lock_path(path))
    servers, wrong = _servers_in(read_object(path, WHAT) or {})
    if wrong:
        with config_lock(path):  # read again: another process may have written it meanwhile
            data, raw = read_object_and_bytes(path, WHAT)
            servers, wrong = _servers_in(data or {})
            if wrong and raw is not None:
                repair(path, raw, _text(servers), WHAT, wrong)
    return servers


def _servers_in(data: dict) -> tuple[list[RemoteServer], str]:
    """The servers `data` holds, and what was wrong in it ("" when nothing was)."""
    entries = data.get("servers", [])
    if not isinstance(entries, list):  # {"servers": 1}, a string, a map: no server is read from it
        return [], '"servers" that is not a list'
    out, wrong = [], 0
    for entry in entries:
        if not (isinstance(entry, dict) and isinstance(entry.get("url"), str) and isinstance(entry.get("model"), str)):
            wrong += 1
            continue
        given = {k: entry.get(k, d) for k, d in SERVER_DEFAULTS.items()}
        right = {k: v if _fits(k, v) else SERVER_DEFAULTS[k] for k, v in given.items()}
        wrong += right != given
        out.append(without_credentials(RemoteServer(entry["url"], entry["model"], **right)))
    return out, f"{wrong} server entries of the wrong shape" if wrong else ""


def without_credentials(server: RemoteServer) -> RemoteServer:
    """`server` with any `user:pass@` taken out of its address (the password kept as its key if it had none)."""
    try:
        url, key = split_credentials(server.url)
    except ValueError:  # an address that does not parse: its first use says so
        return server
    return replace(server, url=url, api_key=server.api_key or key)


_LAYOUT = ("n_layer", "default_split", "default_tail")
SERVER_DEFAULTS = {f.name: f.default for f in fields(RemoteServer) if f.default is not MISSING}


def _count(value) -> int:
    """A count from the file: a non-negative int below a million, else 0 (not known)."""
    return value if type(value) is int and 0 <= value < 1_000_000 else 0


def _fits(key: str, value) -> bool:
    """`value` is right for entry field `key` (of those with a default)."""
    if key in _LAYOUT:
        return type(value) is int and _count(value) == value
    return type(value) is type(SERVER_DEFAULTS[key])


def layout_from_meta(meta: dict) -> dict:
    """The layers and defaults this app's server reports in /v1/models (app/server/schema.model_card)."""
    return {k: _count(meta.get(k)) for k in _LAYOUT}


def save_servers(servers: list[RemoteServer]) -> None:
    with config_lock(servers_path()):
        write_private(servers_path(), _text(servers))


def _text(servers: list[RemoteServer]) -> str:
    return json.dumps({"servers": [asdict(without_credentials(s)) for s in servers]}, indent=2)


def add_server(server: RemoteServer) -> list[RemoteServer]:
    """Saved with the others; the same URL and model replaces the old entry (a new key). Read, changed and
    written under the file's lock: a server another window added meanwhile is kept."""
    with config_lock(servers_path()):
        servers = _others(server) + [server]
        save_servers(servers)
    return servers


def remove_server(server: RemoteServer) -> list[RemoteServer]:
    """The saved servers without `server` (its URL and model), saved (under the lock, as add_server)."""
    with config_lock(servers_path()):
        servers = _others(server)
        save_servers(servers)
    return servers


def _others(server: RemoteServer) -> list[RemoteServer]:
    """The saved servers but the one at `server`'s URL with its model."""
    return [s for s in load_servers() if (s.url, s.model) != (server.url, server.model)]
