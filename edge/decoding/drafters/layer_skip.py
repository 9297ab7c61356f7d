"""Self-speculative drafting: the target drafts for itself with a subset of its own layers.

    early exit (LayerSkip):  layers [0, E) then the shared final norm and head
    skip set (SWIFT, CLaSp): every layer except the skipped ones

The drafter owns no weights and no cache: it runs the target's layers and writes their keys/values into the
target's cache at positions beyond the verified length (a partial forward does not advance `cache.length`). The
verifying full pass rewrites every layer at those positions, so nothing stale is ever kept.

`AdaptiveLayerSkipDrafter` picks among candidate layer sets at run time from measured speed on the current context
(tokens emitted per second of draft + verify, as SWIFT's on-the-fly search and DEL's dynamic exit do) and
remembers the best choice per task. Its skip sets are calibrated on the model at hand (skip_calibration.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edge.decoding.drafters.base import Draft, DraftSampler, draft_autoregressively
from edge.decoding.drafters.skip_calibration import layer_influence, skip_sets
from edge.model.trimmed_head import TrimmedHead, draft_head
from edge.errors import SamplingError
from edge.model.kernel_glue import draft_greedy
from edge.model.kv_cache import KVCache
from edge.model.static_step import static_steps
from edge.model.transformer import Transformer


def early_exit_layers(num_layers: int, exit_layer: int) -> list[int]:
    if not 1 <= exit_layer < num_layers:
        raise SamplingError(f"exit layer must be between 1 and {num_layers - 1} for a {num_layers}-layer model, "
                            f"got {exit_layer}")
    return list(range(exit_layer))


def skip_set_layers(num_layers: int, skip: list[int]) -> list[int]:
    bad = [layer for layer in skip if not 0 <= layer < num_layers]
    if bad:
        raise SamplingError(f"layer {bad[0]} is not in the model (layers 0..{num_layers - 1}); fix the skip set")
    kept = [layer for layer in range(num_layers) if layer not in set(skip)]
    if not kept:
        raise SamplingError("the skip set skips every layer; keep at least one layer for the drafter to run")
    if len(kept) == num_layers:
        raise SamplingError("the skip set skips no layer, so the draft would cost as much as the target; skip some")
    return kept


class LayerSkipDrafter:
    def __init__(self, model: Transformer, cache: KVCache, layers: list[int], name: str) -> None:
        self.model, self.cache, self.layers, self.name = model, cache, list(layers), name
        self.device = model.device
        self.head: TrimmedHead | None = None  # VocabTrim: draft over the kept tokens only

    def trim_vocabulary(self, kept: torch.Tensor) -> None:
        self.head = TrimmedHead(self.model, kept)

    @classmethod
    def early_exit(cls, model: Transformer, cache: KVCache, exit_layer: int) -> "LayerSkipDrafter":
        return cls(model, cache, early_exit_layers(model.config.num_layers, exit_layer), f"early-exit:{exit_layer}")

    @classmethod
    def skipping(cls, model: Transformer, cache: KVCache, skip: list[int]) -> "LayerSkipDrafter":
        layers = skip_set_layers(model.config.num_layers, skip)
        return cls(model, cache, layers, "skip:" + ",".join(str(layer) for layer in sorted(set(skip))))

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        start = len(tokens) - 1  # the target's cache holds everything before the last token
        if sampler.plain_greedy:  # all k drafts in one C call where the kernel runs: its layers, the shared head
            head = draft_head(self.model, self.head, sampler.vocab_size)
            drafted = draft_greedy(self.model, sampler.request([tokens[-1]], start, self.cache, k, head,
                                                               layers=self.layers))
            if drafted is not None:
                return Draft.from_kernel(drafted)
            steps = static_steps(self.model, self.cache) if self.head is None else None
            if steps is not None and sampler.stop_below is None and not sampler.trees:  # one graph, k tokens
                return Draft(tokens=steps.draft_greedy(tokens[-1], start, k, self.layers,
                                                       getattr(self.cache, "draft_view", False), sampler.vocab_size))
        return draft_autoregressively(self._step, tokens, [tokens[-1]], start, k, sampler)

    def _step(self, feed: list[int], start: int) -> torch.Tensor:
        steps = static_steps(self.model, self.cache) if self.head is None else None
        if steps is not None and len(feed) <= steps.max_rows:  # the graph-captured step of a GPU
            tokens = torch.tensor([feed], device=self.device)
            return steps.logits(tokens, start, self.layers, getattr(self.cache, "draft_view", False))[-1].clone()
        hidden = self.model(torch.tensor([feed], device=self.device), start, self.cache, layers=self.layers)
        if self.head is not None:
            return self.head.logits(hidden)  # (V,), dropped tokens -inf
        return self.model.logits(hidden[:, -1:])[0, -1]  # (V,)

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        pass

    def reset(self) -> None:
        pass

    def memory_bytes(self) -> int:
        return self.head.nbytes if self.head is not None else 0  # otherwise the target's weights and cache


SKIP_FRACTIONS = (1 / 8, 1 / 4, 1 / 3)  # the calibrated skip sets' sizes, as shares of the depth


@dataclass
class _Record:
    """Running measure of one candidate: tokens emitted per second of (draft + verify), smoothed."""

    rate: float = 0.0
    trials: int = 0

    def add(self, tokens: int, seconds: float, smoothing: float = 0.2) -> None:
        sample = tokens / max(seconds, 1e-9)
        self.rate = sample if self.trials == 0 else (1 - smoothing) * self.rate + smoothing * sample
        self.trials += 1


@dataclass
class _TaskMemory:
    records: dict[str, _Record] = field(default_factory=dict)


class AdaptiveLayerSkipDrafter:
    """Choose the exit layer / skip set with the best measured speed, exploring a little, per task."""

    name = "adaptive-skip"

    def __init__(self, model: Transformer, cache: KVCache, candidates: list[LayerSkipDrafter] | None = None, *,
                 calibration_ids: list[int] | None = None, warmup_trials: int = 3, explore: float = 0.05,
                 seed: int = 0, memory_path: Path | None = None) -> None:
        self.candidates = {c.name: c for c in (candidates or default_candidates(model, cache, calibration_ids))}
        self.warmup_trials, self.explore = warmup_trials, explore
        self.random = random.Random(seed)
        self.memory_path = memory_path
        self.tasks: dict[str, _TaskMemory] = self._load_memory()
        self.task = "default"
        self.current = next(iter(self.candidates))

    def set_task(self, task: str) -> None:
        """Switch to (or start) the statistics of a task, e.g. "code" or "chat"; good choices are remembered."""
        self.task = task
        self.tasks.setdefault(task, _TaskMemory())

    def best(self) -> str:
        """The candidate with the best measured speed so far for the current task."""
        records = self._records()
        measured = [name for name in self.candidates if records.get(name, _Record()).trials]
        return max(measured, key=lambda name: records[name].rate) if measured else self.current

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        self.current = self._choose()
        return self.candidates[self.current].propose(tokens, k, sampler)

    def _choose(self) -> str:
        records = self._records()
        untried = [name for name in self.candidates if records.get(name, _Record()).trials < self.warmup_trials]
        if untried:
            return untried[0]
        if self.random.random() < self.explore:
            return self.random.choice(list(self.candidates))
        return self.best()

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        self._records().setdefault(self.current, _Record()).add(accepted + 1, step_s)

    def _records(self) -> dict[str, _Record]:
        return self.tasks.setdefault(self.task, _TaskMemory()).records

    def reset(self) -> None:
        self.save()

    def memory_bytes(self) -> int:
        return sum(candidate.memory_bytes() for candidate in self.candidates.values())

    def trim_vocabulary(self, kept: torch.Tensor) -> None:
        head = TrimmedHead(next(iter(self.candidates.values())).model, kept)
        for candidate in self.candidates.values():
            candidate.head = head  # one trimmed copy shared by every candidate layer set

    def save(self) -> None:
        """Write what was learnt per task to `memory_path` (atomically), if one was given."""
        if self.memory_path is None:
            return
        data = {task: {name: [r.rate, r.trials] for name, r in memory.records.items()}
                for task, memory in self.tasks.items()}
        tmp = self.memory_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.memory_path)

    def _load_memory(self) -> dict[str, _TaskMemory]:
        if self.memory_path is None or not self.memory_path.is_file():
            return {"default": _TaskMemory()}
        try:
            data = json.loads(self.memory_path.read_text())
            return {task: _TaskMemory({name: _Record(rate, trials) for name, (rate, trials) in records.items()
                                       if name in self.candidates})
                    for task, records in data.items()}
        except (ValueError, TypeError):
            return {"default": _TaskMemory()}  # a damaged memory file only costs the warm-up


def default_candidates(model: Transformer, cache: KVCache,
                       calibration_ids: list[int] | None = None) -> list[LayerSkipDrafter]:
    """Early exits at 1/2 and 2/3 of the depth (for models trained to exit early), and skip sets calibrated on the
    model (edge/decoding/drafters/skip_calibration.py): its least influential 1/8, 1/4 and 1/3 of the layers, measured
    over `calibration_ids` (without them, every other layer of the upper half, the fixed rule SWIFT started from)."""
    layers = model.config.num_layers
    exits = sorted({max(1, min(layers - 1, round(layers * f))) for f in (0.5, 2 / 3)})
    candidates = [LayerSkipDrafter.early_exit(model, cache, e) for e in exits]
    if calibration_ids:
        sets = skip_sets(layer_influence(model, calibration_ids), SKIP_FRACTIONS)
    else:
        sets = [[layer for layer in range(layers // 2, layers - 1) if layer % 2 == 1]]
    candidates += [LayerSkipDrafter.skipping(model, cache, skip) for skip in sets if skip]
    return candidates
