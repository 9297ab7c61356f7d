"""The most a draft model can give a target on this machine: how often the draft's first, second, ... choice is
the target's, and what the best chain or token tree of it would gain with no overhead at all.

    python -m bench.draft_ceiling TARGET DRAFT [--max-new-tokens 128] [--rows 8] [--repeats 9] [--context 256]
                                               [--goal 1.8]

For each of edge-bench's prompts (chat template) the target decodes greedily; the draft then reads the prompt and
that reply in one pass (teacher forcing) and the rank of the target's token among the draft's choices is kept at
every position of the reply, over the vocabulary edge drafts with (the shipped draft vocabulary where one ships for
the tokenizer). The costs are measured here, in turns within each round: a target call of 1..`--rows` rows after
`--context` tokens (c = its time over a 1-row call's) and a one-call draft of three tokens as the engine drafts them;
each ratio is the median of its ratios within a round, since this machine's memory speed drifts between minutes.

From the ranks, every start position of a reply gives the sequence of ranks the target's next tokens have among
the draft's choices, each drafted on the target's own prefix. A tree of drafted tokens (a set of such rank paths,
closed under prefixes: a chain is (0), (0, 0), ...) accepts at a position as many tokens as the longest path of
the tree that its sequence starts with, plus the target's own token. A step costs a verify pass of the tree's
nodes + 1 rows and one draft call per depth, of as many rows as that depth's nodes with children (counted at the
target's c, both being memory-bound reads). The table gives, per chain length and per static tree of the likeliest
n paths, the expected tokens a step, the cost in target steps and their ratio: the speedup of decode steps if
nothing but those passes took time; and what a drafted token may cost for that ratio to reach `--goal`. It is a
bound for the drafter, not a forecast: prefill, sampling, bookkeeping and a length chosen from running estimates all
come on top.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import torch

from bench.arguments import bench_parser
from bench.prompts import PROMPTS
from edge.frontend.options import resolve_model_path

LOOKAHEAD = 8  # the deepest path counted
DRAFTED = 3  # tokens a timed draft call drafts
RANKS = 4  # ranks below this are told apart; the rest count as "not among the first RANKS"


def draft_ranks(hidden: torch.Tensor, head_rows: torch.Tensor, kept: torch.Tensor | None,
                wanted: list[int]) -> list[int]:
    """hidden (T, D) of the draft at the positions before each wanted token, head_rows (V', D) -> the rank of each
    wanted token among the draft's choices over `kept` token ids (None: the whole vocabulary); RANKS where it is not
    among the first RANKS (or not in the draft's vocabulary at all)."""
    logits = hidden.float() @ head_rows.float().T  # (T, V')
    top = logits.topk(RANKS, dim=-1).indices  # (T, RANKS) in kept order
    if kept is not None:
        top = kept[top]  # (T, RANKS) token ids
    target = torch.tensor(wanted)[:, None]  # (T, 1)
    hits = top == target  # (T, RANKS)
    return torch.where(hits.any(-1), hits.int().argmax(-1), torch.full_like(target[:, 0], RANKS)).tolist()


def prefix_shares(replies: list[list[int]], lookahead: int = LOOKAHEAD) -> dict[tuple[int, ...], float]:
    """For every rank path of up to `lookahead` steps, the share of start positions (over all replies) whose ranks
    begin with it."""
    counts: Counter = Counter()
    starts = 0
    for ranks in replies:
        for start in range(len(ranks)):
            following = tuple(ranks[start:start + lookahead])
            starts += 1
            for depth in range(1, len(following) + 1):
                if following[depth - 1] >= RANKS:
                    break
                counts[following[:depth]] += 1
    return {path: count / starts for path, count in counts.items()} if starts else {}


def draft_calls(tree: list[tuple[int, ...]], c: dict[int, float]) -> float | None:
    """The tree's draft calls in 1-row calls: one per depth, of as many rows as the nodes of the depth above with
    children there; None past the measured row counts."""
    calls = 0.0
    for depth in range(max((len(path) for path in tree), default=0)):
        parents = len({path[:depth] for path in tree if len(path) == depth + 1})
        if parents not in c:
            return None
        calls += c[parents]
    return calls


def step_cost(tree: list[tuple[int, ...]], c: dict[int, float], draft_ratio: float) -> float | None:
    """Target steps one speculative step of this tree costs: a verify pass of its nodes + 1 rows and its draft calls
    (draft_calls) at `draft_ratio` of a step each; None past the measured row counts."""
    calls = draft_calls(tree, c)
    return None if calls is None or len(tree) + 1 not in c else c[len(tree) + 1] + draft_ratio * calls


def draft_ratio_for(goal: float, tree: list[tuple[int, ...]], tokens: float, c: dict[int, float]) -> float:
    """The cost of a drafted token (in target steps) at which this tree's bound is `goal`: tokens / (verify + r *
    draft calls) = goal; negative where even free drafting falls short."""
    return (tokens / goal - c[len(tree) + 1]) / draft_calls(tree, c)


def expected_tokens(tree: list[tuple[int, ...]], shares: dict[tuple[int, ...], float]) -> float:
    """Tokens a step of this tree emits on average: the target's own and each accepted node (a node is accepted
    where the start's ranks begin with its path)."""
    return 1.0 + sum(shares.get(path, 0.0) for path in tree)


def shapes(shares: dict[tuple[int, ...], float], largest: int) -> list[tuple[str, list[tuple[int, ...]]]]:
    """The chains of 1..largest tokens, and for each n up to `largest` the tree of the n likeliest paths (closed under
    prefixes, since a path is never likelier than its prefix)."""
    found = [(f"chain of {k}", [(0,) * depth for depth in range(1, k + 1)]) for k in range(1, largest + 1)]
    likeliest = sorted(shares, key=lambda path: (-shares[path], len(path), path))
    tree: list[tuple[int, ...]] = []
    for path in likeliest[:largest]:  # each path after its prefix: a path is never likelier than its prefix
        tree.append(path)
        if any(any(path) for path in tree):  # not a chain
            found.append((f"the likeliest {len(tree)} paths", list(tree)))
    return found


def draft_head(drafter) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows the draft scores tokens with (V', D) and their token ids (None: all), as edge drafts."""
    from edge.model.trimmed_head import kept_rows

    kept = drafter.head.kept if drafter.head is not None else None
    ids = kept if kept is not None else torch.arange(drafter.model.config.vocab_size)
    return kept_rows(drafter.model, ids), kept


def costs_in_turns(engine, drafter, tokens: list[int], most_rows: int, context: int,
                   repeats: int) -> tuple[dict[int, float], float, float]:
    """c(n) for n = 1..most_rows and a drafted token's share of a 1-row call, each the median of its ratio within a
    round (a target call of every row count, then a one-call draft of DRAFTED tokens as the engine drafts, in
    turns: this machine's memory speed drifts between minutes, and a ratio taken across minutes would mix two
    speeds); and the 1-row call's median seconds. `tokens`: context + most_rows or more, the first `context` of them
    in the cache when a call is timed."""
    from edge.decoding.drafters.base import DraftSampler
    from edge.decoding.sampling import SamplingParams

    window = tokens[:context]
    sampler = DraftSampler(SamplingParams(temperature=0.0), torch.Generator(), None, engine.model.config.vocab_size)
    drafter.reset()
    drafter.propose(window, DRAFTED, sampler)  # reads the window once
    row_counts = list(range(1, most_rows + 1))
    cache = engine.model.new_cache(len(window) + most_rows + 1)
    ratios: dict[int, list[float]] = {n: [] for n in row_counts}
    drafting, steps = [], []
    with torch.inference_mode():
        engine.model(torch.tensor([window]), 0, cache)
        for repeat in range(repeats + 2):  # the first rounds warm the caches up
            seconds = {}
            for n in row_counts:
                started = time.perf_counter()
                engine.model.forward_logits(torch.tensor([tokens[len(window):len(window) + n]]), len(window), cache)
                seconds[n] = time.perf_counter() - started
                cache.rollback(len(window))
            started = time.perf_counter()
            drafter.propose(window, DRAFTED, sampler)  # feeds the window's last token, drafts DRAFTED
            drafted = (time.perf_counter() - started) / DRAFTED
            if repeat >= 2:
                steps.append(seconds[1])
                drafting.append(drafted / seconds[1])
                for n in row_counts:
                    ratios[n].append(seconds[n] / seconds[1])
    return ({n: statistics.median(values) for n, values in ratios.items()}, statistics.median(drafting),
            statistics.median(steps))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.draft_ceiling", __doc__, repeats=9, max_new_tokens=128,
                          model="the target (a GGUF file or checkpoint folder)",
                          context={"default": 256, "help": "tokens in the cache when a call is timed (default 256)"})
    parser.add_argument("draft", help="the draft model (a GGUF file or checkpoint folder), as --drafter draft:DRAFT")
    parser.add_argument("--rows", type=int, default=8, help="the most rows a verify pass may have (default 8)")
    parser.add_argument("--goal", type=float, default=1.8,
                        help="a speedup to ask of each shape: the last column gives what a drafted token may cost, "
                             "in target steps, for that shape's bound to reach it (default 1.8)")
    args = parser.parse_args(argv)
    if args.rows < 2 or args.repeats < 1 or args.max_new_tokens < 1:
        parser.error("--rows needs 2 or more, --repeats and --max-new-tokens a positive number")
    from edge.engine import Engine

    engine = Engine.load(resolve_model_path(args.model), max_context=4096)
    prompts = [engine.tokenizer.encode_chat(prompt.messages) for prompt in PROMPTS]
    replies = []
    for ids in prompts:
        engine.reset()
        replies.append([t for event in engine.generate(ids, max_new_tokens=args.max_new_tokens, temperature=0.0)
                        for t in event.token_ids])

    engine.use_drafter(f"draft:{args.draft}")
    drafter = engine.drafter
    rows, kept = draft_head(drafter)
    ranks = []
    with torch.inference_mode():
        for ids, reply in zip(prompts, replies):
            full = ids + reply
            cache = drafter.model.new_cache(len(full) + 1)
            hidden = drafter.model(torch.tensor([full]), 0, cache)[0, len(ids) - 1:-1]  # (T, D)
            ranks.append(draft_ranks(hidden, rows, kept, reply))
    flat = [rank for reply in ranks for rank in reply]

    sequence = [token for ids, reply in zip(prompts, replies) for token in ids + reply]
    if len(sequence) < args.context + args.rows:
        parser.error(f"the replies hold {len(sequence)} tokens; --context plus --rows must not exceed them")
    c, ratio, step = costs_in_turns(engine, drafter, sequence, args.rows, args.context, args.repeats)
    shares = prefix_shares(ranks)

    print(f"{len(flat)} positions over {len(PROMPTS)} replies; the draft's choice k is the target's: " + ", ".join(
        f"top-{k} {sum(r < k for r in flat) / len(flat):.1%}" for k in range(1, RANKS + 1)))
    print(f"a target step {step * 1e3:.1f} ms; c(2..{args.rows}) " +
          ", ".join(f"{c[n]:.2f}" for n in range(2, args.rows + 1)) +
          f"; a drafted token {ratio:.2f} of a step (medians of the ratios within each round)\n")
    print(f"| shape | rows verified | tokens a step | cost (steps) | bound | a drafted token for {args.goal:g}x |")
    print("|---|---:|---:|---:|---:|---:|")
    best = ("plain", 1.0)
    candidates = shapes(shares, args.rows - 1)
    for name, tree in candidates:
        cost = step_cost(tree, c, ratio)
        if cost is None:
            continue
        tokens = expected_tokens(tree, shares)
        needed = draft_ratio_for(args.goal, tree, tokens, c)
        print(f"| {name} | {len(tree) + 1} | {tokens:.2f} | {cost:.2f} | {tokens / cost:.2f}x | "
              f"{f'{needed:.2f} of a step' if needed > 0 else 'out of reach'} |")
        if tokens / cost > best[1]:
            best = (name, tokens / cost)
    if not any(name.startswith("the likeliest") for name, _ in candidates):
        print(f"\nthe likeliest {args.rows - 1} paths are the chain's: no tree of up to {args.rows - 1} drafted tokens "
              "accepts more than the chain of as many")
    print(f"\nbest: {best[0]}, {best[1]:.2f}x plain decode steps, with nothing but the passes taking time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
