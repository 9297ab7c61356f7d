"""A feature drafter (EAGLE-style): a decoder layer (or a few) that drafts from the target's own last hidden states.

The row for position p fuses the target's normed hidden state at p-1 with the embedding of token p and runs the
decoder layer(s) (with its own small KV cache) and a norm; the result predicts the target's hidden state at p, and
the target's head turns it into a guess for token p+1. The next row feeds that prediction back as the feature:

    target features f[0 .. n-1]  (every full target pass stores them: edge.model.transformer.keep_features)
    rows j = reuse .. n-1:  fc(cat(f[j], embed(x[j+1])))  -> layer -> norm -> g     (true features)
    draft 1 = argmax head(g);  rows n, n+1, ...:  fc(cat(g, embed(draft)))  -> ...  (own predictions)

It shares the target's embedding and head, so it adds its layers' weights (one layer is about a tenth of the
built-in target) and their KV cache. Trained by `python -m train.feature_drafter` for one particular target.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from edge.decoding.drafters.base import Draft, DraftSampler, draft_autoregressively
from edge.model.trimmed_head import TrimmedHead, draft_head, read_vocabulary
from edge.errors import CheckpointError, SamplingError
from edge.model.kernel_glue import draft_greedy
from edge.model.kv_cache import common_prefix
from edge.model.linears import Linear
from edge.model.transformer import Transformer, keep_features
from edge.sources.loading import load_hf_tensors, load_model
from edge.kernels.records import FeatureRows


EMBEDDING = "model.embed_tokens.weight"
PROBE, PROBE_IDS = "edge.embedding_probe", "edge.embedding_probe_ids"  # (n, D) rows of the target's embedding, (n,)
VOCABULARY = "vocab.json"  # a packed drafter's trimmed head: the token ids it drafts over


def _same_embedding(ours: torch.Tensor, targets: torch.Tensor) -> bool:
    return ours.shape == targets.shape and torch.allclose(ours.float(), targets.float(), rtol=1e-3, atol=1e-3)


class FeatureDrafter:
    name = "feature"

    def __init__(self, target: Transformer, layer: Transformer, fc: Linear, max_len: int) -> None:
        """`layer`: a Transformer of the drafter's layers (usually one) whose embedding is the target's; `fc`:
        (2D -> D) fusion."""
        self.target, self.layer, self.fc = target, layer, fc
        self.device = target.device
        keep_features(target, max_len)
        self.cache = layer.new_cache(max_len)
        self._seen: list[int] = []  # the tokens the cached rows were computed for
        self._true_rows = 0  # rows of the drafter's cache computed from the target's own features
        self._previous: torch.Tensor | None = None  # (1, D): the predicted feature the next row starts from
        self.head: TrimmedHead | None = None  # VocabTrim: draft over the kept tokens of the target's head only

    @classmethod
    def load(cls, path: str | Path, target: Transformer, max_len: int) -> "FeatureDrafter":
        path = Path(path)
        if not isinstance(target, Transformer):
            raise SamplingError("the feature drafter reads the target's hidden states, which needs the torch backend")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise CheckpointError(f"feature drafter folder {path} does not exist or has no config.json; pass the "
                                  "folder python -m train.feature_drafter wrote")
        try:
            raw = json.loads(config_file.read_text())
            kind = raw.get("edge_drafter")
        except (ValueError, AttributeError):
            raw, kind = {}, None
        if kind != "feature":
            raise CheckpointError(f"{path} is not a feature drafter (its config.json lacks \"edge_drafter\": "
                                  "\"feature\"); pass one written by python -m train.feature_drafter, or use draft:PATH")
        tensors = load_hf_tensors(path).tensors
        fc_weight = tensors.get("fc.weight")
        if EMBEDDING in tensors:  # a folder as training wrote it: the embedding itself says which target it is for
            layer = load_model(path, dtype=target.dtype, device=target.device)
            belongs = _same_embedding(layer.embed.weight, target.embed.weight)
        else:  # a packed drafter (python -m train.pack_feature_drafter): rows of the target's embedding to compare
            probe, ids = tensors.get(PROBE), tensors.get(PROBE_IDS)
            if probe is None or ids is None:
                raise CheckpointError(f"{path} holds neither the embedding nor its probe rows; the feature drafter "
                                      "is incomplete, write it again")
            shape = (raw.get("vocab_size", 0), raw.get("hidden_size", 0))  # as the drafter's config implies
            placeholder = torch.zeros((), dtype=probe.dtype).expand(shape)  # (V, D), stride 0: no memory
            layer = load_model(path, dtype=target.dtype, device=target.device, substitutes={EMBEDDING: placeholder})
            belongs = int(ids.max()) < target.config.vocab_size and _same_embedding(
                probe, target.embed(ids.to(target.device)))
        config, wanted = layer.config, target.config
        # the same target in another precision matches to rounding; another target's embedding does not match at all
        if (config.hidden_size, config.vocab_size) != (wanted.hidden_size, wanted.vocab_size) or not belongs:
            raise CheckpointError(f"the feature drafter in {path} was trained for another target model (its "
                                  "embedding differs); train one for this target with python -m train.feature_drafter")
        if fc_weight is None or tuple(fc_weight.shape) != (config.hidden_size, 2 * config.hidden_size):
            raise CheckpointError(f"{path} lacks fc.weight of shape ({config.hidden_size}, {2 * config.hidden_size}); "
                                  "the feature drafter is incomplete, write it again")
        layer.embed = target.embed  # shared: the drafter keeps no second copy of the embedding
        fc = layer.linears.linear(2 * config.hidden_size, config.hidden_size, False, device="meta")  # layer's kernel
        fc_dtype = layer.norm.weight.dtype  # stored like the drafter's layer (16-bit files stay 16-bit on the CPU)
        fc.weight = torch.nn.Parameter(fc_weight.to(device=target.device, dtype=fc_dtype).contiguous(),
                                       requires_grad=False)
        drafter = cls(target, layer, fc, max_len)
        if (path / VOCABULARY).is_file():  # packed with its trimmed vocabulary: draft over those tokens
            drafter.trim_vocabulary(read_vocabulary(path / VOCABULARY))
        return drafter

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        last = len(tokens) - 1  # position of the last token; the target holds features for positions < last
        if last < 1 or last + k > self.cache.max_len:
            return Draft(tokens=[])
        reuse = min(self._true_rows, max(common_prefix(self._seen, tokens) - 1, 0), last - 1)
        self.cache.rollback(min(reuse, self.cache.length))
        self._previous = None
        drafted = None
        if sampler.plain_greedy:  # all k in one C call: its layer over the target's features, the target's head
            features = FeatureRows(self.target.features[reuse:last], self.fc.weight)  # (T, D), (D, 2D)
            drafted = draft_greedy(self.layer, sampler.request(tokens[reuse + 1:], reuse, self.cache, k,
                                                               draft_head(self.target, self.head), features=features))
        if drafted is not None:
            draft = Draft.from_kernel(drafted)
        else:
            draft = draft_autoregressively(self._step, tokens, tokens[reuse + 1:], reuse, k, sampler)
        self._seen, self._true_rows = list(tokens), last  # a snapshot: the caller extends its list
        return draft

    def _step(self, feed: list[int], start: int) -> torch.Tensor:
        """Rows start .. start+len(feed)-1, fed the tokens `feed` and the features before them -> logits (V,)."""
        if self._previous is None:  # the first call of a draft: the target's own features
            features = self.target.features[start:start + len(feed)]  # (T, D)
        else:
            features = self._previous  # (1, D)
        embeds = self.target.embed(torch.tensor(feed, device=self.device)).to(features.dtype)  # (T, D)
        fused = self.fc(torch.cat((features, embeds), dim=-1)).to(features.dtype)  # (T, D)
        hidden = self.layer(None, start, self.cache, inputs=fused[None])  # (1, T, D)
        self._previous = hidden[0, -1:]  # (1, D)
        if self.head is not None:
            return self.head.logits(hidden)  # (V,), dropped tokens -inf
        return self.target.logits(hidden[:, -1:])[0, -1]  # (V,)

    def trim_vocabulary(self, kept: torch.Tensor) -> None:
        self.head = TrimmedHead(self.target, kept)

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        pass  # the next propose() recomputes the rows of accepted drafts from the target's features

    def reset(self) -> None:
        self.cache.reset()
        self._seen, self._true_rows, self._previous = [], 0, None

    def memory_bytes(self) -> int:
        layer = sum(t.nbytes for name, t in self.layer.state_dict().items() if not name.startswith("embed."))
        head = self.head.nbytes if self.head is not None else 0
        return layer + self.fc.weight.nbytes + self.cache.nbytes + self.target.features.nbytes + head
