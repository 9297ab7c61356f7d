"""Training data: corpus examples -> token ids -> packed (batch, seq_len + 1) windows, seeded and resumable."""

from __future__ import annotations

import random
from pathlib import Path

import torch


def load_split(path: Path, tokenizer, mix: dict[str, float] | None = None) -> tuple[list[list[int]], list[float]]:
    """Token ids of every example of one split (chat turns rendered with the chat template, code + end-of-text), and
    how often each is drawn per epoch: the weight of its kind in `mix` (1.0 if not named)."""
    from train.corpus import read_jsonl
    from train.replies import SKIPPED
    from train.tokenizer import encode_example

    examples = [example for example in read_jsonl(path) if example["kind"] != SKIPPED]
    weights = [(mix or {}).get(example["kind"], 1.0) for example in examples]
    return [encode_example(example, tokenizer) for example in examples], weights


class TokenStream:
    """Examples shuffled per epoch (seeded), concatenated, and cut into consecutive windows of seq_len + 1.

    `weights` (one per example, default 1.0) set the data mixture: an example of weight 2.5 appears twice in every
    epoch and a third time in half of them, one of weight 0.3 in about 30% of the epochs (seeded per epoch).
    """

    def __init__(self, examples: list[list[int]], seq_len: int, batch_size: int, seed: int = 0,
                 weights: list[float] | None = None) -> None:
        if not examples:
            raise ValueError("no examples to train on")
        if weights is not None and (len(weights) != len(examples) or min(weights) < 0):
            raise ValueError("weights: one non-negative weight per example")
        self.examples, self.seq_len, self.batch_size, self.seed = examples, seq_len, batch_size, seed
        self.weights = weights or [1.0] * len(examples)
        self.total_tokens = round(sum(len(example) * weight  # expected tokens per epoch
                                     for example, weight in zip(examples, self.weights)))
        self.epoch, self.offset = 0, 0
        self._tokens = self._epoch_tokens(0)

    def _epoch_tokens(self, epoch: int) -> torch.Tensor:
        rng = random.Random(self.seed * 1_000_003 + epoch)
        order = [index for index, weight in enumerate(self.weights)
                 for _ in range(int(weight) + (weight % 1 > 0 and rng.random() < weight % 1))]
        rng.shuffle(order)
        return torch.tensor([token for index in order for token in self.examples[index]], dtype=torch.long)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch, seq_len); targets are the inputs shifted by one token."""
        span = self.batch_size * self.seq_len + 1
        if self.offset + span > self._tokens.numel():
            self.epoch, self.offset = self.epoch + 1, 0
            self._tokens = self._epoch_tokens(self.epoch)
        window = self._tokens[self.offset : self.offset + span]  # (B*T + 1,)
        self.offset += span - 1
        inputs = window[:-1].view(self.batch_size, self.seq_len)
        targets = window[1:].view(self.batch_size, self.seq_len)
        return inputs, targets

    def fixed_batches(self, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first `count` batches of epoch 0 (held-out evaluation: the same batches every time)."""
        saved = self.state()
        self.restore({"epoch": 0, "offset": 0})
        batches = []
        for _ in range(count):
            if self.epoch > 0:
                break
            batches.append(self.next_batch())
        self.restore(saved)
        return batches

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def restore(self, state: dict) -> None:
        if state["epoch"] != self.epoch or not hasattr(self, "_tokens"):
            self._tokens = self._epoch_tokens(state["epoch"])
        self.epoch, self.offset = state["epoch"], state["offset"]


def load_replies(path: Path, tokenizer, mix: dict[str, float], held_back: int
                 ) -> tuple[list[list[int]], list[float], list[list[int]]]:
    """Token ids and mixture weights of the target's replies (python -m train.replies) to train on, and the ids of
    the last `held_back` replies (for evaluation only)."""
    ids, weights = load_split(path, tokenizer, mix)
    if len(ids) <= held_back:
        raise SystemExit(f"{path}: {len(ids)} replies; tuning needs more than the {held_back} held back for "
                         f"evaluation (python -m train.replies --count N)")
    return ids[:-held_back], weights[:-held_back], ids[-held_back:]


def training_streams(corpus: Path, tokenizer, mix: dict[str, float], seq_len: int, batch_size: int, seed: int,
                     heldout_batches: int, replies: Path | None = None, held_back: int = 0
                     ) -> tuple[TokenStream, dict[str, list[tuple[torch.Tensor, torch.Tensor]]], int]:
    """The training stream over the corpus's train split (and the replies to train on, with `replies`), the fixed
    evaluation batches by name ("heldout": the corpus's held-out split; "replies": the held-back replies), and how
    many replies are trained on."""
    train_ids, train_weights = load_split(corpus / "train.jsonl", tokenizer, mix)
    evaluation = {"heldout": load_split(corpus / "heldout.jsonl", tokenizer)[0]}
    reply_count = 0
    if replies is not None:
        reply_ids, reply_weights, evaluation["replies"] = load_replies(replies, tokenizer, mix, held_back)
        train_ids, train_weights, reply_count = train_ids + reply_ids, train_weights + reply_weights, len(reply_ids)
    stream = TokenStream(train_ids, seq_len, batch_size, seed=seed, weights=train_weights)
    batches = {name: TokenStream(ids, seq_len, batch_size, seed=seed).fixed_batches(heldout_batches)
               for name, ids in evaluation.items()}
    return stream, batches, reply_count
