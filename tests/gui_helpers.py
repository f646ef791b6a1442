"""Shared set-up for the GUI tests: one engine process per test module, windows that share it."""
from __future__ import annotations

import time

from app.engine_client import EngineClient
from app.engine_protocol import EngineSettings

# One thread: the test machine is small and shared, and a spinning second thread only slows it down.
def start_service(model_path: str, n_ctx: int = 2048, n_batch: int = 128, warm_up: bool = False) -> EngineClient:
    service = EngineClient(EngineSettings(model_path=model_path, n_ctx=n_ctx, n_threads=1, n_batch=n_batch,
                                           warm_up=warm_up))
    service.start()
    return service


def wait_ready(qtbot, service: EngineClient, timeout_s: float = 240) -> None:
    qtbot.waitUntil(lambda: service.info is not None, timeout=int(timeout_s * 1000))


def make_window(qtbot, service, *, max_tokens: int = 8, store=None, read: bool = True, **settings):
    """A window on `service`; `read`: once the chats are listed and the latest is open (both are read off the
    GUI thread, ui/chat_loading.py), as a person sees it a moment after the start."""
    from app.conversations import ConversationStore
    from app.settings import Settings
    from ui.main_window import MainWindow

    s = Settings(max_tokens=max_tokens, **settings)
    w = MainWindow(s, service, store or ConversationStore(), owns_service=False)
    qtbot.addWidget(w)
    w.show()
    if read:
        qtbot.waitUntil(lambda: not w.chat.reading(), timeout=30_000)
    return w


def wait_idle(qtbot, window, timeout_s: float = 120) -> None:
    qtbot.waitUntil(lambda: not window.chat.busy(), timeout=int(timeout_s * 1000))


def wait_count(qtbot, window, timeout_s: float = 60) -> None:
    t0 = time.monotonic()
    qtbot.waitUntil(lambda: window.chat._task_count is None and window.chat.last_count is not None,
                    timeout=int(timeout_s * 1000))
    return time.monotonic() - t0


def attach(qtbot, window, *paths, timeout_s: float = 60) -> bool:
    """Attach `paths` as the file dialog or a drop does and wait for their reading (on a worker thread) to end;
    True when one or more documents were attached."""
    with qtbot.waitSignal(window.chat.documents_read, timeout=int(timeout_s * 1000)) as read:
        assert window.chat.attach_documents(paths), "the reading did not start"
    return read.args[0]
