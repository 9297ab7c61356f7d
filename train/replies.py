"""The target's own greedy replies to user turns of the training split: data that shows the drafters what they will
be asked to draft (the target's replies, not the corpus's answers).

    python -m train.replies --target edge/models/default --corpus data/corpus --out data/replies.jsonl
    python -m train.replies ... --requests both --count 3500 --out data/task-replies.jsonl

`--requests` picks what is asked: the training split's own user turns (corpus, the default), requests of the kinds
edge-bench measures, written from the training split (tasks: train.task_turns), or both in turn. Writes one chat
example per line, in the corpus's format ({"kind": "reply", "messages": [*conversation, reply]}), so
`train.data.load_split` reads it. The turns are drawn in a seeded order and decoding is greedy, so the file is the
same on every run; it is written under a temporary name and renamed when complete, and a run started again after
an interruption keeps the replies already written and goes on from there.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Iterator

from train.corpus import read_jsonl
from train.progress import Progress
from train.task_turns import task_requests

REPLY_COUNT = 9000
SKIPPED = "skipped"  # the kind of a line for a request that did not fit the context (no reply; readers pass it by)
MAX_NEW_TOKENS = 160
ORDER_SEED = 7
TASK_SEED = 11


def user_turns(corpus_dir: Path, count: int, seed: int = ORDER_SEED) -> list[dict]:
    """The last user message of `count` chat examples of the training split, in a seeded order."""
    chats = [example for example in read_jsonl(corpus_dir / "train.jsonl") if "messages" in example]
    random.Random(seed).shuffle(chats)
    return [[message for message in example["messages"] if message["role"] == "user"][-1]
            for example in chats[:count]]


def requests(corpus_dir: Path, kind: str, count: int, seed: int = ORDER_SEED,
             task_seed: int = TASK_SEED) -> list[list[dict]]:
    """The conversations to answer: `count` corpus turns, `count` task requests, or `count` of each in turn."""
    corpus = [[turn] for turn in user_turns(corpus_dir, count, seed)] if kind in ("corpus", "both") else []
    tasks = task_requests(corpus_dir, count, task_seed) if kind in ("tasks", "both") else []
    if kind != "both":
        return corpus or tasks
    return [conversation for pair in zip(corpus, tasks) for conversation in pair]


def greedy_replies(target: Path, conversations: list[list[dict]], max_new_tokens: int,
                   drafter: str | None = None) -> Iterator[dict]:
    """One {"kind": "reply", "messages": [*conversation, reply]} per conversation (ending with a user message): the
    target's greedy answer, by plain decoding or, with `drafter` (a --drafter spec), by greedy speculative decoding,
    which gives the same answer sooner."""
    from edge.engine import Engine

    from edge.errors import ContextLengthError

    engine = Engine.load(target, max_context=1024, drafter=drafter)
    for conversation in conversations:
        engine.reset()
        try:
            reply = "".join(event.text for event in engine.chat(conversation, max_new_tokens=max_new_tokens,
                                                                temperature=0.0))
        except ContextLengthError as error:  # a request longer than the context: kept as a line, so that the
            yield {"kind": SKIPPED, "messages": conversation, "why": str(error)}  # count and a resumed run agree
            continue
        yield {"kind": "reply", "messages": [*conversation, {"role": "assistant", "content": reply}]}


def finished_lines(partial: Path) -> list[str]:
    """The complete lines of an interrupted run's file (a last line cut short is dropped), or none."""
    if not partial.is_file():
        return []
    lines = partial.read_text().splitlines(keepends=True)
    return lines if not lines or lines[-1].endswith("\n") else lines[:-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.replies", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="the target checkpoint that answers")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines file to write")
    parser.add_argument("--count", type=int, default=REPLY_COUNT, help="how many user turns to answer")
    parser.add_argument("--requests", choices=("corpus", "tasks", "both"), default="corpus",
                        help="corpus: the training split's own user turns; tasks: requests of the benchmarks' kinds "
                             "written from the training split (train.task_turns); both: --count of each, in turn")
    parser.add_argument("--task-seed", type=int, default=TASK_SEED, help="the seed the task requests are drawn with")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--seed", type=int, default=ORDER_SEED, help="the order the turns are drawn in")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", default=None, help="a drafter for the target, as edge-chat's --drafter (e.g. "
                        "draft:SMALL.gguf): greedy speculative decoding writes the same replies, faster")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    turns = requests(args.corpus, args.requests, args.count, args.seed, args.task_seed)
    if args.out.is_file() and len(finished_lines(args.out)) == len(turns):  # a pipeline run again after a later step
        print(f"{args.out} already holds these {len(turns)} replies (delete it to write them again)", file=sys.stderr)
        return 0
    partial = args.out.with_name(args.out.name + ".tmp")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = finished_lines(partial)  # an interrupted run goes on where it stopped (the order is seeded)
    progress = Progress(len(turns), start=len(done), label="replies")
    with partial.open("w") as file:
        file.writelines(done)
        for index, example in enumerate(greedy_replies(args.target, turns[len(done):], args.max_new_tokens,
                                                       args.drafter), start=len(done) + 1):
            file.write(json.dumps(example) + "\n")
            file.flush()
            progress.update(index)
    progress.close()
    partial.rename(args.out)  # a half-written file never looks complete
    print(f"wrote {len(turns)} replies to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
