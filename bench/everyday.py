"""Everyday prompts: how many replies loop under the old decoding defaults (greedy, no repetition guard) and the new
ones (sampling at the model's recommended settings, else llama.cpp's and Ollama's, with a repetition penalty and the
loop stop), on the default model.

    python -m bench.everyday                        the default model, both settings, one seed per prompt
    python -m bench.everyday MODEL --seeds 3        another model; each prompt sampled with 3 seeds under the new
    python -m bench.everyday --only new --json out.json
    python -m bench.everyday --only new --drafter retrieval     speed with a drafter (same replies: it is exact)

A reply loops when its tokens end in one cycle repeated at least 3 times over at least 64 tokens: the loop stop's own
rule (edge/decoding/repetition.py), so under the new defaults a looping reply is one the loop stop ended. The old
defaults run without the loop stop, to the reply length (edge-chat's 512 tokens), and are checked with the same
detector. Replies run one prompt at a time from an empty cache, with plain decoding unless --drafter names one (a
greedy output does not depend on it; a sampled one keeps its distribution). A seeded plain reply is reproducible on
one machine. The last lines give each setting's decoding speed (generated tokens over seconds, prefill included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

from edge import Engine
from edge.engine import GenerationOptions
from edge.decoding.repetition import loop_length
from edge.decoding.sampling import DEFAULTS
from edge.events import FINISH_LOOP
from edge.sources import default_model

LOOP_TOKENS = DEFAULTS["loop_stop"]  # the loop stop's length, and the detector's here
REPLY_TOKENS = 512  # edge-chat's reply length

# (name, prompt): what people ask a small chat model first
PROMPTS = (
    ("capital", "What is the capital of France?"),
    ("translate", "Translate to French: I like apples."),
    ("json", "What is json?"),
    ("multiply", "What is 17 times 23?"),
    ("haiku", "Write a haiku about the sea."),
    ("email", "Write a short email to my boss asking for Friday off."),
    ("hello", "Hello! How are you?"),
    ("joke", "Tell me a joke."),
    ("python", "What is Python?"),
    ("reverse", "Write a Python function that reverses a string."),
    ("photosynthesis", "Explain photosynthesis in one paragraph."),
    ("sky", "Why is the sky blue?"),
    ("planets", "List the planets of the solar system."),
    ("breakfast", "Give me three ideas for a healthy breakfast."),
    ("summary", "Summarize in one sentence: The meeting moved from Monday to Wednesday because the manager is "
                "travelling, and everyone should bring their quarterly numbers."),
    ("synonym", "What is a synonym for happy?"),
    ("recipe", "How do I boil an egg?"),
    ("dog", "Write a two-sentence story about a dog."),
    ("spanish", "How do you say thank you in Spanish?"),
    ("weekdays", "How many days are in a week?"),
    ("http", "What does HTTP stand for?"),
    ("sleep", "Give me some tips for sleeping better."),
    ("birthday", "Write a short birthday message for my sister."),
    ("celsius", "Convert 100 degrees Celsius to Fahrenheit."),
    ("sort", "Sort these numbers: 5, 2, 9, 1."),
    ("ml", "What is machine learning?"),
    ("tweet", "Write a tweet about Monday mornings."),
    ("moon", "How far is the Moon from the Earth?"),
    ("apology", "Write a one-line apology for a late reply."),
    ("shopping", "Make a shopping list for a pasta dinner."),
)

# the two settings compared: the old defaults as they were, and the new ones (the model's recommended, else edge's)
SETTINGS = {
    "old": dict(temperature=0.0, repetition_penalty=1.0, loop_stop=0),
    "new": {},
}


@dataclass
class Reply:
    prompt: str
    setting: str
    seed: int | None
    tokens: int
    finish_reason: str
    looped: bool
    seconds: float
    text: str
    steps: int = 0  # target passes (the prefill and every decode step)
    drafted: int = 0  # tokens a drafter proposed, and those accepted
    accepted: int = 0


def run_prompt(engine: Engine, name: str, text: str, setting: str, seed: int | None, max_new_tokens: int) -> Reply:
    engine.reset()
    options = {**SETTINGS[setting], "max_new_tokens": max_new_tokens}
    if setting == "new":
        options["seed"] = seed
    start = time.perf_counter()
    events = list(engine.chat([{"role": "user", "content": text}], **options))
    seconds = time.perf_counter() - start
    tokens = [token for event in events for token in event.token_ids]
    finish = events[-1].finish_reason
    looped = finish == FINISH_LOOP or loop_length(tokens, LOOP_TOKENS) is not None
    stats = events[-1].stats
    return Reply(name, setting, options.get("seed"), len(tokens), finish, looped, seconds,
                 "".join(event.text for event in events), stats.steps, stats.drafted, stats.accepted)


def run(engine: Engine, settings: list[str], seeds: int, max_new_tokens: int, prompts=PROMPTS,
        out=sys.stdout) -> list[Reply]:
    """Every prompt under every setting (the new one once per seed, seeds 0..seeds-1); a line per prompt, then the
    loop counts."""
    replies = []
    for name, text in prompts:
        cells = []
        for setting in settings:
            for seed in (range(seeds) if setting == "new" else [None]):
                reply = run_prompt(engine, name, text, setting, seed, max_new_tokens)
                replies.append(reply)
                cells.append(f"{setting}{'' if seed is None else f'[{seed}]'}: "
                             f"{'LOOP' if reply.looped else reply.finish_reason} {reply.tokens} tok")
        print(f"{name:15} " + " | ".join(cells), file=out, flush=True)
    for setting in settings:
        mine = [reply for reply in replies if reply.setting == setting]
        looped = sorted({reply.prompt for reply in mine if reply.looped})
        print(f"{setting}: {sum(reply.looped for reply in mine)} of {len(mine)} replies loop "
              f"({len(looped)} of {len(prompts)} prompts{': ' + ', '.join(looped) if looped else ''}); "
              f"{sum(r.tokens for r in mine)} tokens at {sum(r.tokens for r in mine) / sum(r.seconds for r in mine):.1f}"
              f" tokens/s, {sum(r.tokens for r in mine) / max(1, sum(r.steps for r in mine)):.2f} a step; drafted "
              f"{sum(r.drafted for r in mine)}, accepted {sum(r.accepted for r in mine)}", file=out, flush=True)
    return replies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.everyday", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a checkpoint folder, .gguf file or Hub id (default: the default "
                                                 "model, SmolLM2-135M-Instruct where installed)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per prompt under the new defaults (default: 1)")
    parser.add_argument("--only", choices=sorted(SETTINGS), help="run one setting only")
    parser.add_argument("--max-new-tokens", type=int, default=REPLY_TOKENS,
                        help=f"reply length (default: {REPLY_TOKENS}, edge-chat's)")
    parser.add_argument("--drafter", metavar="SPEC", help="speculate with this drafter (as edge-chat's --drafter; "
                                                          "default: plain decoding)")
    parser.add_argument("--json", metavar="FILE", help="also write every reply (text included) to FILE")
    args = parser.parse_args(argv)
    engine = Engine.load(args.model or default_model.default_model_path(), drafter=args.drafter)
    print(f"model: {args.model or default_model.default_model_path().name}; recommended sampling: "
          f"{engine.recommended or 'none (edge defaults)'}; new defaults: {GenerationOptions.merged(None, {}, engine.recommended).sampling}",
          file=sys.stderr)
    replies = run(engine, [args.only] if args.only else list(SETTINGS), args.seeds, args.max_new_tokens)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump([asdict(reply) for reply in replies], file, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
