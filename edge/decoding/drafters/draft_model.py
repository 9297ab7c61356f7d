"""A separate small checkpoint with the same tokenizer drafts for the target (classic speculative decoding)."""

from __future__ import annotations

import logging

import torch

from edge.decoding.drafters.base import Draft, DraftSampler, draft_autoregressively
from edge.model.trimmed_head import TrimmedHead, draft_head
from edge.errors import SamplingError, TokenizerError
from edge.model.kernel_glue import draft_greedy
from edge.model.kv_cache import common_prefix
from edge.model.transformer import Transformer
from edge.model.quantized_kv_cache import QuantizedKVCache, kv_formats
from edge.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The most tokens a draft model catches up on in one go. Reading a whole prompt costs it about a third of the target's
# prefill (0.5B against 1.5B), which a reply of a few hundred tokens never wins back (a 1,500-token prompt: the 0.5B
# draft at 0.79x plain decoding); from the newest CATCH_UP tokens it guesses as well (0.99x there, level on short
# prompts; docs/benchmarks.md, "Speculation on a real 1.5B file").
CATCH_UP = 64


class DraftModelDrafter:
    name = "draft-model"

    def __init__(self, model: Transformer, max_len: int, kv_cache: str | None = None) -> None:
        """`max_len`: the drafter's own context. Below the target's (a memory plan's "shorter draft context"), the
        drafter sees a window of the newest tokens: when a draft would run past it, it starts again from the newest
        half, at positions from 0. Rotary attention depends only on distances, so the shift costs only the
        context left out; the target still verifies every token, so output is unchanged. The same shift starts a
        new prompt at its newest `catch_up` tokens rather than reading all of it. `kv_cache` ("int8", "int8-int4")
        stores the drafter's own cache quantized."""
        self.model = model
        self.device = model.device
        if kv_cache in (None, "float32"):
            self.cache = model.new_cache(max_len)
        elif isinstance(model, Transformer):
            keys, values = kv_formats(kv_cache)
            self.cache = QuantizedKVCache.for_model(model.config, max_len, key_format=keys, value_format=values,
                                                    device=self.device)
        else:
            raise SamplingError("a quantized draft KV cache needs a torch draft model, not an exported one")
        self.catch_up = CATCH_UP  # the most new tokens read in one go: more, and the draft starts at the newest ones
        self.head: TrimmedHead | None = None  # VocabTrim on the torch backend (bundles trim inside the graph)
        self._base = 0  # index in the sequence of the token at the drafter's position 0
        self._cached: list[int] = []  # tokens (from _base on) whose keys/values are in the drafter's cache

    @classmethod
    def check_compatible(cls, target: Transformer, target_tokenizer: Tokenizer, draft: Transformer,
                         draft_tokenizer: Tokenizer) -> None:
        """Refuse a drafter with another tokenizer; accept vocabularies that differ only by padding rows."""
        if target_tokenizer.backend.get_vocab(with_added_tokens=True) != draft_tokenizer.backend.get_vocab(
                with_added_tokens=True):
            raise TokenizerError(
                "the draft model's tokenizer differs from the target's; a drafter must share the target's "
                "tokenizer (pick a draft checkpoint of the same model family)"
            )
        if draft.config.vocab_size < target_tokenizer.vocab_size:
            raise TokenizerError(
                f"the draft model's vocabulary ({draft.config.vocab_size}) is smaller than the tokenizer's "
                f"({target_tokenizer.vocab_size}); its config.json does not belong to this tokenizer"
            )
        if _parameters(draft) >= _parameters(target):
            log.warning("the draft model (%d parameters) is not smaller than the target (%d): speculative decoding "
                        "will be slower than plain decoding", _parameters(draft), _parameters(target))

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        limit = self.cache.max_len
        if len(tokens) < self._base or len(tokens) - self._base + k > limit:  # restart the window
            self._base = max(0, len(tokens) - limit // 2) if len(tokens) + k > limit else 0
            self._cached = []
        window = tokens[self._base:]
        reuse = common_prefix(self._cached, window[:-1])  # at least the last token is fed
        catch_up = min(self.catch_up, limit // 2)
        if len(window) - reuse > catch_up:  # a new prompt: start at its newest tokens, at position 0
            self._base, self._cached, reuse = len(tokens) - catch_up, [], 0
            window = tokens[self._base:]
        self.cache.rollback(min(reuse, self.cache.length))
        drafted = None
        if sampler.plain_greedy and isinstance(self.model, Transformer):  # all k in one C call, over its own head
            drafted = draft_greedy(self.model, sampler.request(window[reuse:], reuse, self.cache, k,
                                                               draft_head(self.model, self.head, sampler.vocab_size)))
        draft = (Draft.from_kernel(drafted) if drafted is not None
                 else draft_autoregressively(self._step, window, window[reuse:], reuse, k, sampler))
        self._cached = window + draft.tokens[:-1]
        return draft

    def _step(self, feed: list[int], start: int) -> torch.Tensor:
        hidden = self.model(torch.tensor([feed], device=self.device), start, self.cache)  # (1, T, D)
        if self.head is not None:
            return self.head.logits(hidden)  # (V,), dropped tokens -inf
        return self.model.logits(hidden[:, -1:])[0, -1]  # (V,)

    def trim_vocabulary(self, kept: torch.Tensor) -> None:
        if not isinstance(self.model, Transformer):
            raise SamplingError("a bundle's drafter is trimmed when it is exported (edge-export --vocab-trim on)")
        self.head = TrimmedHead(self.model, kept)

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        pass  # the next propose() rolls the cache back to the common prefix

    def reset(self) -> None:
        self.cache.reset()
        self._base, self._cached = 0, []

    def memory_bytes(self) -> int:
        return self.model.weight_bytes() + self.cache.nbytes + (self.head.nbytes if self.head is not None else 0)


def _parameters(model) -> int:
    """Parameters counted from the config, so an exported target (no torch parameters) compares the same way."""
    return model.config.shape().parameters()
