"""A retrieval drafter's datastore from the target's own replies (edge/decoding/drafters/retrieval.py).

    python -m train.replies --target MODEL --requests both --count 3000 --out REPLIES.jsonl
    python -m train.datastore --target MODEL --replies REPLIES.jsonl --out edge/models/NAME-replies

Each reply is tokenized as the target's chat template frames it (the tokens after the generation prompt, its end
token included), so the store holds the ids the target produces. The folder gets `replies.npy` (uint16 token ids,
a separator between replies) and `card.json`: the tokenizer's vocabulary hash (a store only drafts for the
tokenizer it was written with), the source file, and the counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge.decoding.drafters.retrieval import CARD, STORE, TokenStore
from edge.sources.model_source import resolve_model
from edge.text.tokenizer import Tokenizer
from train.corpus import read_jsonl


def reply_tokens(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    """The last (assistant) message's token ids as the chat template frames it after the generation prompt."""
    prompt = tokenizer.encode_chat(messages[:-1], add_generation_prompt=True)
    whole = tokenizer.encode_chat(messages, add_generation_prompt=False)
    if whole[:len(prompt)] == prompt:
        return whole[len(prompt):]
    return tokenizer.encode(messages[-1]["content"], add_special_tokens=False)  # a template that re-renders turns


def build(target: str, replies: Path, out: Path) -> dict:
    tokenizer = Tokenizer.from_dir(resolve_model(target))
    examples = [e for e in read_jsonl(replies) if e.get("messages") and e["messages"][-1]["role"] == "assistant"]
    store = TokenStore.from_replies([reply_tokens(tokenizer, e["messages"]) for e in examples])
    out.mkdir(parents=True, exist_ok=True)
    store.save(out / STORE)
    card = {"vocab_sha256": tokenizer.fingerprint()["vocab_sha256"], "target": Path(target).name,
            "replies_file": replies.name, "replies": len(examples), "tokens": int(len(store.tokens))}
    (out / CARD).write_text(json.dumps(card, indent=1) + "\n")
    return card


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.datastore", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the model whose replies these are (its tokenizer)")
    parser.add_argument("--replies", type=Path, required=True, help="python -m train.replies's JSON-lines file")
    parser.add_argument("--out", type=Path, required=True, help="the datastore folder to write")
    args = parser.parse_args(argv)
    card = build(args.target, args.replies, args.out)
    print(f"{args.out}: {card['replies']} replies, {card['tokens']} tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
