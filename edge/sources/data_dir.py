"""Where edge keeps what it makes for the user: saved chats (edge/tui/history.py) and installed drafter heads
(edge/sources/installed_heads.py)."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """$EDGE_DATA_DIR, else the platform's user data folder for edge (~/.local/share/edge on Linux)."""
    override = os.environ.get("EDGE_DATA_DIR")
    if override:
        return Path(override)
    from platformdirs import user_data_dir

    return Path(user_data_dir("edge", appauthor=False))
