"""SVG snapshots of edge-chat's main screen and settings. After an intended change to the look, update them with

    .venv/bin/python -m pytest tests/tui/test_tui_snapshots.py --snapshot-update

and review the SVGs under tests/tui/__snapshots__/ before committing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge.tui.app import EdgeChatApp
from edge.tui.history import Conversation, ConversationStore
from edge.tui.loader import SessionLoader
from edge.tui.settings import ChatSettings
from edge.tui.widgets.prompt import PromptInput

pytestmark = pytest.mark.slow

REPLY = (
    "Use `reversed` or a slice:\n\n```python\ndef reverse(items):\n    return items[::-1]\n```\n\n"
    "Both leave the original list unchanged."
)
CONVERSATION = Conversation(
    id="snapshot", title="reverse a list", created=0.0, updated=0.0, model="tiny-model",
    messages=[
        {"role": "user", "content": "How do I reverse a list?"},
        {"role": "assistant", "content": REPLY, "finish_reason": "eos", "provenance": [[20, 0], [30, 1], [59, 0]],
         "stats": {"tokens": 41, "tokens_per_s": 180.5, "mean_accepted_tokens": 2.73, "acceptance_rate": 0.61,
                   "drafter": "ngram", "at": 0.0}},
    ],
)


@pytest.fixture
def snapshot_app(llama_dir, tmp_path):
    model = tmp_path / "tiny-model"  # the folder name is shown in the header
    shutil.copytree(llama_dir, model)
    store = ConversationStore(tmp_path / "data")
    path = store.save(CONVERSATION)
    loader = SessionLoader(model, ChatSettings(drafter="ngram"), store, measure_baseline=False)
    return EdgeChatApp(loader, memory_probe=lambda: 300 * 2**20), path


async def _open_saved_chat(pilot, path: Path) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.app.screen._open_chat(path)
    pilot.app.screen.query_one(PromptInput).cursor_blink = False  # the cursor drawn always, not by the clock
    await pilot.pause()


def test_main_screen(snap_compare, snapshot_app):
    app, path = snapshot_app
    assert snap_compare(app, terminal_size=(80, 24), run_before=lambda pilot: _open_saved_chat(pilot, path))


def open_saved_chat_then(path: Path, key: str):
    """A run_before that opens the saved chat, then presses `key`."""
    async def run_before(pilot) -> None:
        await _open_saved_chat(pilot, path)
        await pilot.press(key)
        await pilot.pause()
    return run_before


def test_main_screen_with_provenance_colours(snap_compare, snapshot_app):
    app, path = snapshot_app
    assert snap_compare(app, terminal_size=(100, 30), run_before=open_saved_chat_then(path, "f2"))


def test_settings_screen(snap_compare, snapshot_app):
    app, path = snapshot_app
    assert snap_compare(app, terminal_size=(80, 24), run_before=open_saved_chat_then(path, "f3"))
