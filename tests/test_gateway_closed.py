"""A submit to a server gateway whose pump has stopped fails at once with a clear error: it never waits for
a pump that is gone (the server's in-flight slot would stay taken)."""
from __future__ import annotations

from app.engine_protocol import EngineSettings, TaskFailed, TaskKind
from app.server.gateway import ProcessGateway
from tests.tiny_gguf import write_tiny_gguf


def test_a_submit_after_the_gateway_stopped_fails_at_once(tmp_path):
    tiny = str(write_tiny_gguf(tmp_path / "tiny-llama.gguf", "llama", n_layer=4))
    gateway = ProcessGateway(EngineSettings(tiny, n_ctx=512, n_batch=128, n_threads=1, warm_up=False)).start()
    gateway.wait_ready(timeout=120)
    got = []
    gateway.submit(TaskKind.PING, None, got.append)
    gateway.close()
    assert got and all(m is not None for m in got)  # the one before the stop got its end (pong or a failure)
    late = []
    gateway.submit(TaskKind.PING, None, late.append)  # nothing drains the queue any more
    assert len(late) == 1 and isinstance(late[0], TaskFailed) and "stopping" in late[0].message
