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

from typing import Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from edge.config import ModelConfig
from edge.errors import UnsupportedModelError
from edge.kv_cache import KVCache, keep_slots
from edge.rope import apply_rope, inverse_frequencies


FLOAT_WEIGHTS = (torch.float32, torch.bfloat16, torch.float16)  # what the kernel reads as floats
ROWWISE_MAX_ROWS = 16  # decode steps and verify passes (k + 1 <= 13 by default) use the batch-invariant matmul
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


class KernelDraft(NamedTuple):
    """What one-call greedy drafting returns: the tokens, and when asked each step's runner-up token and the
    probabilities [draft token's, runner-up's] (Transformer.draft_greedy)."""

    tokens: list[int]
    runners_up: list[int] | None = None
    probabilities: list[list[float]] | None = None


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
        self._fused_weights = None  # per-layer weight pointers for the fused C layer (False: not fusable)
        self._step = None  # (ModelView, pointers, tensors) for forward_logits, made by _step_view()
        self._fused_format = "float32"  # the layers' weights (16-bit ones are widened in the kernel; int8/int4 packed)
        self.packed_format: str | None = None  # "int8"/"int4": set by edge.packed_weights.quantize_weights
        self.packed_head: torch.Tensor | None = None  # the head packed in that format
        self.features: torch.Tensor | None = None  # (max_len, D) when kept: see keep_features()
        self._rope_tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # cos, sin (S, Dh) each

    @property
    def device(self) -> torch.device:
        return self.inv_freq.device

    def weight_bytes(self) -> int:
        """Bytes of every parameter and buffer (what the checkpoint's tensors occupy in memory)."""
        return sum(t.nbytes for t in self.state_dict().values())

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
            x = x[0].contiguous()  # (T, D), updated in place layer by layer
            cos, sin = rope
            for first in range(0, steps, FUSED_CHUNK):  # a prompt in chunks: each row's operations are unchanged
                last = min(first + FUSED_CHUNK, steps)
                self._fused_layers(x[first:last], order, start + first, cache, (cos[first:last], sin[first:last]))
            norm = self.norm.weight
            hidden = (self.rowwise.rms_norm(x, norm, self.norm.eps) if norm.dtype in FLOAT_WEIGHTS
                      else self.norm(x))[None]  # (1, T, D): the final norm in the same C library, one call
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
        view = self._step_view() if fused else None
        if view is None:
            if parents is not None:
                raise ValueError("token trees run on edge's fused CPU step, which this model and cache do not use")
            return self.logits(self(tokens, start, cache))
        tree = None
        if parents is None:
            cos, sin = self._rope(start, end, torch.float32)  # (T, Dh) each
        else:
            depths: list[int] = []
            for parent in parents:
                depths.append(depths[parent] + 1 if parent >= 0 else 0)
            cos, sin = self._rope(0, start + max(depths) + 1, torch.float32)
            rows = torch.tensor(depths) + start  # (T,) each row's position
            cos, sin, tree = cos[rows], sin[rows], torch.tensor(parents, dtype=torch.int64)  # (T, Dh) each, (T,)
        hidden, logits = self.rowwise.forward_step(view, tokens[0], start, self._layer_order(range(len(self.layers))),
                                                   cos, sin, cache.kernel_cache(), tree)  # (T, D), (T, V)
        cache.length = end
        if self.features is not None and end <= self.features.shape[0]:
            self.features[start:end] = hidden
        return logits[None]  # (1, T, V)

    def verifies_trees(self, cache: KVCache, rows: int = 2) -> bool:
        """Whether a token tree of `rows` rows can be verified in one pass (forward_logits(parents=...)): the fused
        CPU step over this cache."""
        return (rows <= min(FUSED_CHUNK, TREE_ROWS) and self._can_fuse(1, rows, self.dtype, cache)
                and self._step_view() is not None)

    def keep_rows(self, start: int, rows: list[int], cache: KVCache) -> None:
        """After a token tree's pass from `start`: move the keys/values (and kept features) of pass rows `rows`
        (increasing, the accepted path from the first row) to slots start, start + 1, ..., and set the cache's
        length to just past them."""
        cache.keep_rows(start, rows)
        if self.features is not None:
            keep_slots(self.features, start, rows)
        cache.length = start + len(rows)

    def _step_view(self):
        """The kernel's view of this model for forward_logits (kernels.cpu_matmul.ModelView), made once and again
        when the embedding, norm or head change; None when one of them is in a form the kernel does not read."""
        from kernels.cpu_matmul import ModelView, weight_format

        head = self.packed_head if self.packed_head is not None else self.head_weight
        embed, norm = self.embed.weight, self.norm.weight
        pointers = (head.data_ptr(), embed.data_ptr(), norm.data_ptr())
        if self._step is not None and self._step[1] == pointers:
            return self._step[0]
        if not (embed.dtype in FLOAT_WEIGHTS and norm.dtype in FLOAT_WEIGHTS and embed.is_contiguous()
                and head.is_contiguous() and (self.packed_head is not None or head.dtype in FLOAT_WEIGHTS)):
            return None
        config = self.config
        view = ModelView(
            D=config.hidden_size, H=config.num_heads, Hkv=config.num_kv_heads, Dh=config.head_dim,
            I=config.intermediate_size, V=config.vocab_size, eps=config.rms_norm_eps, scale=config.head_dim ** -0.5,
            format=weight_format(self._fused_format), embed_format=weight_format(embed.dtype),
            norm_format=weight_format(norm.dtype),
            head_format=weight_format(self.packed_format if self.packed_head is not None else head.dtype),
            weights=self._fused_table.data_ptr(), windows=self._fused_windows.data_ptr(), embed=pointers[1],
            norm=pointers[2], head=pointers[0])
        self._step = (view, pointers, (head, embed, norm))  # the tensors stay alive as long as the view
        return view

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
            return self.rowwise.quantized(flat, self.packed_head, self.packed_format, vocab).view(
                *hidden.shape[:-1], vocab)  # (B, T, V)
        weight = self.head_weight  # (V, D)
        if vocab_subset is not None:
            weight = weight.index_select(0, vocab_subset)  # (V', D)
        # a 2-D matmul: a strided 3-D input (e.g. hidden[:, -1:]) would make torch copy the whole weight
        flat = hidden.reshape(-1, hidden.shape[-1])  # (B*T, D)
        out = linear(flat, weight.contiguous(), None, self.rowwise, self.rowwise_max_rows)
        return out.view(*hidden.shape[:-1], weight.shape[0])

    def _can_fuse(self, batch: int, rows: int, dtype: torch.dtype, cache: KVCache) -> bool:
        """Whether this pass can run its layers in one fused C call (the batch-invariant kernel's fused_layers): rows
        of batch 1 in float32 (up to rowwise_max_rows with float32 weights, any number with 16-bit or packed ones), a
        float32 or hierarchical KV cache (cache.kernel_cache()), every layer in place."""
        if self.rowwise is None or batch != 1 or dtype != torch.float32:
            return False
        if self._fused_weights is None or (self._fused_weights is not False and self._weights_replaced()):
            self._fused_weights = self._fused_pointers()  # first use, or the weights were replaced since
        if rows > self.rowwise_max_rows and self._fused_format == "float32":
            return False  # a float32 prompt: torch's GEMM is faster (packed and 16-bit ones run in the kernel)
        kernel_cache = getattr(cache, "kernel_cache", None)
        return (self._fused_weights is not False and kernel_cache is not None and kernel_cache() is not None
                and self.config.head_dim <= 512)

    def _weights_replaced(self) -> bool:
        """Whether the last layer, or its first matrix, is not the one the pointers were taken from (a replaced
        module, or load_state_dict(assign=True)): dictionary lookups, cheaper than module attributes each step."""
        modules, key, block, parameters, name, pointer = self._watched
        return modules.get(key) is not block or parameters[name].data_ptr() != pointer

    def _fused_pointers(self) -> "list[tuple] | bool":
        """Each layer's 12 weight pointers for fused_layer_f32 (None where a tensor is absent), or False when some
        layer cannot be fused (narrow or offloaded weights)."""
        def pointer(tensor):
            return None if tensor is None else tensor.data_ptr()

        from edge.packed_weights import PackedLinear

        layers = []
        if not isinstance(self.layers[0], Block):
            return False
        if self.packed_format:  # packed int8/int4 matrices (uint8 bytes), float32 norms
            fused_format, matrix_type, matrix_dtype, norm_dtype = self.packed_format, PackedLinear, torch.uint8, \
                torch.float32
        else:
            matrix_type, matrix_dtype = Linear, self.layers[0].attn.wqkv.weight.dtype
            norm_dtype = matrix_dtype
            if matrix_dtype not in FLOAT_WEIGHTS:
                return False
            fused_format = str(matrix_dtype).removeprefix("torch.")  # 16-bit: stored narrow, computed in float32
        self._fused_format = fused_format
        matrix = "packed" if self.packed_format else "weight"
        for block in self.layers:
            if not isinstance(block, Block):
                return False
            attn, ffn = block.attn, block.ffn
            if not all(isinstance(m, matrix_type) for m in (attn.wqkv, attn.wo, ffn.w_gate_up, ffn.w_down)):
                return False
            tensors = [block.attn_norm.weight, getattr(attn.wqkv, matrix), attn.wqkv.bias,
                       attn.q_norm.weight if attn.q_norm is not None else None,
                       attn.k_norm.weight if attn.k_norm is not None else None, getattr(attn.wo, matrix),
                       attn.wo.bias, block.ffn_norm.weight, getattr(ffn.w_gate_up, matrix), ffn.w_gate_up.bias,
                       getattr(ffn.w_down, matrix), ffn.w_down.bias]
            # norms, matrices and biases (always float32) in the table's order
            expected = [norm_dtype, matrix_dtype, torch.float32, norm_dtype, norm_dtype, matrix_dtype, torch.float32,
                        norm_dtype, matrix_dtype, torch.float32, matrix_dtype, torch.float32]
            if any(t is not None and (t.dtype != dtype or not t.is_contiguous())
                   for t, dtype in zip(tensors, expected)):
                return False
            layers.append(tuple(pointer(t) for t in tensors))
        self._step = None  # the one-call step's view of the model: made again from these pointers
        self._fused_table = torch.tensor([[p or 0 for p in row] for row in layers], dtype=torch.int64)  # (L, 12)
        self._fused_windows = torch.tensor([block.attn.sliding_window or 0 for block in self.layers],
                                           dtype=torch.int64)  # (L,)
        self._layer_orders: dict[tuple[int, ...], torch.Tensor] = {}
        last = self.layers[-1]
        self._watched = (self.layers._modules, str(len(self.layers) - 1), last, last.attn.wqkv._parameters,
                         matrix, getattr(last.attn.wqkv, matrix).data_ptr())
        return layers

    def _fused_layers(self, x: torch.Tensor, order, start: int, cache: KVCache, rope) -> None:
        """Run the layers `order` over x (T, D) in place, in one C call."""
        config = self.config
        cos, sin = rope
        self.rowwise.layers(x, self._layer_order(order), self._fused_table, self._fused_windows,
                            (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                             config.intermediate_size), cos, sin, cache.kernel_cache(), start,
                            config.rms_norm_eps, config.head_dim ** -0.5, self._fused_format)

    def _layer_order(self, layers) -> torch.Tensor:
        """The int64 tensor (n,) of a layer set for the C calls, made once per set (all, or a self-draft's)."""
        key = tuple(layers)
        order = self._layer_orders.get(key)
        if order is None:
            order = self._layer_orders[key] = torch.tensor(key, dtype=torch.int64)  # (n,)
        return order

    def draft_greedy(self, tokens: list[int], start: int, cache: KVCache, k: int, *, layers: list[int] | None = None,
                     head_model: "Transformer | None" = None, features: torch.Tensor | None = None,
                     fc: torch.Tensor | None = None, vocab_size: int | None = None,
                     trimmed_head: tuple[torch.Tensor, torch.Tensor] | None = None,
                     stop_below: float | None = None, runners_up: bool = False) -> "KernelDraft | None":
        """k greedy draft tokens in one C call, or None where that path is not available (then the caller drafts
        step by step). Runs `tokens` at positions [start, start + T) through `layers` (default: all; a subset is a
        self-draft, which leaves cache.length alone like a partial forward), this model's norm, and
        the head of `head_model` (default: this model) with argmax; each later step runs the token just drafted.
        With `fc` (D, 2D) the rows are fc(cat(feature, embedding)) and the normed output feeds the next step as its
        feature (a feature drafter; `features` (T, D) for the first rows). `vocab_size` limits the argmax to the
        first rows of the head (a draft vocabulary padded beyond the target's). `trimmed_head` (weight (V', D), ids
        (V',)) replaces the head by some of its rows, each row's token id given (VocabTrim); otherwise a head_model with
        a packed head (edge/packed_weights.py) drafts through it, as its logits() do. `stop_below` stops
        before a token (not the first) whose probability is below it, so fewer than k may come back. With every layer
        it sets cache.length like a full pass over the rows it ran. `runners_up` also returns each step's second most
        likely token and both tokens' probabilities (what a token tree is built from)."""
        head_model = head_model or self
        end = start + len(tokens) + k - 1
        embed = head_model.embed.weight  # (V, D)
        packed_head = head_model.packed_head
        head_rows = head_model.config.vocab_size
        if trimmed_head is not None:
            head, head_ids = trimmed_head  # (V', D), (V',)
        elif packed_head is not None and vocab_size in (None, head_rows):
            head, head_ids = packed_head, None  # packed bytes (uint8)
        else:  # the leading rows of a padded head stay contiguous
            head, head_ids = head_model.head_weight[:vocab_size], None  # (V', D)
        if not self._can_fuse(1, len(tokens), torch.float32, cache):
            return None
        layer_dtype = torch.float32 if self.packed_format else getattr(torch, self._fused_format)  # norms, fc
        if (end > cache.max_len or start > cache.length or self.norm.weight.dtype != layer_dtype
                or (fc is not None and fc.dtype != layer_dtype) or embed.dtype not in FLOAT_WEIGHTS
                or head.dtype not in (*FLOAT_WEIGHTS, torch.uint8)
                or not (embed.is_contiguous() and head.is_contiguous())):
            return None
        config = self.config
        order = self._layer_order(range(config.num_layers) if layers is None else layers)
        cos, sin = self._rope(0, end, torch.float32)  # (end, Dh) each, from position 0
        drafted, second, probabilities = self.rowwise.draft_greedy(
            torch.tensor(tokens, dtype=torch.int64), features, (config.hidden_size, config.num_heads,
                                                                config.num_kv_heads, config.head_dim,
                                                                config.intermediate_size),
            order, self._fused_table, self._fused_windows, cos, sin, cache.kernel_cache(), start,
            config.rms_norm_eps, config.head_dim ** -0.5, self.norm.weight, fc, self._fused_format, embed, head, k,
            head_ids, stop_below, head_rows, head_model.packed_format, runners_up)
        if layers is None:  # rows run: the fed tokens, then each drafted token but a full draft's last (a draft that
            cache.length = start + len(tokens) + min(len(drafted), k - 1)  # stopped ran its last to score the next)
        return KernelDraft(drafted, second.tolist() if second is not None else None,
                           probabilities.tolist() if probabilities is not None else None)

    def use_rowwise_matmul(self, matmul, max_rows: int = ROWWISE_MAX_ROWS) -> None:
        """Route every projection of up to `max_rows` rows through `matmul` (None: torch's matmul throughout)."""
        from edge.packed_weights import PackedLinear

        linears = [module for module in self.modules() if isinstance(module, Linear)]
        supported = matmul is not None and all(matmul.supports(m.weight, m.bias) for m in linears)
        if self.packed_format and not supported:
            raise UnsupportedModelError(f"this model's {self.packed_format} weights run only on edge's CPU kernel; "
                                        "keep it on the CPU")
        self.rowwise = matmul if supported else None
        for module in linears:
            module.rowwise, module.max_rows = self.rowwise, max_rows
        for module in self.modules():
            if isinstance(module, PackedLinear):
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
