"""The prompt's length, counted by the engine as the question is typed, shown before it is sent; a prompt
too long for the context keeps Send off and says why.

A mixin of ChatPanel (ui/chat_panel.py), which owns the conversation, the input and the count label.
"""
from __future__ import annotations

from PySide6.QtCore import Slot

from app.engine_client import TaskHandle
from app.engine_protocol import CountRequest, CountResult, TaskKind


class ChatCount:
    @Slot()
    def request_count(self) -> None:
        """Ask the engine how many tokens the next request would have (shown before sending)."""
        if self.remote is not None:  # the server's model counts its own tokens: a prompt too long gets its error
            self.count_label.setStyleSheet("")
            self.count_label.setText(f"Answers come from {self.remote.name}; it checks the prompt's length.")
            self.too_long = ""
            if self._task_count is not None:  # a count by this machine's model, asked before: not this one's
                self._task_count.cancel()
                self._task_count = None
            return self._update_buttons()
        if self.loading or not self.conv.documents and not self.input.toPlainText().strip() and not self.conv.messages:
            self.count_label.setText("")
            self.too_long = ""
            return self._update_buttons()
        question = self.input.toPlainText().strip() or "?"
        if self._task_count is not None:
            self._task_count.cancel()  # stale: a count still queued never runs
        # The documents go apart from the turns: framing a large one copies its text (seconds at 300 MB).
        asked = CountRequest(self.build_request(question, frame_documents=False), documents_apart=True)
        h = self.service.submit(TaskKind.COUNT, asked, owner=self,
                                on_done=lambda res: self._count_over(h, res),
                                on_failed=lambda _type, _msg: self._count_over(h, None),
                                on_cancelled=lambda _msg: self._count_over(h, None))
        self._task_count = h

    def _count_over(self, h: TaskHandle, res: CountResult | None) -> None:
        if h is self._task_count:
            self._task_count = None
            if res is not None:
                self._show_count(res)

    def _show_count(self, c: CountResult) -> None:
        self.last_count = c
        usable = c.n_ctx - c.reserve
        if c.fits:
            self.too_long = ""
            self.count_label.setStyleSheet("")
            self.count_label.setText(f"Prompt: {c.prompt_tokens:,} tokens of {usable:,} available "
                                     f"(context {c.n_ctx:,}, {c.reserve:,} kept for the answer)")
        else:
            self.too_long = c.message
            self.count_label.setStyleSheet("color: #c62828")
            self.count_label.setText(f"Too long: {c.prompt_tokens:,} tokens, the limit is {usable:,}. {c.message}")
        self._update_buttons()
