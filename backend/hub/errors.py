"""Typed errors of the hub code, and `describe_error` for the errors huggingface_hub and httpx raise.

Each message says what happened and what the user can do.
"""
from __future__ import annotations

import httpx2
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from backend.errors import Cancelled, RidgeFillError


class HubError(RidgeFillError):
    """A download, upload or catalogue operation that failed; the message is the reason."""


class UnknownModel(HubError):
    pass


class NotCachedOffline(HubError):
    """Offline mode, and the thing asked for is not in the cache."""


class NotEnoughDisk(HubError):
    def __init__(self, needed: int, free: int, where: str):
        self.needed, self.free, self.where = needed, free, where
        super().__init__(
            f"Not enough disk space: the download needs {needed / 1e6:,.1f} MB but {where} has "
            f"{free / 1e6:,.1f} MB free. Free some space or move the cache (RIDGEFILL_CACHE_DIR)."
        )


class VerificationFailed(HubError):
    pass


class MapsNotPublished(HubError):
    """No map set for this model/split on the hub: fit one locally instead."""


class DownloadCancelled(Cancelled):
    """The user cancelled a download; nothing partial was kept as ready."""


def describe_error(exc: BaseException, what: str) -> str:
    """One line a user can act on, for the errors huggingface_hub and httpx raise."""
    if isinstance(exc, GatedRepoError):
        return f"{what} is gated: accept its licence on the hub and set a token (--token)."
    if isinstance(exc, RepositoryNotFoundError):
        return f"{what} was not found on the hub (or it is private: set a token with --token)."
    if isinstance(exc, RevisionNotFoundError):
        return f"{what}: that revision does not exist on the hub."
    if isinstance(exc, EntryNotFoundError):
        return f"{what}: the file is not in the repo."
    if isinstance(exc, LocalEntryNotFoundError):
        return f"{what}: the hub could not be reached and the file is not cached. Check the connection or the endpoint."
    if isinstance(exc, HfHubHTTPError):
        return f"{what}: the hub answered an error ({exc})."
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException)):
        return f"{what}: cannot reach the hub ({type(exc).__name__}). Check the connection or the endpoint."
    if isinstance(exc, httpx2.HTTPError):
        return f"{what}: the connection failed ({type(exc).__name__}: {exc}). Try again; the download restarts cleanly."
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return f"{what}: the connection ended before the whole file arrived. Try again; the download restarts cleanly."
    if isinstance(exc, OSError):
        return f"{what}: {exc.strerror or exc}."
    return f"{what}: {type(exc).__name__}: {exc}"
