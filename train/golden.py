"""Write tests/sources/golden/builtin_greedy.json: greedy replies of the built-in model, the regression CI checks.

    python -m train.golden
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edge import Engine
from edge.sources.builtin import builtin_model_path

CASES = [
    ([{"role": "user", "content": "What does the `os` module do?"}], 40),
    ([{"role": "user", "content": "Write a Python function `add(a, b)` that returns the sum of a and b."}], 40),
]


def main() -> int:
    engine = Engine.load(builtin_model_path(), max_context=1024)
    golden = []
    for messages, max_new_tokens in CASES:
        engine.reset()
        events = list(engine.chat(messages, max_new_tokens=max_new_tokens, temperature=0.0, loop_stop=0))
        golden.append({"messages": messages, "max_new_tokens": max_new_tokens,
                       "token_ids": [t for e in events for t in e.token_ids], "text": "".join(e.text for e in events)})
    path = Path(__file__).resolve().parent.parent / "tests" / "sources" / "golden" / "builtin_greedy.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
