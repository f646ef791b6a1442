"""What the app writes under its user folders is readable by its owner only, even under umask 022 (issue 55,
item 3): a cache entry holds a document's tokens, a chat the document whole, a log or a map may name it."""
from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# The CLI's own code, without app.__main__ (which narrows the umask itself): each writer must be private alone.
CHAT = "import sys; from app.cli import run_cli; sys.exit(run_cli(sys.argv[1:]))"


def shared(root: Path) -> list[str]:
    """Every file or folder under `root` another user could read, write or enter."""
    return [f"{p.relative_to(root)} {stat.filemode(p.lstat().st_mode)}" for p in [root, *root.rglob("*")]
            if p.lstat().st_mode & 0o077]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_chat_about_a_document_under_umask_022_leaves_nothing_another_user_can_read(tmp_path):
    home = tmp_path / "home"
    doc = tmp_path / "memo.txt"
    doc.write_text("The passkey of the storeroom is 5820417. " + "The canteen opens at noon. " * 80)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RIDGEFILL_HOME": str(home)}
    r = subprocess.run([sys.executable, "-c", CHAT, "chat", "--doc", str(doc), "--max-tokens", "4", "What is the passkey?"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stderr
    assert [p for p in home.rglob("*") if p.parent.name == "prompts"], "the chat saved no cache entry to look at"
    assert shared(home) == []


def test_settings_chats_logs_maps_and_tuned_records_under_umask_022_are_private(tmp_path, umask_022, monkeypatch):
    from app.conversations import Conversation, ConversationStore, Message
    from app.logging_setup import PrivateRotatingFileHandler
    from app.settings import Settings
    from backend.ridgefill.activation_store import ActivationFolder
    from backend.ridgefill.map_format import write_map_folder
    from backend.user_paths import data_dir, log_dir

    home = Path(os.environ["RIDGEFILL_HOME"])
    Settings(hub_token="hf_x").save()
    ConversationStore().save(Conversation(messages=[Message("user", "private")]))
    ConversationStore(data_dir() / "deeper" / "chats").save(Conversation(messages=[Message("user", "private")]))
    handler = PrivateRotatingFileHandler(log_dir() / "ridgefill.log", maxBytes=200, backupCount=2, encoding="utf-8")
    for i in range(5):  # past maxBytes: rotated, and each new file private too
        handler.emit(logging.LogRecord("t", logging.INFO, __file__, 1, "a question about memo.txt " * 5, None, None))
    handler.close()
    assert len(list(log_dir().glob("ridgefill.log*"))) == 3
    w = {3: torch.zeros(4, 4)}
    write_map_folder(home / "cache" / "maps" / "m-s02", split=2, n_layer=4, weights=w, biases={3: torch.zeros(4)},
                     fingerprint={}, lambdas={3: 0.1}, heldout_cosine={3: 0.9}, calibration={})
    acts = ActivationFolder(home / "cache" / "activations" / "m")
    acts.write_progress({"seconds": {}})
    acts.write_part("p0", {1: torch.zeros(2, 4).numpy()}, 0, torch.arange(2).numpy())
    assert shared(home) == []
