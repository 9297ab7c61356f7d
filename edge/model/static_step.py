"""The static decode step: a decode step, a verify pass or a draft step of a few rows, computed from buffers that
never move, so that on a CUDA GPU each is captured once in a CUDA graph and then replayed, without launch overhead.

    graphs = StepGraphs(model, cache)                 # where applies(model, cache): see below
    logits = graphs.logits(tokens, start)             # tokens (1, T), T <= MAX_ROWS -> (T, V): every layer
    logits = graphs.logits(tokens, start, layers=(0, 1, 2), draft=True)   # a self-draft's partial pass

One step reads its tokens and its first position from two device buffers (the position is never a Python number
inside the step), writes the rows' keys/values at positions [P, P + T) of the cache in place, attends over the
cache's positions [0, P + t] for row t, and writes the logits into a buffer of its own. Every buffer it allocates is
allocated again in the same order at each call, so the captured graph (one per row count, layer set and cache
view) replays it. Nothing in a step waits for the GPU; the caller reads the logits afterwards.

Arithmetic: activations in the model's 16-bit dtype, products accumulated in float32 (edge/kernels/step_kernels.py on
a GPU, or on the CPU through Triton's interpreter; the torch reference below otherwise), no float32 copy of any
weight. Each row is computed alone, in the same order whatever the number of rows, so a verify pass gives each row
exactly what a one-row decode step gives it and speculative decoding's greedy output is plain decoding's.

Where it applies: a 16-bit model of plain Blocks (no offloaded layers), float 16-bit projections or QuantizedLinear
(QuantSpec's draft), no sliding window, no kept features, a head of its own or tied (not packed), one sequence, and a
cache in the model's dtype or quantized int8 / hierarchical for keys and values alike. On a CUDA GPU that Triton
runs on this is the default (EDGE_STATIC_STEP=0 turns it off); on the CPU only EDGE_STATIC_STEP=1 turns it on (the
tests do, to check the step's logic where there is no GPU), and then no graph is captured.
"""

from __future__ import annotations

import gc
import os

import torch
import torch.nn.functional as F

from edge.kernels.dispatch import use_triton
from edge.kernels.kv_quant import PackedVectors, dequantize, quantize
from edge.kernels.quant import QuantizedLinear
from edge.kernels.quant_weight import QuantizedWeight
from edge.model.kv_cache import KVCache
from edge.model.linears import Linear
from edge.model.quantized_kv_cache import QuantizedKVCache

MAX_ROWS = 16  # the most rows of one step (edge/kernels/step_kernels.py MAX_ROWS)
SIXTEEN_BITS = (torch.float16, torch.bfloat16)
FLOAT_CACHE, INT8_CACHE, HIERARCHICAL, HIERARCHICAL_DRAFT = 3, 0, 1, 2  # the kernels' cache kinds


def applies(model, cache) -> bool:
    """Whether the static step runs `model`'s decode steps over `cache` (see the module docstring)."""
    setting = os.environ.get("EDGE_STATIC_STEP")
    if setting == "0":
        return False
    device = model.device
    if device.type == "cuda":
        if not use_triton(model.inv_freq):
            return False
    elif setting != "1":
        return False
    config = model.config
    head_dim = config.head_dim
    if model.dtype not in SIXTEEN_BITS or head_dim < 16 or head_dim & (head_dim - 1):
        return False
    if (config.sliding_window is not None and config.sliding_window < cache.max_len) or model.features is not None:
        return False
    if model.packed_head is not None or (model.lm_head is not None and not _projection(model.lm_head)):
        return False
    for block in model.layers:
        if not (hasattr(block, "attn") and hasattr(block, "ffn")):  # an offloaded layer streams in: eager
            return False
        if not all(_projection(linear) for linear in (block.attn.wqkv, block.attn.wo, block.ffn.w_gate_up,
                                                       block.ffn.w_down)):
            return False
    if type(cache) is KVCache:
        return cache.keys.shape[1] == 1 and cache.keys.dtype == model.dtype
    if type(cache) is QuantizedKVCache:
        return cache.formats in (("int8", "int8"), ("hierarchical", "hierarchical")) \
            and cache.keys_store.scale.shape[1] == 1
    return False


def _projection(module) -> bool:
    if isinstance(module, QuantizedLinear):
        weight = module.quantized
        group = weight.group_size
        return group >= (32 if weight.bits == 4 else 16) and not group & (group - 1)
    return isinstance(module, Linear) and module.weight.dtype in SIXTEEN_BITS


class StaticStep:
    """One model's step over one cache, from the buffers `tokens` (MAX_ROWS,) and `position` (1,) int32."""

    def __init__(self, model, cache) -> None:
        self.model, self.cache = model, cache
        config = model.config
        device = model.device
        self.kernels = None
        if use_triton(model.inv_freq):
            from edge.kernels import step_kernels  # imports triton: only where it runs

            self.kernels = step_kernels
        self.tokens = torch.zeros(MAX_ROWS, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.int32, device=device)
        positions = torch.arange(cache.max_len, device=device, dtype=torch.float32)  # (S,)
        angles = positions[:, None] * model.inv_freq[None, :]  # (S, Dh/2), the model's own float32 math
        angles = torch.cat((angles, angles), dim=-1)  # (S, Dh)
        self.cos, self.sin = angles.cos().contiguous(), angles.sin().contiguous()
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.eps = config.rms_norm_eps
        self.head = model.lm_head.weight if model.lm_head is not None else model.embed.weight  # (V, D)
        scales = getattr(cache, "key_scales", None)  # (L, Hkv, Dh) powers of two, on the device before any capture
        self.key_scales = None if scales is None else scales.to(device)

    # ---- the step ------------------------------------------------------------------------------------------

    def forward(self, rows: int, layers: tuple[int, ...] | None, draft: bool) -> torch.Tensor:
        """Logits (rows, V) of tokens[:rows] at positions [P, P + rows) through `layers` (None: all)."""
        model = self.model
        x = F.embedding(self.tokens[:rows], model.embed.weight).to(model.dtype)  # (T, D)
        order = range(model.config.num_layers) if layers is None else layers
        for index in order:
            block = model.layers[index]
            attention = block.attn
            qkv = self.linear(x, attention.wqkv, norm=block.attn_norm)  # (T, (H + 2 Hkv) Dh)
            if attention.q_norm is not None:  # Qwen3: the model's own norms over each head (torch)
                q = qkv[:, :self.q_size].view(rows, self.heads, self.head_dim)
                k = qkv[:, self.q_size:self.q_size + self.kv_size].view(rows, self.kv_heads, self.head_dim)
                q.copy_(attention.q_norm(q))
                k.copy_(attention.k_norm(k))
            fused_rope = self.kernels is not None and self.key_scales is None
            if not fused_rope:  # else the append and attention kernels rotate keys and queries as they read them
                self.rope(qkv)
                self.scale_keys(qkv, index)
            self.append(qkv[:, self.q_size:], index, fused_rope)
            out = self.attend(qkv, index, draft, fused_rope)  # (T, H Dh)
            x = self.linear(out, attention.wo, residual=x)
            if self.kernels is not None and getattr(block.ffn.w_gate_up, "bias", None) is None:
                hidden = self.linear(x, block.ffn.w_gate_up, norm=block.ffn_norm, glu_out=True)  # (T, I)
                x = self.linear(hidden, block.ffn.w_down, residual=x)
            else:
                gate_up = self.linear(x, block.ffn.w_gate_up, norm=block.ffn_norm)  # (T, 2 I)
                x = self.linear(gate_up, block.ffn.w_down, residual=x, glu=True)
        return self.linear(x, self.head, norm=model.norm)  # (T, V)

    # ---- the operations: the Triton kernels, or their torch reference -------------------------------------

    def norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.rms_norm(x, norm.weight, self.eps)
        x32 = x.float()
        return norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def linear(self, x: torch.Tensor, module, residual: torch.Tensor | None = None, glu: bool = False,
               norm=None, glu_out: bool = False) -> torch.Tensor:
        """module(x) (+ residual); glu: module(silu(x[:, :I]) * x[:, I:]); norm (an RMSNorm): module(norm(x)), the
        norm computed inside the matmul where the kernels run; glu_out (the kernels, no bias): silu(y[:, :I]) *
        y[:, I:] of y = module(x), in the matmul's epilogue. `module` a Linear, a QuantizedLinear or a bare (N, K)
        weight."""
        weight, bias = (module, None) if isinstance(module, torch.Tensor) else (None, module.bias)
        if isinstance(module, QuantizedLinear):
            weight = module.quantized
            padded = weight.shape[1]
            if x.shape[1] != (2 if glu else 1) * padded:  # the weight carries zero columns up to a whole group
                if glu:
                    x, glu = self._glu(x), False
                if norm is not None:
                    x, norm = self.norm(x, norm), None
                x = F.pad(x, (0, padded - x.shape[1]))
        elif weight is None:
            weight = module.weight
        fused = residual if bias is None else None
        if self.kernels is not None:
            out = self.kernels.linear(x, weight, fused, glu, norm=None if norm is None else (norm.weight, self.eps),
                                      glu_out=glu_out)
        else:
            inputs = self._glu(x) if glu else self.norm(x, norm) if norm is not None else x
            matrix = weight.dequantize() if isinstance(weight, QuantizedWeight) else weight
            out = inputs.float() @ matrix.float().T
            out = (out + fused.float() if fused is not None else out).to(x.dtype)
        if bias is not None:
            out = out + bias.to(out.dtype)
            out = out if residual is None else residual + out
        return out

    @staticmethod
    def _glu(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[1] // 2
        return (F.silu(x[:, :half].float()) * x[:, half:].float()).to(x.dtype)

    def rope(self, qkv: torch.Tensor) -> None:
        """Rotate the queries and keys of qkv (T, ...) in place, row t at position P + t."""
        heads = self.heads + self.kv_heads
        if self.kernels is not None:
            self.kernels.rope_(qkv, self.cos, self.sin, self.position, heads, self.head_dim)
            return
        rows = qkv.shape[0]
        positions = self.position.long() + torch.arange(rows, device=qkv.device)  # (T,)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (T, 1, Dh)
        x = qkv[:, :heads * self.head_dim].view(rows, heads, self.head_dim).float()
        half = self.head_dim // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        qkv[:, :heads * self.head_dim] = (x * cos + rotated * sin).to(qkv.dtype).view(rows, -1)

    def scale_keys(self, qkv: torch.Tensor, layer: int) -> None:
        """A cache with key scales (powers of two) stores keys / scales: queries are multiplied by them instead."""
        scales = self.key_scales
        if scales is None:
            return
        rows, group = qkv.shape[0], self.heads // self.kv_heads
        layer_scales = scales[layer]  # (Hkv, Dh)
        q = qkv[:, :self.q_size].view(rows, self.heads, self.head_dim)
        k = qkv[:, self.q_size:self.q_size + self.kv_size].view(rows, self.kv_heads, self.head_dim)
        q.mul_(layer_scales.repeat_interleave(group, 0).to(qkv.dtype))
        k.div_(layer_scales.to(qkv.dtype))

    def planes(self, layer: int) -> tuple[int, tuple, tuple]:
        """(append kind, keys' planes, values' planes) of one layer: (first, second, scale, low), (Hkv, S, ...)."""
        cache = self.cache
        if type(cache) is KVCache:
            keys, values = cache.keys[layer, 0], cache.values[layer, 0]
            return FLOAT_CACHE, (keys,) * 4, (values,) * 4

        def of(store) -> tuple:
            planes = tuple(p[layer, 0] for p in store.planes)
            scale = store.scale[layer, 0]
            return (planes[0], planes[-1], scale, store.low[layer, 0] if store.low is not None else scale)

        kind = INT8_CACHE if cache.formats[0] == "int8" else HIERARCHICAL
        return kind, of(cache.keys_store), of(cache.values_store)

    def append(self, kv: torch.Tensor, layer: int, rope: bool = False) -> None:
        """kv (T, 2 Hkv Dh): store row t's keys (rotated first: `rope`, the kernels only) and values at position
        P + t."""
        kind, keys, values = self.planes(layer)
        if self.kernels is not None:
            self.kernels.append(kv, keys, values, self.position, self.kv_heads, self.head_dim, kind,
                                (self.cos, self.sin) if rope else None)
            return
        rows = kv.shape[0]
        slots = self.position.long() + torch.arange(rows, device=kv.device)  # (T,)
        for planes, offset in ((keys, 0), (values, self.kv_size)):
            x = kv[:, offset:offset + self.kv_size].reshape(rows, self.kv_heads, self.head_dim).transpose(0, 1)
            if kind == FLOAT_CACHE:
                planes[0].index_copy_(1, slots, x.to(planes[0].dtype))
                continue
            packed = quantize(x, "int8" if kind == INT8_CACHE else "hierarchical")  # (Hkv, T, ...)
            planes[0].index_copy_(1, slots, packed.planes[0])
            if kind == HIERARCHICAL:
                planes[1].index_copy_(1, slots, packed.planes[1])
                planes[3].index_copy_(1, slots, packed.low)
            planes[2].index_copy_(1, slots, packed.scale)

    def attend(self, qkv: torch.Tensor, layer: int, draft: bool, rope: bool = False) -> torch.Tensor:
        """Row t's queries (rotated as they are read: `rope`, the kernels only) over cached positions [0, P + t] ->
        (T, H Dh) in the model's dtype."""
        kind, keys, values = self.planes(layer)
        if kind == HIERARCHICAL and draft:
            kind = HIERARCHICAL_DRAFT
        if self.kernels is not None:
            return self.kernels.attend(qkv, keys, values, self.position, self.heads, self.kv_heads, self.head_dim,
                                       kind, qkv.dtype, rope=(self.cos, self.sin) if rope else None)
        rows, group = qkv.shape[0], self.heads // self.kv_heads
        k, v = (self._dequantized(planes, kind).repeat_interleave(group, 0) for planes in (keys, values))  # (H, S, D)
        q = qkv[:, :self.q_size].view(rows, self.heads, self.head_dim).transpose(0, 1).float()  # (H, T, D)
        scores = (q @ k.transpose(1, 2)) * self.head_dim ** -0.5  # (H, T, S)
        last = self.position.long() + torch.arange(rows, device=qkv.device)  # (T,)
        seen = torch.arange(k.shape[1], device=qkv.device)[None, :] <= last[:, None]  # (T, S)
        weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
        return (weights @ v).transpose(0, 1).reshape(rows, self.q_size).to(qkv.dtype)

    @staticmethod
    def _dequantized(planes: tuple, kind: int) -> torch.Tensor:
        first, second, scale, low = planes
        if kind == FLOAT_CACHE:
            return first.float()
        if kind == INT8_CACHE:
            return dequantize(PackedVectors("int8", (first,), scale))
        return dequantize(PackedVectors("hierarchical", (first, second), scale, low),
                          draft=kind == HIERARCHICAL_DRAFT)


class StepGraphs:
    """The static step of `model` over `cache`, captured in a CUDA graph per (rows, layers, draft view) at its first
    use and replayed after; on the CPU the same step runs directly."""

    max_rows = MAX_ROWS

    def __init__(self, model, cache) -> None:
        self.step = StaticStep(model, cache)
        self.cache = cache
        self.capture = model.device.type == "cuda"
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def logits(self, tokens: torch.Tensor, start: int, layers: list[int] | None = None,
               draft: bool = False) -> torch.Tensor:
        """tokens (1, T) at positions [start, start + T) -> logits (T, V), valid until the next call."""
        rows = tokens.shape[-1]
        if rows > MAX_ROWS:
            raise ValueError(f"the static step runs at most {MAX_ROWS} rows, got {rows}")
        if start + rows > self.cache.max_len:
            raise ValueError(f"KV cache holds {self.cache.max_len} positions; writing up to {start + rows} does "
                             "not fit")
        self.step.tokens[:rows].copy_(tokens.reshape(-1), non_blocking=True)
        self.step.position.fill_(start)
        key = (rows, None if layers is None else tuple(layers), draft)
        if not self.capture:
            return self.step.forward(*key)
        held = self.graphs.get(key)
        if held is None:
            held = self.graphs[key] = self._capture(lambda: self.step.forward(*key))
        graph, out = held
        graph.replay()
        return out

    def draft_greedy(self, token: int, start: int, k: int, layers: list[int] | None = None, draft: bool = False,
                     vocab: int | None = None) -> list[int]:
        """k greedy tokens after `token` at position `start`, each fed back on the device (one graph, one read of
        the tokens at the end): what k one-row steps and an argmax over the first `vocab` logits after each give."""
        key = ("chain", k, None if layers is None else tuple(layers), draft, vocab)
        if self.capture and key not in self.graphs:
            self._set(token, start)
            self.graphs[key] = self._capture(lambda: self._chain(*key[1:]))
        self._set(token, start)
        if not self.capture:
            return self._chain(*key[1:]).tolist()
        graph, out = self.graphs[key]
        graph.replay()
        return out.tolist()

    def _set(self, token: int, start: int) -> None:
        self.step.tokens[:1].fill_(token)
        self.step.position.fill_(start)

    def _chain(self, k: int, layers: tuple[int, ...] | None, draft: bool, vocab: int | None) -> torch.Tensor:
        drafted = []
        for _ in range(k):
            logits = self.step.forward(1, layers, draft)  # (1, V)
            best = logits[0, :vocab].argmax().view(1)
            self.step.tokens[:1].copy_(best)
            self.step.position.add_(1)
            drafted.append(best)
        self.step.position.sub_(k)
        return torch.cat(drafted)  # (k,)

    def _capture(self, run) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Run `run` once on a side stream (the kernels compile; a step writes what the replay will write), then
        capture it. Python's garbage collector is run first and held off during the capture: collecting an
        unreachable engine there would destroy its graphs mid-capture, which CUDA forbids."""
        side = torch.cuda.Stream(self.step.tokens.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
        collecting = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
        finally:
            if collecting:
                gc.enable()
        return graph, out


def static_steps(model, cache) -> StepGraphs | None:
    """`model`'s StepGraphs over `cache`, made at the first call; None where the static step does not apply."""
    held = getattr(model, "_static_steps", None)
    if held is not None and held[0] is cache:
        return held[1]
    graphs = StepGraphs(model, cache) if applies(model, cache) else None
    model._static_steps = (cache, graphs)
    return graphs
