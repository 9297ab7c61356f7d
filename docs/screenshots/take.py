"""Screenshots of edge-chat on the default model, taken by Textual itself (the app headless, driven by its test pilot),
saved as SVG next to this script:

    python docs/screenshots/take.py      (from the checkout, in the environment edge is installed in)

edge-chat-80x24.svg and edge-chat-200x50.svg: a reply with the provenance colours on (F2) and their legend above the
input, the speculation and memory panels, every key in the footer; edge-chat-settings-80x24.svg: the settings (F3).
The app is the one `edge-chat --temperature 0` runs (greedy, so the default model drafts with retrieval and the
colours have drafted tokens to show), each size in a process of its own as a user starts it (the memory panel's
figures are the process's); chats go to a throw-away folder.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = ((80, 24), (200, 50))
PROMPT = "Write a Python function is_palindrome(text) that returns True if text reads the same backwards."
COMMAND = ["--temperature", "0"]


async def take(size: tuple[int, int], *, settings: bool) -> None:
    from edge.tui.cli import build_parser, chat_app, command_spec
    from edge.tui.widgets.prompt import PromptInput

    args = build_parser().parse_args(COMMAND)
    app = chat_app(args, command_spec(args))
    width, height = size
    async with app.run_test(size=size) as pilot:
        await app.workers.wait_for_complete()  # the model loads, the plain-decoding baseline is measured
        await pilot.pause()
        if app.load_error:
            sys.exit(f"take.py: edge-chat could not load the default model: {app.load_error}")
        prompt = app.screen.query_one(PromptInput)
        prompt.load_text(PROMPT)
        await pilot.press("enter")
        await pilot.pause()
        await app.workers.wait_for_complete()  # the reply
        await pilot.pause()
        await pilot.press("f2")  # provenance colours on
        await pilot.pause()
        name = f"edge-chat-{width}x{height}.svg"
        app.save_screenshot(name, path=str(HERE))
        print(f"wrote {HERE / name}")
        if settings:
            await pilot.press("f3")
            await pilot.pause()
            name = f"edge-chat-settings-{width}x{height}.svg"
            app.save_screenshot(name, path=str(HERE))
            print(f"wrote {HERE / name}")


def main(argv: list[str]) -> None:
    if argv:  # one size, in this process: WIDTHxHEIGHT
        width, height = (int(number) for number in argv[0].split("x"))
        asyncio.run(take((width, height), settings=(width, height) == SIZES[0]))
        return
    os.environ["EDGE_DATA_DIR"] = tempfile.mkdtemp(prefix="edge-screenshots-")
    for width, height in SIZES:
        subprocess.run([sys.executable, __file__, f"{width}x{height}"], check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
