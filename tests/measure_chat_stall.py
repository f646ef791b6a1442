"""The GUI event loop's longest stall while a chat with a large document streams an answer (issue 65, item 2),
is sent a question (--what send: compare with exact on), or is opened from the data folder (--what open).

A fake engine gives the chat panel TokenEvents as the engine child's events do (the engine is not what is
measured); a QTimer every 10 ms records the gaps between its ticks while the answer streams and ends, from
the click on Send to its requests handed to the engine, or from the click on a chat to its text shown.

    QT_QPA_PLATFORM=offscreen python -m tests.measure_chat_stall --mb 300 --seconds 4
    QT_QPA_PLATFORM=offscreen python -m tests.measure_chat_stall --mb 300 --what send
    QT_QPA_PLATFORM=offscreen python -m tests.measure_chat_stall --mb 300 --what open
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QApplication

from app.conversations import Conversation, ConversationStore, Document
from app.engine_protocol import TaskKind
from backend.protocol import CompletionResult, Timings, TokenEvent

TICK_MS = 10
SENTENCE = "The daily limit is 500 requests per key, and a key resets at midnight UTC. "


class FakeHandle:
    def __init__(self, kind, callbacks):
        self.kind, self.callbacks, self.cancelled = kind, callbacks, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeEngine(QObject):
    """What ChatPanel asks of an engine client: submit() with callbacks, and the two signals it connects."""
    ready = Signal(object)
    document_changed = Signal(object)

    def __init__(self):
        super().__init__()
        self.answers: list[FakeHandle] = []

    def submit(self, kind, payload=None, *, owner=None, **callbacks) -> FakeHandle:
        h = FakeHandle(kind, callbacks)
        if kind == TaskKind.COMPLETE:
            self.answers.append(h)
        return h  # a count is never answered: the panel shows no count, which is not measured


def stream_answer(panel, engine: FakeEngine, tokens: int, every_ms: int, on_last=lambda: None,
                  seconds: float = float("inf")) -> None:
    """Feed up to `tokens` TokenEvents to the panel's answer, one every `every_ms`, for at most `seconds` (a
    stalled loop gets fewer), then (on_last() first) its result."""
    h = engine.answers[-1]
    sent, until = [], time.perf_counter() + seconds

    def next_token():
        if len(sent) < tokens and time.perf_counter() < until:
            piece = f" word{len(sent)}"
            sent.append(piece)
            h.callbacks["on_event"](TokenEvent(len(sent), piece))
        else:
            feeder.stop()
            on_last()
            h.callbacks["on_done"](CompletionResult("".join(sent), "stop", Timings(), 0))

    feeder = QTimer()
    feeder.setInterval(every_ms)
    feeder.timeout.connect(next_token)
    feeder.start()
    stream_answer.feeder = feeder  # kept alive while it runs


def measure(panel, engine: FakeEngine, question: str, tokens: int = 300, every_ms: int = 10,
            seconds: float = float("inf")) -> tuple[list[float], list[float]]:
    """The gaps (ms) between the ticks of a TICK_MS timer while the answer streams (from the question sent
    to its last token), and from then to the answer's end (its result shown, the next prompt counted)."""
    streaming, finish, last = [], [], [time.perf_counter()]
    gaps = streaming

    def tick():
        now = time.perf_counter()
        gaps.append((now - last[0]) * 1000)
        last[0] = now

    def on_last():
        nonlocal gaps
        tick()
        gaps = finish

    app = QApplication.instance()
    settled = time.perf_counter() + 0.5
    while time.perf_counter() < settled:  # the panel shown and laid out first: its first paint is not measured
        app.processEvents()
        time.sleep(0.005)
    ticker = QTimer()
    ticker.setInterval(TICK_MS)
    ticker.timeout.connect(tick)
    panel.input.setPlainText(question)
    panel._count_timer.stop()  # the question typed a while before: its count is done (not measured)
    assert panel.send()
    last[0] = time.perf_counter()
    ticker.start()
    stream_answer(panel, engine, tokens, every_ms, on_last, seconds)
    while panel.busy():
        app.processEvents()
        time.sleep(0.001)
    tick()
    ticker.stop()
    return streaming, finish


def ticks_during(start, done, after_s: float = 0.3) -> list[float]:
    """The gaps (ms) between a TICK_MS timer's ticks from `start()` (run by the loop, as a click is) until
    `done()` is true, and `after_s` more (what the loop does next: the news taken in)."""
    app = QApplication.instance()
    gaps, last = [], [time.perf_counter()]

    def tick():
        now = time.perf_counter()
        gaps.append((now - last[0]) * 1000)
        last[0] = now

    ticker = QTimer()
    ticker.setInterval(TICK_MS)
    ticker.timeout.connect(tick)
    ticker.start()
    QTimer.singleShot(TICK_MS // 2, start)
    last[0] = time.perf_counter()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2 or not done():
        app.processEvents()
        time.sleep(0.001)
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < after_s:
        app.processEvents()
        time.sleep(0.001)
    tick()
    ticker.stop()
    return gaps


def measure_send(panel, engine: FakeEngine, question: str) -> list[float]:
    """The gaps while Send builds the question's requests (an answer and, compare with exact on, its exact
    run) and hands them to the engine."""
    panel.controls.compare.setEnabled(True)
    panel.controls.compare.setChecked(True)
    panel.input.setPlainText(question)
    panel._count_timer.stop()
    asked = len(engine.answers)
    return ticks_during(panel.send, lambda: len(engine.answers) >= asked + 2)


def measure_open(panel, store: ConversationStore, conv_id: str) -> list[float]:
    """The gaps from the click on a saved chat to its document's text shown (and the count asked)."""
    if hasattr(panel, "open_conversation"):
        return ticks_during(lambda: panel.open_conversation([conv_id]),
                            lambda: not panel.reading() and panel.conv.id == conv_id and not panel.loading)
    return ticks_during(lambda: panel.load_conversation(store.load(conv_id)),  # before: read on the GUI thread
                        lambda: panel.conv.id == conv_id)


def settle(panel, seconds: float = 0.5, until=lambda: True) -> None:
    """The panel shown and laid out, and `until()` (the writes done), before anything is measured."""
    app = QApplication.instance()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or (not until() and time.perf_counter() - t0 < 60):
        app.processEvents()
        time.sleep(0.005)


def report(what: str, gaps: list[float]) -> str:
    gaps = sorted(gaps)
    return (f"{what}: {len(gaps)} ticks, longest stall {gaps[-1]:.0f} ms, "
            f"median {gaps[len(gaps) // 2]:.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=300, help="the document's size in MB (generated text)")
    p.add_argument("--tokens", type=int, default=1000, help="at most this many tokens, one every 10 ms")
    p.add_argument("--seconds", type=float, default=4, help="the answer streams this long (or to its last token)")
    p.add_argument("--what", choices=("stream", "send", "open"), default="stream",
                   help="stream: an answer streams and ends; send: the question's Send; open: a saved chat opened")
    args = p.parse_args()
    app = QApplication.instance() or QApplication([])
    from ui.chat_panel import ChatPanel
    from ui.controls import RidgeFillControls
    from ui.ttft_chart import TtftChart

    text = SENTENCE * int(args.mb * 1e6 / len(SENTENCE))
    with tempfile.TemporaryDirectory() as tmp:
        store = ConversationStore(Path(tmp) / "chats")
        engine = FakeEngine()
        panel = ChatPanel(engine, store, RidgeFillControls(), TtftChart())
        panel.resize(900, 700)
        panel.show()
        conv = Conversation(title="big", documents=[Document("big.txt", text)])
        if args.what == "open":
            store.save(conv)  # on disk, as a chat saved before; a new chat shown
            settle(panel)
            print(f"document {len(text) / 1e6:.0f} MB, " + report("opening the chat",
                                                                  measure_open(panel, store, conv.id)))
            return panel.shutdown()
        panel.load_conversation(conv)
        panel.save()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 30 and getattr(panel, "saves_pending", lambda: False)():
            app.processEvents()  # the document's first write, before the measurement
        if args.what == "send":
            settle(panel)
            print(f"document {len(text) / 1e6:.0f} MB, " + report(
                "Send (compare with exact on)", measure_send(panel, engine, "What is the daily limit?")))
            return panel.shutdown()
        streaming, finish = measure(panel, engine, "What is the daily limit?", tokens=args.tokens,
                                    seconds=args.seconds)
        panel.shutdown()
    gaps = sorted(streaming)
    print(f"document {len(text) / 1e6:.0f} MB, {panel.conv.messages[-1].content.count(' ')} tokens, "
          f"{len(gaps)} ticks while it streams: "
          f"longest stall {gaps[-1]:.0f} ms, 99th percentile {gaps[int(len(gaps) * 0.99)]:.0f} ms, "
          f"median {gaps[len(gaps) // 2]:.0f} ms; the answer's end: longest stall {max(finish):.0f} ms")


if __name__ == "__main__":
    main()
