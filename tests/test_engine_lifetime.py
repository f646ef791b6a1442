"""The engine child ends with the app that started it, whatever ends the app, and so does the resource
tracker multiprocessing starts beside it: real processes, found through /proc (Linux)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")

ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 5.0


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...); None once it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (waiting for a reaper that may never come in a container) is gone."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> dict[int, str]:
    """pid -> command line of every living child of `pid`."""
    found = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and int(fields[1]) == pid and alive(int(entry.name)):
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                pass
    return found


def engine_and_tracker(pid: int) -> tuple[int, int]:
    kids = children(pid)
    engine = [p for p, cmd in kids.items() if "spawn_main" in cmd]
    tracker = [p for p, cmd in kids.items() if "resource_tracker" in cmd]
    assert len(engine) == 1 and len(tracker) == 1, kids
    return engine[0], tracker[0]


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def end(*procs) -> None:
    """Kill what a failed test left running (each of these processes was started by this test)."""
    for p in procs:
        if isinstance(p, subprocess.Popen):
            if p.poll() is None:
                p.kill()
                p.wait(10)
        elif p and alive(p):
            os.kill(p, signal.SIGKILL)


def env(tmp_path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RIDGEFILL_HOME": str(tmp_path / "home")}


def test_a_server_stopped_with_sigterm_shuts_down_as_on_ctrl_c_and_leaves_no_process(tmp_path):
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as fo, err.open("w") as fe:
        server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", "0", "--ctx", "2048"],
                                  cwd=ROOT, env=env(tmp_path), stdout=fo, stderr=fe)
    found = ()
    try:
        wait_for(lambda: "Serving" in out.read_text() or server.poll() is not None, 180, "the server")
        assert server.poll() is None, err.read_text()
        engine, tracker = found = engine_and_tracker(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 130, err.read_text()  # what Ctrl-C gives
        assert err.read_text().strip().endswith("interrupted")
        wait_for(lambda: not alive(engine) and not alive(tracker), GONE_WITHIN_S, "the engine and its tracker")
    finally:
        end(server, *found)


PARENT = textwrap.dedent("""
    import sys, time
    from app.engine_process import EngineProcess
    from app.engine_protocol import EngineSettings, EngineStarted

    proc = EngineProcess(EngineSettings(sys.argv[1], n_ctx=512, n_threads=1, warm_up=False))
    proc.start()
    while not any(isinstance(m, EngineStarted) for m in proc.poll()):
        time.sleep(0.02)
    print(proc.pid, flush=True)
    time.sleep(600)
""")


def test_the_engine_child_ends_when_its_parent_is_killed(tmp_path, model_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, model_path], cwd=ROOT, env=env(tmp_path),
                              stdout=subprocess.PIPE, text=True)
    found = ()
    try:
        assert select.select([parent.stdout], [], [], 180)[0], "the parent did not report its engine child"
        pid = int(parent.stdout.readline() or 0)
        assert pid and alive(pid), "the parent did not report its engine child"
        engine, tracker = found = engine_and_tracker(parent.pid)
        assert engine == pid
        parent.kill()  # SIGKILL: no handler, no atexit, nothing of the parent runs
        parent.wait(10)
        wait_for(lambda: not alive(engine) and not alive(tracker), GONE_WITHIN_S, "the engine and its tracker")
    finally:
        end(parent, *found)


def test_shutdown_returns_once_the_queues_let_go_of_their_locks(tmp_path, model_path, monkeypatch):
    """Released last by a queue's daemon feeder thread, a lock's cleanup can be cut by the exit halfway
    (unlinked, the tracker not told) and the tracker warns at exit (seen in CI after "interrupted")."""
    from app.engine_process import EngineProcess
    from app.engine_protocol import EngineSettings, EngineStarted, TaskKind

    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path / "home"))
    proc = EngineProcess(EngineSettings(model_path, n_ctx=512, n_threads=1, warm_up=False))
    try:
        proc.start()
        wait_for(lambda: any(isinstance(m, EngineStarted) for m in proc.poll()), 180, "the engine")
        proc.submit(TaskKind.PING)
        queues = (proc._tasks, proc._events, proc._cancels)
        proc.shutdown()
        assert not [q for q in queues if getattr(q, "_thread", None) is not None and q._thread.is_alive()]
    finally:
        proc.shutdown()
