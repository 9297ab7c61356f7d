"""The Llama-family transformer in one file: Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM, TinyLlama.

Family differences are flags of `ModelConfig` (qkv bias, q/k norm, sliding window, tied head), not subclasses.

    tokens (B, T) at positions [start, start+T)
      -> embed                                       (B, T, D)
      -> for i in layers (all, a range, or any subset):
           x = x + Attention(RMSNorm(x))             writes K/V of layer i at [start, start+T)
           x = x + FeedForward(RMSNorm(x))
      -> RMSNorm                                     forward() returns this hidden state
      -> lm_head, optionally only rows `vocab_subset` logits() returns (B, T, V) or (B, T, |subset|)

Running a subset of layers is how self-speculative drafters (early exit, layer skip) share the target's weights
and KV cache; computing logits over a subset of the vocabulary is how a trimmed drafter head works.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from edge.model.config import ModelConfig
from edge.errors import UnsupportedModelError
from edge.model.block_weights import BlockEmbedding, BlockLinear
from edge.model.kv_cache import KVCache, keep_slots
from edge.model.packed_weights import PackedLinear
from edge.model.rope import apply_rope, inverse_frequencies
from kernels.block_formats import BlockMatrix
from kernels.cpu_matmul import ROWWISE_MAX_ROWS
from kernels.fused_model import FusedWeights
from kernels.records import DraftRequest, KernelDraft, KernelHead, ModelEnds


FUSED_CHUNK = 128  # longer passes through the fused kernel (prompts) run in chunks of rows: linear scratch memory
TREE_ROWS = 64  # the most rows of a token tree's verify pass (kernels/csrc/attention.c TREE_ROWS)


class Linear(nn.Linear):
    """nn.Linear that runs small batches of rows through a batch-invariant matmul when one is set.

    With `rowwise` set (kernels.cpu_matmul.RowwiseMatmul), any call with at most `max_rows` rows computes each row
    exactly as a 1-row call would: a (k + 1)-token verify pass then reproduces k + 1 decode steps bit for bit."""

    rowwise = None
    max_rows = ROWWISE_MAX_ROWS

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:  # on "meta" there is nothing to initialise (and torch would import dynamo to try)
            super().reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.rowwise, self.max_rows)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rowwise, max_rows: int) -> torch.Tensor:
    """x @ weight.T + bias: through the batch-invariant kernel for up to `max_rows` rows, and for any number of rows
    of 16-bit weights (the kernel widens them in registers, several times faster than torch widening a copy); torch
    otherwise."""
    rows = x.numel() // x.shape[-1]
    if (rowwise is not None and x.dtype == torch.float32
            and (rows <= max_rows or weight.dtype != torch.float32 and rowwise.supports(weight, bias))):
        return rowwise(x, weight, bias)
    if weight.dtype != x.dtype:  # weights stored in bfloat16 for float32 compute: widen for this call only
        weight = weight.to(x.dtype)
    return F.linear(x, weight, bias)


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
    def __init__(self, config: ModelConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.sliding_window = config.sliding_window
        self.wqkv = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.qkv_bias, device=device)
        self.wo = Linear(config.q_size, config.hidden_size, bias=config.o_bias, device=device)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device) if config.qk_norm else None

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

        # a quantized cache may append and attend in place with a kernel: (1, H, T, Dh), each query computed alone
        fused = getattr(cache, "fused_attention", None)
        out = fused(layer, start, q, k, v, self.sliding_window) if fused is not None else None
        if out is None:
            keys, values = cache.write(layer, start, k, v)  # (B, Hkv, start+T, Dh) each
            rowwise = self.wqkv.rowwise
            if rowwise is not None and batch == 1 and steps <= self.wqkv.max_rows and q.dtype == torch.float32:
                out = rowwise.attention(q, keys, values, start, self.sliding_window)  # (1, H, T, Dh), batch-invariant
            else:
                causal_prefill = mask is None and steps > 1  # start == 0, no window: plain causal mask
                out = F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, is_causal=causal_prefill,
                    enable_gqa=self.num_kv_heads != self.num_heads,
                )  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(batch, steps, self.q_size)  # (B, T, H*Dh)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, config: ModelConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.w_gate_up = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias, device=device)
        self.w_down = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).split(self.intermediate_size, dim=-1)  # (B, T, I) each
        return self.w_down(F.silu(gate) * up)  # (B, T, D)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device)
        self.attn = Attention(config, device)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device)
        self.ffn = FeedForward(config, device)

    def forward(self, x, layer, start, cache, rope, mask) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), layer, start, cache, rope, mask)
        return x + self.ffn(self.ffn_norm(x))

    def kernel_tensors(self, matrix_type: type, matrix: str) -> tuple | None:
        """This layer's 12 tensors in the fused C table's order (kernels.fused_model.TABLE_KINDS), None where one is
        absent; the matrices are the tensors named `matrix` of its four `matrix_type` projections. None when a
        projection is another module."""
        attn, ffn = self.attn, self.ffn
        projections = (attn.wqkv, attn.wo, ffn.w_gate_up, ffn.w_down)
        if not all(isinstance(m, matrix_type) for m in projections):
            return None
        wqkv, wo, gate_up, down = (getattr(m, matrix) for m in projections)
        q_norm, k_norm = (norm.weight if norm is not None else None for norm in (attn.q_norm, attn.k_norm))
        return (self.attn_norm.weight, wqkv, attn.wqkv.bias, q_norm, k_norm, wo, attn.wo.bias,
                self.ffn_norm.weight, gate_up, ffn.w_gate_up.bias, down, ffn.w_down.bias)


def _storages(modules: list[nn.Module]) -> set[int]:
    seen: set[int] = set()
    _held_bytes(modules, seen=seen)
    return seen


def _held_bytes(modules: list[nn.Module], extra: list = (), seen: set[int] | None = None) -> int:
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


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str | None = None) -> None:
        """`device="meta"` builds the structure without memory (the loader then assigns the checkpoint's tensors)."""
        super().__init__()
        self.config = config
        meta = torch.device(device).type == "meta" if device is not None else False
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, device=device,  # (no init on meta)
                                  _weight=torch.empty(config.vocab_size, config.hidden_size, device=device) if meta
                                  else None)
        self.layers = nn.ModuleList(Block(config, device) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device)
        self.lm_head = (None if config.tie_word_embeddings
                        else Linear(config.hidden_size, config.vocab_size, bias=False, device=device))
        self.register_buffer("inv_freq", inverse_frequencies(config).to(device), persistent=False)  # (Dh/2,)
        self.rowwise = None  # the batch-invariant matmul, when use_rowwise_matmul() set one
        self.rowwise_max_rows = ROWWISE_MAX_ROWS
        self.compute_dtype: torch.dtype | None = None  # set by store_weights(): activations wider than the weights
        self._fused_weights: FusedWeights | bool | None = None  # made at first use; False: not fusable
        # "int8": set by edge.model.packed_weights.quantize_weights; "blocks": a GGUF file's own formats
        # (edge/sources/gguf_weights.py), or --weights int4 (edge.model.packed_weights)
        self.packed_format: str | None = None
        self.packed_head = None  # the head in a packed format: int8 bytes, or a BlockMatrix
        self.features: torch.Tensor | None = None  # (max_len, D) when kept: see keep_features()
        self._rope_tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # cos, sin (S, Dh) each

    @property
    def device(self) -> torch.device:
        return self.inv_freq.device

    def weight_bytes(self) -> int:
        """Bytes of every weight as held: parameters and buffers, packed and block matrices (each storage once)."""
        return _held_bytes([self]) + _held_bytes([], extra=[self.packed_head], seen=_storages([self]))

    def layers_weight_bytes(self) -> int:
        """Bytes of the decoder layers' weights as held."""
        return _held_bytes(list(self.layers))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of activations and of the KV cache (the weights', unless store_weights() narrowed them)."""
        return self.compute_dtype or self.embed.weight.dtype

    def store_weights(self, dtype: torch.dtype) -> None:
        """Keep every weight (matrices, embedding, norms; not biases) in `dtype` (bfloat16) while computing in the
        current dtype: half the weight memory. Small calls read the narrow matrices directly (the batch-invariant
        kernel widens them in registers); larger ones widen a copy per call; norms promote to the compute dtype."""
        self.compute_dtype = self.dtype
        self._fused_weights = None  # the pointers change: found again at the next forward
        for module in self.modules():
            weight = getattr(module, "weight", None)
            if isinstance(weight, nn.Parameter):
                module.weight = nn.Parameter(weight.detach().to(dtype), requires_grad=False)
        if self.rowwise is not None:
            self.use_rowwise_matmul(self.rowwise, self.rowwise_max_rows)  # re-check the kernel supports them

    def new_cache(self, max_len: int) -> KVCache:
        """A KV cache for `max_len` positions in this model's dtype and device."""
        return KVCache.for_model(self.config, max_len, dtype=self.dtype, device=self.device)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight  # (V, D)

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
        """
        steps = tokens.shape[1] if inputs is None else inputs.shape[1]
        end = start + steps
        full = layers is None
        if full and start > cache.length:
            raise ValueError(f"a full forward at position {start} would leave a gap after cache length {cache.length}")
        # (B, T, D); the layers update x in place, so given inputs are copied
        x = self.embed(tokens).to(self.dtype) if inputs is None else inputs.to(self.dtype, copy=True)
        rope = self._rope(start, end, x.dtype)
        order = range(self.config.num_layers) if full else layers
        if self._can_fuse(x.shape[0], x.shape[1], x.dtype, cache):  # decode steps, verify passes: one C call
            if end > cache.max_len:
                raise ValueError(f"KV cache holds {cache.max_len} positions; writing up to {end} does not fit")
            fused = self._fused_weights
            x = x[0].contiguous()  # (T, D), updated in place layer by layer
            cos, sin = rope
            for first in range(0, steps, FUSED_CHUNK):  # a prompt in chunks: each row's operations are unchanged
                last = min(first + FUSED_CHUNK, steps)
                fused.layers(x[first:last], order, start + first, cache.kernel_cache(),
                             (cos[first:last], sin[first:last]))
            normed = fused.norm(x, self.norm.weight)  # (T, D): the final norm in the same C library, one call
            hidden = (normed if normed is not None else self.norm(x))[None]  # (1, T, D)
        else:
            mask = self._mask(start, steps)
            for layer in order:
                x = self.layers[layer](x, layer, start, cache, rope, mask)
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

        `parents` makes the rows a token tree (only where verifies_trees()): row t continues row parents[t] (-1: the
        cache) at position start + its depth and sees only the rows on its path; its keys/values go to slot
        start + t, and keep_rows() then moves the accepted path's into place."""
        steps = tokens.shape[1]
        end = start + steps
        fused = (steps <= (FUSED_CHUNK if parents is None else min(FUSED_CHUNK, TREE_ROWS)) and start <= cache.length
                 and end <= cache.max_len and self._can_fuse(tokens.shape[0], steps, self.dtype, cache))
        stepped = self._fused_step(tokens[0], start, cache, parents) if fused else None
        if stepped is None:
            if parents is not None:
                raise ValueError("token trees run on edge's fused CPU step, which this model and cache do not use")
            return self.logits(self(tokens, start, cache))
        hidden, logits = stepped  # (T, D), (T, V)
        cache.length = end
        if self.features is not None and end <= self.features.shape[0]:
            self.features[start:end] = hidden
        return logits[None]  # (1, T, V)

    def verifies_trees(self, cache: KVCache, rows: int = 2) -> bool:
        """Whether a token tree of `rows` rows can be verified in one pass (forward_logits(parents=...)): the fused
        CPU step over this cache."""
        return (rows <= min(FUSED_CHUNK, TREE_ROWS) and self._can_fuse(1, rows, self.dtype, cache)
                and self._fused_weights.reads(self._kernel_ends()))

    def keep_rows(self, start: int, rows: list[int], cache: KVCache) -> None:
        """After a token tree's pass from `start`: move the keys/values (and kept features) of pass rows `rows`
        (increasing, the accepted path from the first row) to slots start, start + 1, ..., and set the cache's
        length to just past them."""
        cache.keep_rows(start, rows)
        if self.features is not None:
            keep_slots(self.features, start, rows)
        cache.length = start + len(rows)

    def keep_features(self, max_len: int) -> torch.Tensor:
        """From now on store the normed hidden state of every position a full pass computes, in a (max_len, D)
        buffer indexed by position (what a feature drafter drafts from). Like the KV cache, the slots of rejected
        drafts are rewritten by the next full pass; positions below cache.length always hold this sequence's."""
        if self.features is None or self.features.shape[0] < max_len:
            self.features = torch.zeros(max_len, self.config.hidden_size, dtype=self.dtype, device=self.device)
        return self.features

    def logits(self, hidden: torch.Tensor, vocab_subset: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (B, T, D) -> logits (B, T, V), or (B, T, len(vocab_subset)) over those token ids only."""
        if vocab_subset is None and self.packed_head is not None and self.rowwise is not None:
            flat = hidden.reshape(-1, hidden.shape[-1]).float()  # (B*T, D)
            vocab = self.config.vocab_size
            if isinstance(self.packed_head, BlockMatrix):
                return self.rowwise.blocks(flat, self.packed_head).view(*hidden.shape[:-1], vocab)  # (B, T, V)
            return self.rowwise.quantized(flat, self.packed_head, self.packed_format, vocab).view(
                *hidden.shape[:-1], vocab)  # (B, T, V)
        weight = self.head_weight  # (V, D)
        if vocab_subset is not None:
            weight = weight.index_select(0, vocab_subset)  # (V', D)
        # a 2-D matmul: a strided 3-D input (e.g. hidden[:, -1:]) would make torch copy the whole weight
        flat = hidden.reshape(-1, hidden.shape[-1])  # (B*T, D)
        out = linear(flat, weight.contiguous(), None, self.rowwise, self.rowwise_max_rows)
        return out.view(*hidden.shape[:-1], weight.shape[0])  # (B, T, V')

    def _can_fuse(self, batch: int, rows: int, dtype: torch.dtype, cache: KVCache) -> bool:
        """Whether this pass can run its layers in one fused C call: rows of batch 1 in float32 (up to
        rowwise_max_rows with float32 weights, any number with 16-bit or packed ones), a float32 or hierarchical KV
        cache (cache.kernel_cache()), every layer in a form the kernel reads."""
        if self.rowwise is None or batch != 1 or dtype != torch.float32:
            return False
        if self._fused_weights is None or (self._fused_weights and self._fused_weights.replaced()):
            self._fused_weights = self._build_fused_weights() or False  # first use, or the weights were replaced
        kernel_cache = getattr(cache, "kernel_cache", None)
        return (self._fused_weights is not False and self._fused_weights.fuses(rows, self.rowwise_max_rows)
                and kernel_cache is not None and kernel_cache() is not None)

    def _build_fused_weights(self) -> FusedWeights | None:
        """The layers handed to the fused C calls, or None where one is not a Block of Linear projections
        (PackedLinear ones when packed) or holds weights the kernel does not read (offloaded, QuantizedLinear)."""
        matrix_type, matrix = {"blocks": (BlockLinear, "table_entry"), None: (Linear, "weight")}.get(
            self.packed_format, (PackedLinear, "packed"))
        tensors = [block.kernel_tensors(matrix_type, matrix) if isinstance(block, Block) else None
                   for block in self.layers]
        if None in tensors:
            return None
        last = self.layers[-1]
        windows = [block.attn.sliding_window or 0 for block in self.layers]
        # replaced when the last layer, or its first matrix, is not the one the pointers were taken from
        slots = last.attn.wqkv._buffers if matrix == "table_entry" else last.attn.wqkv._parameters
        watch = ((self.layers._modules, str(len(self.layers) - 1)), (slots, matrix))
        return FusedWeights.build(self.rowwise, self.config.shape(), tensors, windows, self.packed_format, watch)

    @property
    def _fused_format(self) -> str | None:
        """The format the fused C calls read the layers in ("float32", "bfloat16", "float16", "int8", "blocks"), None
        before any fused pass or where they do not read them."""
        return self._fused_weights.format if self._fused_weights else None

    def _fused_step(self, tokens: torch.Tensor, start: int, cache: KVCache,
                    parents: list[int] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """tokens (T,) through the whole model in one C call -> hidden (T, D), logits (T, V); None where the kernel
        does not read the embedding, final norm or head."""
        tree = None if parents is None else torch.tensor(parents, dtype=torch.int64)  # (T,)
        end = start + tokens.shape[0]
        rope = self._rope(start, end, torch.float32) if parents is None else self._tree_rope(start, parents)
        return self._fused_weights.step(self._kernel_ends(), tokens, start, cache.kernel_cache(), rope, tree)

    def _kernel_ends(self, head: KernelHead | None = None) -> ModelEnds:
        """The embedding, final norm and `head` (default: this model's) as a whole pass in one C call reads them."""
        head = head if head is not None else self.kernel_head()
        if isinstance(self.embed, BlockEmbedding):
            return ModelEnds(self.embed.table_entry, self.norm.weight, head, embed_format="blocks")
        return ModelEnds(self.embed.weight, self.norm.weight, head)

    def kernel_head(self, rows: int | None = None) -> KernelHead:
        """This head as the fused C calls read it: the packed one when there is one and every row is wanted (as
        logits() does), else the leading `rows` float rows (a draft vocabulary padded beyond the target's)."""
        if isinstance(self.packed_head, BlockMatrix) and rows in (None, self.config.vocab_size):
            return KernelHead(self.packed_head.table_entry, self.config.vocab_size, packed_format="blocks")
        if self.packed_head is not None and rows in (None, self.config.vocab_size):
            return KernelHead(self.packed_head, self.config.vocab_size, packed_format=self.packed_format)
        weight = self.head_weight if rows is None else self.head_weight[:rows]  # (V', D): leading rows, contiguous
        return KernelHead(weight, weight.shape[0])

    def draft_greedy(self, request: DraftRequest) -> KernelDraft | None:
        """request.k greedy draft tokens in one C call (kernels/records.py DraftRequest says what it asks: the tokens
        fed from its start, the layers, the head, a feature drafter's rows, the confidence stop, the runners-up), or
        None where that path is not available (then the caller drafts step by step). With every layer it sets the
        cache's length like a full pass over the rows it ran; a subset of layers (a self-draft) leaves it alone."""
        cache, start, fed, k = request.cache, request.start, len(request.tokens), request.k
        end = start + fed + k - 1
        if not self._can_fuse(1, fed, torch.float32, cache) or end > cache.max_len or start > cache.length:
            return None
        rope = self._rope(0, end, torch.float32)  # cos, sin (end, Dh) each, from position 0
        drafted = self._fused_weights.draft(self._kernel_ends(request.head), request, rope)
        if drafted is not None and request.layers is None:
            # the rows run: the fed tokens, then each drafted token but a full draft's last (a draft that stopped ran
            # its last to score the next)
            cache.length = start + fed + min(len(drafted.tokens), k - 1)
        return drafted

    def use_rowwise_matmul(self, matmul, max_rows: int = ROWWISE_MAX_ROWS) -> None:
        """Route every projection of up to `max_rows` rows through `matmul` (None: torch's matmul throughout)."""
        linears = [module for module in self.modules() if isinstance(module, Linear)]
        supported = matmul is not None and all(matmul.supports(m.weight, m.bias) for m in linears)
        if self.packed_format and not supported:
            raise UnsupportedModelError(f"this model's {self.packed_format} weights run only on edge's CPU kernel; "
                                        "keep it on the CPU")
        self.rowwise = matmul if supported else None
        self._fused_weights = None  # the fused calls run on this matmul: made again at the next pass
        for module in linears:
            module.rowwise, module.max_rows = self.rowwise, max_rows
        for module in self.modules():
            if isinstance(module, (PackedLinear, BlockLinear)):
                module.rowwise, module.max_rows = self.rowwise, max_rows
        self.rowwise_max_rows = max_rows

    def _rope(self, start: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, Dh) for positions [start, end), sliced from a table that grows as positions do (the
        same elementwise float32 math as computing them per call, so the same values, without the small ops)."""
        table = self._rope_tables.get(dtype)
        if table is None or table[0].shape[0] < end or table[0].device != self.inv_freq.device:
            size = max(end, 2 * table[0].shape[0] if table is not None else 256)
            positions = torch.arange(size, device=self.inv_freq.device, dtype=torch.float32)  # (S,)
            angles = positions[:, None] * self.inv_freq[None, :]  # (S, Dh/2)
            angles = torch.cat((angles, angles), dim=-1)  # (S, Dh)
            table = self._rope_tables[dtype] = (angles.cos().to(dtype), angles.sin().to(dtype))
        cos, sin = table
        return cos[start:end], sin[start:end]

    def _tree_rope(self, start: int, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, Dh) of a token tree's rows: row t is at position start + its depth (parents[t] is the row
        it continues, an earlier one, or -1)."""
        depths: list[int] = []
        for parent in parents:
            depths.append(depths[parent] + 1 if parent >= 0 else 0)
        cos, sin = self._rope(0, start + max(depths) + 1, torch.float32)  # (S, Dh) each
        rows = torch.tensor(depths) + start  # (T,) each row's position
        return cos[rows], sin[rows]  # (T, Dh) each

    def _mask(self, start: int, steps: int) -> torch.Tensor | None:
        """Boolean (T, start+T) mask, True where a query may attend; None when plain causal attention is exact."""
        window = self.config.sliding_window
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
