"""The decoder-only transformer in one file: Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM, TinyLlama, Gemma 3,
Phi-3/Phi-4-mini.

Family differences are fields of `ModelConfig` (qkv bias, q/k norm, sliding windows, tied head, Gemma's sandwich
norms and GeGLU, partial rotary...), not subclasses.

    tokens (B, T) at positions [start, start+T)
      -> embed (times embedding_scale: Gemma)        (B, T, D)
      -> for i in layers (all, a range, or any subset):
           x = x + Attention(RMSNorm(x))             writes K/V of layer i at [start, start+T); layer i's window
                                                     and rope (Gemma 3's local layers: their own base)
           x = x + FeedForward(RMSNorm(x))           SwiGLU, or GeGLU (Gemma)
               (Gemma: each of the two outputs goes through its own RMSNorm before the residual add)
      -> RMSNorm                                     forward() returns this hidden state
      -> lm_head, optionally only rows `vocab_subset` logits() returns (B, T, V) or (B, T, |subset|)

Running a subset of layers is how self-speculative drafters (early exit, layer skip) share the target's weights
and KV cache; computing logits over a subset of the vocabulary is how a trimmed drafter head works.

The projections are made by a LinearFactory (edge/model/linears.py) bound to the model's kernel runner
(edge/kernels/runner.py), which decides per pass whether edge's batch-invariant CPU kernel runs it, one projection at a
time or the whole pass in fused C calls; edge/model/kernel_glue.py reads the model's tensors for it. Without the
kernel every pass is plain torch. The fused calls compute every family's layers (Gemma's sandwich norms, GeGLU and
local layers with their own rope table, Phi-3's partial rotary) from the same fields; what they read is in
kernel_glue.ModelTensors.
"""

from __future__ import annotations

import os
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from edge.model.block_weights import BlockEmbedding, BlockLinear
from edge.model.config import ModelConfig
from edge.model.kernel_glue import ModelTensors, use_kernel
from edge.model.kv_cache import KVCache, keep_slots
from edge.model.layer_features import LayerFeatures
from edge.model.linears import LinearFactory
from edge.model.rope import apply_rope, attention_factor, inverse_frequencies
from edge.model.static_step import static_steps
from edge.kernels.block_formats import BlockMatrix

ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


_STATIC_ON_CPU = os.environ.get("EDGE_STATIC_STEP") == "1"  # the static step on the CPU: tests of its logic


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, linears: LinearFactory, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.runner = linears.runner  # the batch-invariant attention of a short pass, where the kernel runs
        self.wqkv = linears.linear(config.hidden_size, config.q_size + 2 * config.kv_size, config.qkv_bias, device)
        self.wo = linears.linear(config.q_size, config.hidden_size, config.o_bias, device)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device) if config.qk_norm else None
        self.window = config.window  # layer -> its sliding window (None: all positions before it)
        # the scores' scale as a factor on q, so every attention below keeps its default Dh ** -0.5 (Gemma)
        self.q_scale = None if config.attention_scale is None else config.attention_scale * config.head_dim ** 0.5

    def forward(
        self,
        x: torch.Tensor,  # (B, T, D)
        layer: int,
        start: int,
        cache: KVCache,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, steps, _ = x.shape
        qkv = self.wqkv(x)  # (B, T, (H + 2*Hkv) * Dh)
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.view(batch, steps, self.num_heads, self.head_dim)  # (B, T, H, Dh)
        k = k.view(batch, steps, self.num_kv_heads, self.head_dim)  # (B, T, Hkv, Dh)
        v = v.view(batch, steps, self.num_kv_heads, self.head_dim)  # (B, T, Hkv, Dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H|Hkv, T, Dh)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_scale is not None and self.q_scale != 1.0:
            q = q * self.q_scale

        # a quantized cache may append and attend in place with a kernel: (1, H, T, Dh), each query computed alone
        fused = getattr(cache, "fused_attention", None)
        window = self.window(layer)
        out = fused(layer, start, q, k, v, window) if fused is not None else None
        if out is None:
            keys, values = cache.write(layer, start, k, v)  # (B, Hkv, start+T, Dh) each
            out = self.runner.attention(q, keys, values, start, window)  # batch-invariant, or None
            if out is None:
                causal_prefill = mask is None and steps > 1  # start == 0, no window: plain causal mask
                out = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, is_causal=causal_prefill,
                    enable_gqa=self.num_kv_heads != self.num_heads,
                )  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(batch, steps, self.q_size)  # (B, T, H*Dh)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul; GeGLU (Gemma) with gelu-tanh."""

    def __init__(self, config: ModelConfig, linears: LinearFactory, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.activation = ACTIVATIONS[config.activation]
        self.w_gate_up = linears.linear(config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, device)
        self.w_down = linears.linear(config.intermediate_size, config.hidden_size, config.mlp_bias, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).split(self.intermediate_size, dim=-1)  # (B, T, I) each
        return self.w_down(self.activation(gate) * up)  # (B, T, D)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, linears: LinearFactory, device: torch.device | str | None = None) -> None:
        super().__init__()
        norm = lambda: RMSNorm(config.hidden_size, config.rms_norm_eps, device)  # noqa: E731
        self.attn_norm = norm()
        self.attn = Attention(config, linears, device)
        self.ffn_norm = norm()
        self.ffn = FeedForward(config, linears, device)
        # Gemma's norms of the attention's and the feed-forward's outputs, before each residual add
        self.post_attn_norm = norm() if config.sandwich_norms else None
        self.post_ffn_norm = norm() if config.sandwich_norms else None

    def forward(self, x, layer, start, cache, rope, mask) -> torch.Tensor:
        attended = self.attn(self.attn_norm(x), layer, start, cache, rope, mask)  # (B, T, D)
        x = x + (attended if self.post_attn_norm is None else self.post_attn_norm(attended))
        fed = self.ffn(self.ffn_norm(x))  # (B, T, D)
        return x + (fed if self.post_ffn_norm is None else self.post_ffn_norm(fed))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str | None = None,
                 linears: LinearFactory | None = None) -> None:
        """`device="meta"` builds the structure without memory (the loader then assigns the checkpoint's tensors).
        `linears` makes the projections, bound to its kernel runner (default: one without the kernel until
        kernel_glue.use_kernel binds it)."""
        super().__init__()
        self.config = config
        self.linears = linears if linears is not None else LinearFactory()
        self.runner = self.linears.runner  # whether and how each pass runs on edge's CPU kernel (edge/kernels/runner.py)
        meta = torch.device(device).type == "meta" if device is not None else False
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, device=device,  # (no init on meta)
                                  _weight=torch.empty(config.vocab_size, config.hidden_size, device=device) if meta
                                  else None)
        self.layers = nn.ModuleList(Block(config, self.linears, device) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device)
        self.lm_head = (None if config.tie_word_embeddings
                        else self.linears.linear(config.hidden_size, config.vocab_size, False, device))
        self.register_buffer("inv_freq", inverse_frequencies(config).to(device), persistent=False)  # (R/2,)
        # Gemma 3's local layers: their own rope base (R/2,); None where every layer shares inv_freq
        self.register_buffer("inv_freq_local", inverse_frequencies(config, local=True).to(device)
                             if config.local_rope_layers else None, persistent=False)
        self.compute_dtype: torch.dtype | None = None  # set by store_weights(): activations wider than the weights
        # the head in a packed format (int8 bytes, or a BlockMatrix): quantize_weights (edge/model/packed_weights.py)
        # or a GGUF file's own types (edge/sources/gguf_weights.py); logits() and the fused calls score with it
        self.packed_head = None
        self.features: torch.Tensor | None = None  # (max_len, D) when kept: see keep_features()
        # residual streams after chosen layers, when kept (EAGLE-3): edge.model.layer_features.keep_layer_features
        self.layer_features: LayerFeatures | None = None
        self._rope_tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # cos, sin (S, R or 2R) each

    @property
    def device(self) -> torch.device:
        return self.inv_freq.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of activations and of the KV cache (the weights', unless store_weights() narrowed them)."""
        return self.compute_dtype or self.embed.weight.dtype

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight  # (V, D)

    def weight_bytes(self) -> int:
        """Bytes of every weight as held: parameters and buffers, packed and block matrices (each storage once)."""
        return held_bytes([self]) + held_bytes([], extra=[self.packed_head], seen=_storages([self]))

    def store_weights(self, dtype: torch.dtype) -> None:
        """Keep every weight (matrices, embedding, norms; not biases) in `dtype` (bfloat16) while computing in the
        current dtype: half the weight memory. Small calls read the narrow matrices directly (the batch-invariant
        kernel widens them in registers); larger ones widen a copy per call; norms promote to the compute dtype."""
        self.compute_dtype = self.dtype
        for module in self.modules():
            weight = getattr(module, "weight", None)
            if isinstance(weight, nn.Parameter):
                module.weight = nn.Parameter(weight.detach().to(dtype), requires_grad=False)
        self.runner.weights_changed()  # the pointers change: found again at the next forward
        if self.runner.matmul is not None:
            use_kernel(self, self.runner.matmul)  # re-check the kernel supports them

    def new_cache(self, max_len: int) -> KVCache:
        """A KV cache for `max_len` positions in this model's dtype and device."""
        return KVCache.for_model(self.config, max_len, dtype=self.dtype, device=self.device)

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T)
        start: int,
        cache: KVCache,
        layers: Iterable[int] | None = None,
        inputs: torch.Tensor | None = None,  # (B, T, D): input vectors to use instead of embedding `tokens`
    ) -> torch.Tensor:
        """Run `layers` (default: all) over tokens at positions [start, start+T); return the normed hidden (B, T, D).

        A full pass must continue the cache (start <= cache.length) and sets cache.length = start + T; with
        keep_features() on, a full pass of batch 1 also stores its normed hidden states at those positions.
        A partial pass (a self-draft) may run ahead of cache.length; the verifying full pass rewrites its slots.
        With keep_layer_features() on, a full pass of batch 1 also stores the residual streams after those layers.
        """
        steps = tokens.shape[1] if inputs is None else inputs.shape[1]
        end = start + steps
        full = layers is None
        if full and start > cache.length:
            raise ValueError(f"a full forward at position {start} would leave a gap after cache length {cache.length}")
        # (B, T, D); the layers update x in place, so given inputs are copied
        x = self.embed(tokens).to(self.dtype) if inputs is None else inputs.to(self.dtype, copy=True)
        if inputs is None and self.config.embedding_scale is not None:
            x = x * torch.tensor(self.config.embedding_scale, dtype=x.dtype)  # Gemma: sqrt(D), rounded to x's dtype
        order = range(self.config.num_layers) if full else list(layers)  # read twice below
        kept = self.layer_features if full and self.layer_features is not None else None
        kept = kept if kept is not None and kept.fits(end, x.shape[0]) else None
        if self.runner.fuses(ModelTensors(self), steps, x.dtype, cache, x.shape[0]):  # decode steps, verify passes
            rope = self.rope(start, end, x.dtype, local=None)  # (T, W) each: every kind of layer's rotary table
            capture = kept.capture(start, end) if kept is not None else None
            x = self.runner.layers(x[0], order, start, cache, rope, capture)  # (T, D): the layers in fused C calls
            normed = self.runner.norm(x, self.norm.weight)  # (T, D): the final norm in the same C library, one call
            hidden = (normed if normed is not None else self.norm(x))[None]  # (1, T, D)
        else:
            config = self.config
            rope = self.rope(start, end, x.dtype)
            local_rope = self.rope(start, end, x.dtype, local=True) if self.inv_freq_local is not None else rope
            masks = {window: self.mask(start, steps, window) for window in {config.window(i) for i in order}}
            for layer in order:
                layer_rope = local_rope if config.local_rope(layer) else rope
                x = self.layers[layer](x, layer, start, cache, layer_rope, masks[config.window(layer)])
                if kept is not None:
                    kept.write(layer, start, x)
            hidden = self.norm(x)  # (B, T, D)
        if full:
            cache.length = end
        if full and self.features is not None and hidden.shape[0] == 1 and end <= self.features.shape[0]:
            self.features[start:end] = hidden[0]
        return hidden

    def forward_logits(self, tokens: torch.Tensor, start: int, cache: KVCache,
                       parents: list[int] | None = None) -> torch.Tensor:
        """logits(forward(tokens, start, cache)): (B, T, V) for tokens (B, T), every layer. A decode step or verify
        pass that the fused kernel runs goes through embedding, layers, final norm and head in one C call: the same
        numbers, without Python between them.

        `parents` makes the rows a token tree (only where kernel_glue.verifies_trees()): row t continues row
        parents[t] (-1: the cache) at position start + its depth and sees only the rows on its path; its keys/values
        go to slot start + t, and keep_rows() then moves the accepted path's into place."""
        # the static step computes the Llama layout only; other families take their eager passes
        kept = self.layer_features
        if (parents is None and kept is None and self.config.llama_layout
                and (self.inv_freq.device.type != "cpu" or _STATIC_ON_CPU)):
            steps = static_steps(self, cache)  # the GPU's graph-captured step (edge/model/static_step.py)
            if steps is not None and tokens.shape[0] == 1 and tokens.shape[1] <= steps.max_rows:
                if start > cache.length:
                    raise ValueError(f"a full forward at position {start} would leave a gap after cache length "
                                     f"{cache.length}")
                logits = steps.logits(tokens, start).clone()  # (T, V)
                cache.length = start + tokens.shape[1]
                return logits[None]  # (1, T, V)
        end = start + tokens.shape[1]
        capture = kept.capture(start, end) if kept is not None and kept.fits(end, tokens.shape[0]) else None
        stepped = self.runner.step(ModelTensors(self), tokens, start, cache, parents, capture)
        if stepped is None:
            if parents is not None:
                raise ValueError("token trees run on edge's fused CPU step, which this model and cache do not use")
            return self.logits(self(tokens, start, cache))
        hidden, logits = stepped  # (T, D), (T, V)
        cache.length = end
        if self.features is not None and end <= self.features.shape[0]:
            self.features[start:end] = hidden
        return logits[None]  # (1, T, V)

    def logits(self, hidden: torch.Tensor, vocab_subset: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (B, T, D) -> logits (B, T, V), or (B, T, len(vocab_subset)) over those token ids only."""
        if vocab_subset is None and self.packed_head is not None:
            flat = hidden.reshape(-1, hidden.shape[-1]).float()  # (B*T, D)
            vocab = self.config.vocab_size
            out = self.runner.packed_head(flat, self.packed_head, vocab)  # (B*T, V); None without the kernel
            if out is not None:
                return softcapped(out.view(*hidden.shape[:-1], vocab), self.config)  # (B, T, V)
        weight = self.head_weight  # (V, D)
        if vocab_subset is not None:
            weight = weight.index_select(0, vocab_subset)  # (V', D)
        # a 2-D matmul: a strided 3-D input (e.g. hidden[:, -1:]) would make torch copy the whole weight
        flat = hidden.reshape(-1, hidden.shape[-1])  # (B*T, D)
        out = self.runner.linear(flat, weight.contiguous(), None)
        return softcapped(out.view(*hidden.shape[:-1], weight.shape[0]), self.config)  # (B, T, V')

    def rope(self, start: int, end: int, dtype: torch.dtype,
             local: bool | None = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, R) for positions [start, end) (R: the rotary dims; `local`: the local layers' base), or with
        local=None every kind side by side as the fused C calls read them: the global layers' R, then the local
        layers' R (Gemma 3). Sliced from one table per dtype that grows as positions do (the same elementwise float32
        math as computing them per call, so the same values, without the small ops)."""
        table = self._rope_tables.get(dtype)
        if table is None or table[0].shape[0] < end or table[0].device != self.inv_freq.device:
            size = max(end, 2 * table[0].shape[0] if table is not None else 256)
            positions = torch.arange(size, device=self.inv_freq.device, dtype=torch.float32)  # (S,)
            kinds = [(self.inv_freq, attention_factor(self.config))]  # LongRoPE's factor on the global layers'
            if self.inv_freq_local is not None:
                kinds.append((self.inv_freq_local, 1.0))
            tables = []
            for inv_freq, factor in kinds:
                angles = positions[:, None] * inv_freq[None, :]  # (S, R/2)
                angles = torch.cat((angles, angles), dim=-1)  # (S, R)
                cos, sin = angles.cos(), angles.sin()
                tables.append((cos * factor, sin * factor) if factor != 1.0 else (cos, sin))
            table = self._rope_tables[dtype] = tuple(torch.cat(parts, dim=-1).to(dtype)
                                                     for parts in zip(*tables))  # cos, sin (S, R or 2R)
        rotary = 2 * self.inv_freq.shape[0]
        columns = slice(None) if local is None else slice(rotary, None) if local else slice(0, rotary)
        cos, sin = table
        return cos[start:end, columns], sin[start:end, columns]

    def mask(self, start: int, steps: int, window: int | None) -> torch.Tensor | None:
        """Boolean (T, start+T) mask of a layer with `window`, True where a query may attend; None when plain causal
        attention is exact."""
        end = start + steps
        if window is None or end <= window:
            if start == 0 or steps == 1:
                return None  # prefill from 0 (is_causal) or a single query attending to everything before it
        device = self.inv_freq.device
        query_pos = torch.arange(start, end, device=device)[:, None]  # (T, 1)
        key_pos = torch.arange(end, device=device)[None, :]  # (1, S)
        allowed = key_pos <= query_pos  # (T, S)
        if window is not None:
            allowed &= key_pos > query_pos - window
        return allowed


def softcapped(logits: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """c * tanh(logits / c) where the config caps the logits (final_logit_softcapping), else the logits as they are."""
    cap = config.final_logit_softcapping
    return logits if cap is None else torch.tanh(logits / cap) * cap


def keep_features(model: Transformer, max_len: int) -> torch.Tensor:
    """From now on `model` stores the normed hidden state of every position a full pass computes, in a (max_len, D)
    buffer indexed by position (what a feature drafter drafts from). Like the KV cache, the slots of rejected drafts
    are rewritten by the next full pass; positions below cache.length always hold this sequence's."""
    if model.features is None or model.features.shape[0] < max_len:
        model.features = torch.zeros(max_len, model.config.hidden_size, dtype=model.dtype, device=model.device)
    return model.features


def keep_rows(model: Transformer, start: int, rows: list[int], cache: KVCache) -> None:
    """After a token tree's pass from `start`: move the keys/values (and kept features of both kinds) of pass rows
    `rows` (increasing, the accepted path from the first row) to slots start, start + 1, ..., and set the cache's
    length to just past them."""
    cache.keep_rows(start, rows)
    if model.features is not None:
        keep_slots(model.features, start, rows)
    if model.layer_features is not None:
        keep_slots(model.layer_features.rows, start, rows)
    cache.length = start + len(rows)


def held_bytes(modules: list[nn.Module], extra: list = (), seen: set[int] | None = None) -> int:
    """Bytes of the modules' weights (parameters, persistent buffers, a block matrix's packed segments) and of `extra`
    tensors or BlockMatrix objects, each storage counted once (into `seen`)."""
    seen = set() if seen is None else seen
    tensors: list[torch.Tensor] = []
    for root in modules:
        for module in root.modules():
            tensors += list(module.parameters(recurse=False))
            tensors += [t for name, t in module.named_buffers(recurse=False)
                        if name not in module._non_persistent_buffers_set]
            if isinstance(module, (BlockLinear, BlockEmbedding)):
                tensors += [packed for _, _, packed in module.matrix.segments]
    for item in extra:
        if isinstance(item, BlockMatrix):
            tensors += [packed for _, _, packed in item.segments]
        elif isinstance(item, torch.Tensor):
            tensors.append(item)
    total = 0
    for tensor in tensors:
        key = tensor.data_ptr()
        if key not in seen and not tensor.is_meta:
            seen.add(key)
            total += tensor.nbytes
    return total


def _storages(modules: list[nn.Module]) -> set[int]:
    seen: set[int] = set()
    held_bytes(modules, seen=seen)
    return seen
