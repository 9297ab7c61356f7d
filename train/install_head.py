"""Build an EAGLE-3 head for a GGUF model and install it, in one command: afterwards `edge-chat MODEL` and edge-serve
draft with it by default when decoding greedily where no draft model of it is found (edge/frontend/options.py,
draft_beside), for that file and every other quantization of the same model.

    python -m train.install_head qwen2.5-coder-1.5b        # a catalogue name (edge pull it first) or a .gguf file

Three steps, each resumable in a work folder (edge's data folder's training/IDENTITY, or --work): the corpus
(train.corpus: conversations written from the Python standard library's sources and docs), the model's own greedy
replies to --replies corpus questions and as many requests of edge-bench's kinds (train.replies), features from
prefill passes over those replies and --corpus-count corpus conversations, --steps training steps and the
install (train.eagle3). Stopped at any point (Ctrl+C, a reboot), the same command goes on where it stopped.
The settings are the ones edge's own heads were trained with (docs/drafters.md); on 2 cores a 1.5B model takes a
few hours, most of it the replies and the training. Where a smaller GGUF file with the model's tokenizer lies beside
it (as edge-chat would draft with), the replies are written by greedy speculative decoding with it: the same
replies, sooner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge.sources.data_dir import default_data_dir
from edge.sources.installed_heads import identity
from train.eagle3 import HELD_OUT

REPLIES = 300  # corpus questions, and as many task requests: 600 replies of at most 160 tokens
CORPUS_CONVERSATIONS = 400  # corpus conversations with their own answers, labelled by the model's greedy choices
STEPS = 1000
INTERMEDIATE = 4096  # the head's MLP width


def gguf_file(name: str) -> Path:
    """The file `name` stands for: a path, or a pulled catalogue model's file; else SystemExit with the fix."""
    from edge.sources.catalogue import lookup
    from edge.sources.model_source import named_model_file

    path = named_model_file(name)
    if path.is_file():
        return path
    if lookup(name) is not None:
        raise SystemExit(f"error: {name} is not downloaded; run `edge pull {name}` first")
    raise SystemExit(f"error: {name} is neither a .gguf file nor a model of `edge list`; pass one of them")


def stage(number: int, what: str) -> None:
    print(f"train.install_head: step {number} of 3: {what}", file=sys.stderr, flush=True)


def build_corpus(folder: Path, max_modules: int | None) -> Path:
    """The corpus in `folder`, written once (under a temporary name, renamed when complete)."""
    if (folder / "train.jsonl").is_file():
        return folder
    import shutil

    from train import corpus

    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    argv = ["--out", str(partial)] + (["--max-modules", str(max_modules)] if max_modules else [])
    if corpus.main(argv) != 0:
        raise SystemExit("error: the corpus could not be written")
    partial.rename(folder)
    return folder


def reply_drafter(target: Path) -> str | None:
    """draft:FILE for the smallest GGUF file beside `target` with its tokenizer (edge/sources/draft_finder.py), said
    on stderr: the replies are greedy, so speculative decoding writes the same ones sooner; None where there is none."""
    from edge.sources.draft_finder import drafts_beside

    found = drafts_beside(target)
    if not found:
        return None
    print(f"train.install_head: the replies are drafted by {found[0].name} (beside the model, same tokenizer; the "
          "same greedy replies, sooner)", file=sys.stderr)
    return f"draft:{found[0]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.install_head", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a GGUF file, or the name of a pulled model of `edge list`")
    parser.add_argument("--work", type=Path, help="the work folder (default: edge's data folder's training/ID)")
    parser.add_argument("--replies", type=int, default=REPLIES, help=f"corpus questions to answer, and as many "
                        f"task requests (default {REPLIES})")
    parser.add_argument("--corpus-count", type=int, default=CORPUS_CONVERSATIONS,
                        help=f"corpus conversations added (default {CORPUS_CONVERSATIONS})")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps (default {STEPS})")
    parser.add_argument("--intermediate", type=int, default=INTERMEDIATE,
                        help=f"the head's MLP width (default {INTERMEDIATE})")
    parser.add_argument("--held-out", type=int, default=HELD_OUT, help="replies kept out for the card's figures")
    parser.add_argument("--corpus-modules", type=int, default=None, help="build the corpus from only the first N "
                        "standard-library modules (for trials)")
    args = parser.parse_args(argv)
    target = gguf_file(args.model)
    key = identity(target)
    if key is None:
        parser.error(f"{target} is not a GGUF file edge reads; heads are installed for GGUF models (for a checkpoint "
                     "folder, train with python -m train.eagle3 and pass --drafter eagle3:OUT/final)")
    work = args.work or default_data_dir() / "training" / key
    work.mkdir(parents=True, exist_ok=True)
    print(f"train.install_head: {target} (model {key}), work folder {work}", file=sys.stderr)

    stage(1, "the corpus")
    corpus = build_corpus(work / "corpus", args.corpus_modules)
    stage(2, f"the model's replies to {2 * args.replies} requests")
    from train import eagle3, replies

    replies_file = work / "replies.jsonl"
    drafter = reply_drafter(target)
    if replies.main(["--target", str(target), "--corpus", str(corpus), "--requests", "both",
                     "--count", str(args.replies), "--out", str(replies_file),
                     *(["--drafter", drafter] if drafter else [])]) != 0:
        return 1
    stage(3, f"features, {args.steps} training steps and the install")
    return eagle3.main(["--target", str(target), "--replies", str(replies_file), "--corpus", str(corpus),
                        "--corpus-count", str(args.corpus_count), "--out", str(work / "run"),
                        "--draft-vocab", "auto", "--intermediate", str(args.intermediate), "--unroll", "1",
                        "--steps", str(args.steps), "--batch", "4", "--seq-len", "256", "--save-every", "25",
                        "--held-out", str(args.held_out), "--install"])


if __name__ == "__main__":
    raise SystemExit(main())
