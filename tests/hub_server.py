"""A small stand-in for the Hugging Face hub on 127.0.0.1, for the hub tests.

It answers the requests that huggingface_hub 2.4.0 makes, with the headers its client reads:
- HEAD/GET /{repo}/resolve/{revision}/{path}: X-Repo-Commit, ETag and X-Linked-Etag (the file's sha256,
  as the hub does for LFS files), X-Linked-Size, Content-Length, Accept-Ranges and `Range: bytes=N-`
  requests (206 + Content-Range); errors carry X-Error-Code (RepoNotFound, EntryNotFound, RevisionNotFound).
- GET /api/models/{repo}[/revision/{rev}]: the repo info (`sha` is the commit).
- GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=: the file listing with sizes and LFS sha256.
- POST /api/repos/create, /api/models/{repo}/preupload/{rev}, /api/models/{repo}/commit/{rev} (ndjson)
  and /api/validate-yaml: enough for HfApi.create_repo + upload_folder (every file "regular").

Faults for the tests: `corrupt` (serve one flipped byte under the true hash), `drop_after` (close the
connection after N bytes of a GET, a given number of times), `delay_s` (sleep between 64 KiB chunks),
`token` (writes need `Authorization: Bearer <token>`).
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 64 * 1024


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes] = field(default_factory=dict)
    commit: str = field(default_factory=lambda: uuid.uuid4().hex + uuid.uuid4().hex[:8])

    def new_commit(self) -> None:
        self.commit = uuid.uuid4().hex + uuid.uuid4().hex[:8]


class FakeHub:
    """Holds the repositories and the fault switches; `url` is the endpoint to give the client."""

    def __init__(self, token: str | None = None):
        self.repos: dict[str, Repo] = {}
        self.token = token
        self.corrupt: set[tuple[str, str]] = set()
        self.drop_after: dict[tuple[str, str], tuple[int, int]] = {}  # (repo, path) -> (bytes, times)
        self.delay_s = 0.0
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers) as received
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # --- repositories -------------------------------------------------------------------
    def add_file(self, repo_id: str, path: str, data: bytes) -> None:
        repo = self.repos.setdefault(repo_id, Repo())
        repo.files[path] = data
        repo.new_commit()

    def add_folder(self, repo_id: str, folder: Path, prefix: str = "") -> None:
        for p in sorted(Path(folder).rglob("*")):
            if p.is_file():
                rel = p.relative_to(folder).as_posix()
                self.add_file(repo_id, f"{prefix}{rel}", p.read_bytes())

    # --- life cycle ---------------------------------------------------------------------
    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects
    fake: FakeHub

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    # --- helpers -----------------------------------------------------------------------
    def _send_json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, headers: dict | None = None) -> None:
        h = dict(headers or {})
        if code:
            h["X-Error-Code"] = code
        h["X-Error-Message"] = message
        self._send_json({"error": message}, status, h)

    def _authorized(self) -> bool:
        if self.fake.token is None:
            return True
        return self.headers.get("Authorization") == f"Bearer {self.fake.token}"

    def _record(self) -> None:
        with self.fake._lock:
            self.fake.requests.append((self.command, self.path, dict(self.headers)))

    # --- verbs ---------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._record()
        self._route()

    def do_GET(self) -> None:
        self._record()
        self._route()

    def do_POST(self) -> None:
        self._record()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path
        if path == "/api/validate-yaml":
            return self._send_json({})
        if path == "/api/repos/create":
            return self._create_repo(json.loads(body or b"{}"))
        m = re.fullmatch(r"/api/models/(.+?)/(preupload|commit)/([^/]+)", path)
        if m:
            if not self._authorized():
                return self._error(401, None, "Invalid credentials in Authorization header")
            repo_id, what = m.group(1), m.group(2)
            repo = self.fake.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            if what == "preupload":
                files = json.loads(body)["files"]
                return self._send_json(
                    {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]}
                )
            return self._commit(repo_id, repo, body)
        self._error(404, None, f"no route for POST {path}")

    # --- routes --------------------------------------------------------------------------
    def _route(self) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = parse_qs(split.query)
        m = re.fullmatch(r"/api/models/(.+?)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            return self._tree(m.group(1), m.group(2), m.group(3) or "", query.get("recursive", ["False"])[0])
        m = re.fullmatch(r"/api/models/(.+?)(?:/revision/([^/]+))?", path)
        if m:
            return self._info(m.group(1), m.group(2) or "main")
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(m.group(1), m.group(2), m.group(3))
        self._error(404, None, f"no route for {self.command} {path}")

    def _repo_at(self, repo_id: str, revision: str) -> Repo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo

    def _info(self, repo_id: str, revision: str) -> None:
        repo = self._repo_at(repo_id, revision)
        if repo is None:
            return
        self._send_json(
            {
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "siblings": [{"rfilename": p} for p in sorted(repo.files)],
            }
        )

    def _tree(self, repo_id: str, revision: str, prefix: str, recursive: str) -> None:
        repo = self._repo_at(repo_id, revision)
        if repo is None:
            return
        prefix = prefix.strip("/")
        base = f"{prefix}/" if prefix else ""
        if prefix and not any(p.startswith(base) for p in repo.files):
            return self._error(404, "EntryNotFound", f"{prefix} does not exist on {revision}")
        deep = recursive.lower() == "true"
        entries, folders = [], set()
        for p, data in sorted(repo.files.items()):
            if not p.startswith(base):
                continue
            rest = p[len(base):]
            if "/" in rest:
                parts = rest.split("/")
                for i in range(1, len(parts) if deep else 2):
                    folders.add(base + "/".join(parts[:i]))
                if not deep:
                    continue
            sha = hashlib.sha256(data).hexdigest()
            entries.append(
                {"type": "file", "oid": _git_sha1(data), "size": len(data), "path": p,
                 "lfs": {"oid": sha, "size": len(data), "pointerSize": 134}}
            )
        dirs = [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "path": f} for f in sorted(folders)]
        self._send_json(dirs + entries)

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
        if revision not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        data = repo.files.get(path)
        commit_header = {"X-Repo-Commit": repo.commit}
        if data is None:
            return self._error(404, "EntryNotFound", f"Entry not found: {path}", commit_header)
        sha = hashlib.sha256(data).hexdigest()
        key = (repo_id, path)
        if key in self.fake.corrupt:  # same headers, one flipped byte in the body
            body = bytearray(data)
            body[len(body) // 2] ^= 0xFF
            data = bytes(body)
        size = len(data)
        start = 0
        rng = self.headers.get("Range")
        if rng and self.command == "GET":
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m:
                start = int(m.group(1))
        status = 206 if start else 200
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{sha}"')
        self.send_header("X-Linked-Etag", f'"{sha}"')
        self.send_header("X-Linked-Size", str(size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        drop_at = None
        with self.fake._lock:
            rule = self.fake.drop_after.get(key)
            if rule and rule[1] > 0:
                drop_at = rule[0]
                self.fake.drop_after[key] = (rule[0], rule[1] - 1)
        pos = start
        try:
            while pos < size:
                end = min(size, pos + CHUNK)
                if drop_at is not None and end > drop_at:
                    end = max(pos, drop_at)
                    self.wfile.write(data[pos:end])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)  # the peer sees a body cut short
                    return
                self.wfile.write(data[pos:end])
                pos = end
                if self.fake.delay_s:
                    self.wfile.flush()
                    time.sleep(self.fake.delay_s)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _create_repo(self, payload: dict) -> None:
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        if repo_id in self.fake.repos:
            return self._error(409, None, "You already created this model repo")
        self.fake.repos[repo_id] = Repo()
        self._send_json({"url": f"{self.fake.url}/{repo_id}", "name": repo_id})

    def _commit(self, repo_id: str, repo: Repo, body: bytes) -> None:
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            value = item.get("value", {})
            if item["key"] == "file":
                repo.files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "deletedFile":
                repo.files.pop(value["path"], None)
            elif item["key"] == "lfsFile":
                return self._error(400, None, "this test hub takes regular uploads only")
        repo.new_commit()
        self._send_json(
            {"commitUrl": f"{self.fake.url}/{repo_id}/commit/{repo.commit}", "commitOid": repo.commit, "pullRequestUrl": None}
        )
