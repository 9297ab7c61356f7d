"""An EAGLE-3 drafter: a published EAGLE-3 head (edge/decoding/drafters/eagle3_head.py) drafting from the target's
residual streams at a low, a middle and a high layer, which the target keeps for every position it computes
(edge/model/layer_features.py, on the torch path and in the fused C calls).

    target streams f[0 .. n-1] (3D each)
    rows j = reuse .. n-1:  layer(fc(f[j]), embed(x[j+1]))          -> out[j]       (the target's own features)
    draft 1 = d2t-mapped argmax lm_head(norm(out[n-1]));  rows n, n+1, ...:  layer(out[previous], embed(draft))

Row j sits at position j in the head's own KV cache; a new draft recomputes from the first row whose tokens or
features changed (as the feature drafter does). Greedy drafts may grow a token tree (EAGLE-2: the likeliest nodes
of each depth through the head in one pass, each seeing its ancestors), whose likeliest branches the target may
verify beside the chain; sampled drafts report the distribution each token was drawn from, over the target's
whole vocabulary (tokens outside the draft vocabulary impossible), so speculative sampling stays exact.
"""

from __future__ import annotations

from pathlib import Path

import torch

from edge.decoding.drafters.base import Branch, Draft, DraftSampler
from edge.decoding.drafters.eagle3_head import Eagle3Config, Eagle3Layer, head_folder, read_tensors
from edge.errors import CheckpointError, SamplingError
from edge.kernels.block_formats import BlockMatrix
from edge.model.kv_cache import common_prefix
from edge.model.layer_features import keep_layer_features
from edge.model.transformer import Transformer

TREE_WIDTH = 3  # EAGLE-2's top-k: the nodes the head runs at each depth of a token tree, and the children each keeps


class Eagle3Drafter:
    name = "eagle3"

    def __init__(self, target: Transformer, layer: Eagle3Layer, token_ids: torch.Tensor,
                 layers: tuple[int, ...], embed: torch.nn.Module) -> None:
        """`token_ids` (Vd,): the target token of each draft-vocabulary row; `layers`: the target layers whose
        output streams the head reads; `embed`: the head's embedding, or the target's."""
        self.target, self.layer, self.token_ids, self.embed = target, layer, token_ids, embed
        self.kept = keep_layer_features(target, layers, layer.max_len)
        self._seen: list[int] = []  # the tokens the cached rows were computed for
        self._true_rows = 0  # rows computed from the target's own features

    @classmethod
    def load(cls, name: str | Path, target: Transformer, max_len: int) -> "Eagle3Drafter":
        """The head in a folder, or a Hub id's from the Hugging Face cache, checked against `target`."""
        if not isinstance(target, Transformer):
            raise SamplingError("the eagle3 drafter reads the target's hidden states, which needs the torch backend")
        folder = head_folder(name)
        config = Eagle3Config.read(folder)
        tensors = read_tensors(folder)
        wanted = target.config
        if (config.hidden_size, config.vocab_size) != (wanted.hidden_size, wanted.vocab_size):
            raise CheckpointError(f"the EAGLE-3 head {name} belongs to another target (hidden size "
                                  f"{config.hidden_size}, vocabulary {config.vocab_size}; this model's are "
                                  f"{wanted.hidden_size}, {wanted.vocab_size}); pass the head trained for this model")
        layers = config.target_layers(wanted.num_layers)
        if any(not 0 <= layer < wanted.num_layers for layer in layers):
            raise CheckpointError(f"the EAGLE-3 head {name} reads target layers {list(layers)}, beyond this model's "
                                  f"{wanted.num_layers}; pass the head trained for this model")
        check_tensors(name, config, tensors)
        d2t = tensors.get("d2t")
        rows = torch.arange(config.draft_vocab_size)
        token_ids = rows if d2t is None else rows + d2t.long()  # (Vd,)
        if int(token_ids.min()) < 0 or int(token_ids.max()) >= wanted.vocab_size:
            raise CheckpointError(f"the EAGLE-3 head {name} maps draft tokens outside this model's vocabulary of "
                                  f"{wanted.vocab_size} (its d2t); pass the head trained for this model")
        blocks = isinstance(target.packed_head, BlockMatrix)  # a GGUF target: the head's matrices in 8-bit blocks
        layer = Eagle3Layer(config, tensors, max_len, target.dtype, target.device, target.runner, blocks)
        embed = target.embed
        if "embed_tokens.weight" in tensors:
            weight = tensors["embed_tokens.weight"].to(device=target.device, dtype=target.dtype)
            embed = torch.nn.Embedding.from_pretrained(weight, freeze=True)
        return cls(target, layer, token_ids.to(target.device), layers, embed)

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        last = len(tokens) - 1  # position of the last token; the target holds features for positions < last
        if last < 1 or last + k > self.layer.max_len:
            return Draft(tokens=[])
        reuse = min(self._true_rows, max(common_prefix(self._seen, tokens) - 1, 0), last - 1)
        with torch.inference_mode():
            features = self.layer.fuse(self.kept.rows[reuse:last])  # (T, D)
            out = self._rows(features, tokens[reuse + 1:], reuse)  # (T, D)
            draft = self._draft(out[-1:], tokens, last, k, sampler)
        self._seen, self._true_rows = list(tokens), last  # a snapshot: the caller extends its list
        return draft

    def _rows(self, g: torch.Tensor, feed: list[int], start: int) -> torch.Tensor:
        embeds = self.embed(torch.tensor(feed, device=g.device)).to(g.dtype)  # (T, D)
        return self.layer.forward(g, embeds, start)  # (T, D)

    def _draft(self, out: torch.Tensor, tokens: list[int], position: int, k: int, sampler: DraftSampler) -> Draft:
        """Up to k tokens from the layer's output (1, D) of the row before `position`, each fed back; for a token tree
        (greedy, without a confidence stop), a tree of depth k where the head's cache has room for it."""
        if sampler.trees and sampler.stop_below is None and position + (k - 1) * TREE_WIDTH <= self.layer.max_len:
            return self._tree(out, position, k)
        draft, probs = Draft(tokens=[]), []
        for i in range(k):
            logits = self.layer.logits(out)[0].float()  # (Vd,)
            token, dist, confidence = sampler.pick(self._full(logits), tokens + draft.tokens)
            if sampler.stop_below is not None and draft.tokens and confidence < sampler.stop_below:
                break  # keep at least one token: an empty draft wastes the verify pass
            draft.tokens.append(token)
            draft.confidences.append(confidence)
            if dist is not None:
                probs.append(dist)
            if i + 1 < k:
                out = self._rows(out, [token], position + i)  # (1, D)
        if probs:
            draft.probs = torch.stack(probs)  # (n, V)
        return draft

    def _tree(self, root: torch.Tensor, position: int, k: int) -> Draft:
        """A greedy draft of depth k with branches, grown as EAGLE-2 grows one: the chain of first choices, and beside
        it the likeliest other paths. At each depth the TREE_WIDTH likeliest nodes (the chain's among them) go
        through the head in one pass, each at its depth's position and seeing the context and its own ancestors, and
        each keeps its TREE_WIDTH likeliest children. `root` (1, D) is the layer's output of the row before
        `position`."""
        # per node: its draft-vocabulary row, parent (-1: the root), probability given the parent, path's, depth
        rows, parents, chances, reaches, depths = [], [], [], [], []
        slots, outs = {}, {-1: root}  # per node run through the head: its slot in the head's cache, its output (1, D)

        def grow(node: int, probs: torch.Tensor, depth: int) -> list[int]:  # probs (Vd,)
            top, reach, first = probs.topk(TREE_WIDTH), reaches[node] if node >= 0 else 1.0, len(rows)
            for chance, row in zip(top.values.tolist(), top.indices.tolist()):
                rows.append(row), parents.append(node), chances.append(chance)
                reaches.append(reach * chance), depths.append(depth)
            return list(range(first, len(rows)))

        level = grow(-1, self.layer.logits(root)[0].float().softmax(-1), 1)
        chain, slot = [level[0]], position
        for depth in range(1, k):
            others = sorted((node for node in level if node != chain[-1]), key=lambda node: -reaches[node])
            frontier = [chain[-1], *others[:TREE_WIDTH - 1]]
            count = len(frontier)
            visible = torch.zeros(count, slot + count, dtype=torch.bool, device=root.device)  # (F, slot + F)
            visible[:, :position] = True  # the context: the rows of the target's own features
            for i, node in enumerate(frontier):
                slots[node], ancestor = slot + i, node
                while ancestor >= 0:
                    visible[i, slots[ancestor]] = True
                    ancestor = parents[ancestor]
            g = torch.cat([outs[parents[node]] for node in frontier])  # (F, D)
            feed = self.token_ids[torch.tensor([rows[node] for node in frontier], device=root.device)]  # (F,)
            at = torch.full((count,), position + depth - 1, device=root.device)  # (F,) the depth's position
            out = self.layer.forward(g, self.embed(feed).to(g.dtype), slot, positions=at, visible=visible)  # (F, D)
            probs = self.layer.logits(out).float().softmax(-1)  # (F, Vd)
            slot, level = slot + count, []
            for i, node in enumerate(frontier):
                outs[node] = out[i:i + 1]
                level += grow(node, probs[i], depth + 1)
            chain.append(level[0])  # the chain node's first child (the chain node leads the frontier)
        others = sorted((node for node in range(len(rows)) if node not in chain),
                        key=lambda node: (-reaches[node], depths[node]))  # each after its parent
        index = {-1: -1, **{node: j for j, node in enumerate(chain)},
                 **{node: len(chain) + i for i, node in enumerate(others)}}
        token = lambda node: int(self.token_ids[rows[node]])  # noqa: E731
        return Draft(tokens=[token(node) for node in chain], confidences=[chances[node] for node in chain],
                     branches=[Branch(token(node), index[parents[node]], reaches[node]) for node in others])

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (Vd,) -> the target vocabulary's (V,), -inf where the head has no row."""
        full = logits.new_full((self.target.config.vocab_size,), float("-inf"))
        full[self.token_ids] = logits
        return full

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        pass  # the next propose() recomputes the rows of accepted drafts from the target's features

    def reset(self) -> None:
        self.layer.length = 0
        self._seen, self._true_rows = [], 0

    def memory_bytes(self) -> int:
        embed = self.embed.weight.nbytes if self.embed is not self.target.embed else 0
        return self.layer.nbytes + self.kept.rows.nbytes + self.token_ids.nbytes + embed


def check_tensors(name, config: Eagle3Config, tensors: dict[str, torch.Tensor]) -> None:
    """Every tensor the layer reads is there in the shape config.json implies; else one line naming the first."""
    d, q, kv, i = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, \
        config.intermediate_size
    shapes = {"fc.weight": (d, 3 * d), "midlayer.self_attn.q_proj.weight": (q, 2 * d),
              "midlayer.self_attn.k_proj.weight": (kv, 2 * d), "midlayer.self_attn.v_proj.weight": (kv, 2 * d),
              "midlayer.self_attn.o_proj.weight": (d, q), "midlayer.mlp.gate_proj.weight": (i, d),
              "midlayer.mlp.up_proj.weight": (i, d), "midlayer.mlp.down_proj.weight": (d, i),
              "midlayer.input_layernorm.weight": (d,), "midlayer.hidden_norm.weight": (d,),
              "midlayer.post_attention_layernorm.weight": (d,), "norm.weight": (d,),
              "lm_head.weight": (config.draft_vocab_size, d)}
    if config.draft_vocab_size != config.vocab_size:
        shapes["d2t"] = (config.draft_vocab_size,)
    biased = sorted(tensor for tensor in tensors if tensor.endswith(".bias"))
    if biased:
        raise CheckpointError(f"the EAGLE-3 head {name} has biases ({biased[0]}), which edge does not run; use a head "
                              "without them")
    for tensor, shape in shapes.items():
        found = tensors.get(tensor)
        if found is None or tuple(found.shape) != shape:
            what = "lacks" if found is None else f"has {tuple(found.shape)} for"
            raise CheckpointError(f"the EAGLE-3 head {name} {what} {tensor} of shape {shape}; it is incomplete or "
                                  "not an EAGLE-3 head, download or write it again")
