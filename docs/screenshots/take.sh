#!/usr/bin/env bash
# Screenshots of edge-chat in a real terminal (tmux) at 80x24 and 200x50, saved as SVG next to this script.
#   bash docs/screenshots/take.sh        (needs tmux; uses .venv/bin/edge-chat and a throw-away chat folder)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/screenshots
export EDGE_DATA_DIR=$(mktemp -d)
for size in 80x24 200x50; do
    cols=${size%x*}; rows=${size#*x}; name=edge-chat-$size
    tmux kill-session -t "$name" 2>/dev/null || true
    tmux new-session -d -s "$name" -x "$cols" -y "$rows" \
        "TERM=xterm-256color EDGE_DATA_DIR=$EDGE_DATA_DIR .venv/bin/edge-chat; sleep 60"
    sleep 15                                   # load the model and measure the plain-decoding baseline
    tmux send-keys -t "$name" "Write a Python function is_palindrome(text) that returns True if text reads the same backwards." Enter
    sleep 15                                   # let the reply finish
    tmux send-keys -t "$name" F2               # provenance colours on
    sleep 2
    tmux capture-pane -t "$name" -e -p > "$out/$name.ansi"
    tmux kill-session -t "$name"
    .venv/bin/python - "$out/$name.ansi" "$cols" "$out/$name.svg" <<'PY'
import sys
from rich.console import Console
from rich.text import Text
ansi, cols, svg = sys.argv[1], int(sys.argv[2]), sys.argv[3]
console = Console(record=True, width=cols, force_terminal=True, color_system="truecolor", file=open("/dev/null", "w"))
for line in open(ansi, encoding="utf-8").read().rstrip("\n").split("\n"):
    console.print(Text.from_ansi(line), no_wrap=True, overflow="crop")
console.save_svg(svg, title=f"edge-chat in tmux, {cols} columns")
PY
    rm "$out/$name.ansi"
    echo "wrote $out/$name.svg"
done
rm -rf "$EDGE_DATA_DIR"
