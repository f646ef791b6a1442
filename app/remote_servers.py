"""The servers a person added ("Add a server…"), kept in servers.json in the user config dir, mode 0600
(it holds their API keys), beside settings.json. An address never keeps `user:pass@`: it is shown in every
answer's line and stored with each chat, so its password goes to `api_key` (the key's one place) instead."""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from app.remote_wire import split_credentials
from backend import user_paths
from backend.json_file import read_object, write_private

FILE_NAME = "servers.json"
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
    """The saved servers; an entry of the wrong shape is left out (the file itself is kept)."""
    data = read_object(servers_path(), "the servers file") or {}
    entries = data.get("servers")
    if not isinstance(entries, list):  # {"servers": 1}, a string, a map: no server is read from it
        if entries is not None:
            log.warning("the servers file's \"servers\" is not a list; no saved server is read from it")
        entries = []
    out = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("url"), str) and isinstance(entry.get("model"), str):
            out.append(without_credentials(RemoteServer(
                entry["url"], entry["model"], str(entry.get("api_key") or ""), bool(entry.get("ours")),
                *(_count(entry.get(k)) for k in _LAYOUT))))
    return out


def without_credentials(server: RemoteServer) -> RemoteServer:
    """`server` with any `user:pass@` taken out of its address (the password kept as its key if it had none)."""
    try:
        url, key = split_credentials(server.url)
    except ValueError:  # an address that does not parse: its first use says so
        return server
    return replace(server, url=url, api_key=server.api_key or key)


_LAYOUT = ("n_layer", "default_split", "default_tail")


def _count(value) -> int:
    """A count from the file: a non-negative int below a million, else 0 (not known)."""
    return value if type(value) is int and 0 <= value < 1_000_000 else 0


def layout_from_meta(meta: dict) -> dict:
    """The layers and defaults this app's server reports in /v1/models (app/server/schema.model_card)."""
    return {k: _count(meta.get(k)) for k in _LAYOUT}


def save_servers(servers: list[RemoteServer]) -> None:
    entries = [asdict(without_credentials(s)) for s in servers]
    write_private(servers_path(), json.dumps({"servers": entries}, indent=2))


def add_server(server: RemoteServer) -> list[RemoteServer]:
    """Saved with the others; the same URL and model replaces the old entry (a new key)."""
    servers = _others(server) + [server]
    save_servers(servers)
    return servers


def remove_server(server: RemoteServer) -> list[RemoteServer]:
    """The saved servers without `server` (its URL and model), saved."""
    servers = _others(server)
    save_servers(servers)
    return servers


def _others(server: RemoteServer) -> list[RemoteServer]:
    """The saved servers but the one at `server`'s URL with its model."""
    return [s for s in load_servers() if (s.url, s.model) != (server.url, server.model)]
