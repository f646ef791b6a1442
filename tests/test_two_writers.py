"""Two windows, or a window and `serve`, on the same user folders (issue 55, item 2): what one writes, the
other's later write keeps."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from app.conversations import Conversation, ConversationStore, Message
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

WRITER = """
import sys, time
from pathlib import Path
from app.conversations import Conversation, ConversationStore, Message
folder, name = Path(sys.argv[1]), sys.argv[2]
store = ConversationStore(folder)
shared = store.load("shared")
(folder.parent / f"ready-{name}").touch()
while not (folder.parent / "go").exists():
    time.sleep(0.01)
for i in range(20):
    shared.messages.append(Message("user", f"{name} asks {i}"))
    store.save(shared)
    store.save(Conversation(id=f"{name}{i}", messages=[Message("user", f"{name}'s own chat {i}")]))
"""


def test_a_token_saved_by_one_window_survives_the_other_windows_later_save():
    first, second = Settings.load(), Settings.load()  # two windows, started on the same settings file
    first.hub_token = "hf_secret"
    first.generation["a.gguf"] = {"temperature": 0.5}
    first.save()
    second.compare_exact = True  # the second window quits later, having changed something else
    second.generation["b.gguf"] = {"temperature": 0.9}
    second.save()
    again = Settings.load()
    assert again.hub_token == "hf_secret" and again.compare_exact is True
    assert again.generation == {"a.gguf": {"temperature": 0.5}, "b.gguf": {"temperature": 0.9}}
    second.generation.pop("b.gguf")  # what a window removes is removed; what the other added stays
    second.hub_token = "hf_other"  # and a value it changes itself is its own latest word
    second.save()
    again = Settings.load()
    assert again.generation == {"a.gguf": {"temperature": 0.5}} and again.hub_token == "hf_other"


def test_settings_made_without_loading_write_all_their_values_and_keep_unknown_keys(tmp_path):
    Settings.path().parent.mkdir(parents=True, exist_ok=True)
    Settings.path().write_text('{"from_a_newer_version": 1, "threads": 3}')
    Settings(threads=2).save()
    data = Settings.path().read_text()
    assert '"from_a_newer_version": 1' in data and Settings.load().threads == 2


def test_two_processes_writing_the_same_and_their_own_chats_both_keep_theirs(tmp_path):
    folder = tmp_path / "chats"
    store = ConversationStore(folder)
    store.save(Conversation(id="shared", title="Shared", messages=[Message("user", "first")]))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), name], cwd=ROOT) for name in "AB"]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{n}").exists() for n in "AB"):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a writer did not start"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    convs = store.load_all()
    said = {m.content for c in convs for m in c.messages}
    for name in "AB":
        assert {f"{name} asks {i}" for i in range(20)} <= said, f"{name}'s questions were lost"
        assert {f"{name}'s own chat {i}" for i in range(20)} <= said
    assert {c.id for c in convs} >= {f"{n}{i}" for n in "AB" for i in range(20)} | {"shared"}
    assert any(c.title == "Shared (copy)" for c in convs)


def test_serve_uses_the_windows_cache_settings(tmp_path):
    """`serve` builds its engine on the cache the window chose (its location, whether prompts are saved,
    their limit), not on the defaults, so both share one cache and one limit (issue 55, item 2)."""
    from app.cli import build_parser
    from app.commands.serve import engine_settings

    args = build_parser().parse_args(["--model", "m.gguf", "serve"])
    assert engine_settings(args).cache_root is None and engine_settings(args).prompt_cache
    saved = Settings.load()
    saved.cache_location, saved.prompt_cache_gb = str(tmp_path / "elsewhere"), 3
    saved.save()
    built = engine_settings(args)
    assert built.model_path == "m.gguf" and built.cache_root == str(tmp_path / "elsewhere")
    assert built.prompt_cache and built.cache_limit_bytes == 3 * 10**9
    saved.prompt_cache_gb = 0  # the window's "no prompt cache"
    saved.save()
    assert not engine_settings(args).prompt_cache
