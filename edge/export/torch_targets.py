"""TorchScript and torch.export targets: edge's model as one functional step with the KV cache passed in and out.

    step = KVStep(model)                                     # from an edge Transformer (float32)
    logits, new_keys, new_values = step(tokens, past_keys, past_values)
        tokens (T,) int64                                    at positions [S, S + T), S = past_keys.shape[2]
        past_keys, past_values (L, Hkv, S, Dh) float32       the cache's valid prefix (any strides)
        -> logits (T, V'), new_keys, new_values (L, Hkv, T, Dh)

The same contract as the ONNX graph (edge/export/onnx_graph.py), so the runtime owns the cache, rolls it back by moving a
length and verifies k + 1 drafts in one call. `save_torchscript` scripts it (torch.jit.script: TorchScript is
deprecated as of torch 2.13, kept because desktop apps embedding libtorch still load it); `save_exported` writes a
torch.export program (.pt2) with dynamic T and S, the format torch recommends instead.

Both run torch's matmul, which is not batch-invariant: a verify pass may round differently from single steps by a
few 1e-6, so greedy speculation on these targets is identical in practice but not guaranteed bit for bit (the ONNX
target is). A loaded TorchScript or .pt2 file is code: load only bundles you made.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from edge.model.transformer import Transformer
from edge.model.rope import inverse_frequencies


class LayerWeights(nn.Module):
    """One decoder layer's tensors as buffers (absent biases are zeros, absent q/k norms are unused ones)."""

    def __init__(self, block, config, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        attn, ffn = block.attn, block.ffn

        def tensor(value, fallback_size: int, fill: float = 0.0) -> torch.Tensor:
            if value is None:
                return torch.full((fallback_size,), fill, dtype=dtype)
            return value.detach().to(dtype).contiguous().clone()

        self.register_buffer("attn_norm", tensor(block.attn_norm.weight, 0))
        self.register_buffer("wqkv", tensor(attn.wqkv.weight, 0))
        self.register_buffer("qkv_bias", tensor(attn.wqkv.bias, attn.wqkv.weight.shape[0]))
        self.register_buffer("wo", tensor(attn.wo.weight, 0))
        self.register_buffer("o_bias", tensor(attn.wo.bias, attn.wo.weight.shape[0]))
        self.register_buffer("q_norm", tensor(attn.q_norm.weight if attn.q_norm is not None else None,
                                              config.head_dim, 1.0))
        self.register_buffer("k_norm", tensor(attn.k_norm.weight if attn.k_norm is not None else None,
                                              config.head_dim, 1.0))
        self.register_buffer("ffn_norm", tensor(block.ffn_norm.weight, 0))
        self.register_buffer("w_gate_up", tensor(ffn.w_gate_up.weight, 0))
        self.register_buffer("gate_up_bias", tensor(ffn.w_gate_up.bias, ffn.w_gate_up.weight.shape[0]))
        self.register_buffer("w_down", tensor(ffn.w_down.weight, 0))
        self.register_buffer("down_bias", tensor(ffn.w_down.bias, ffn.w_down.weight.shape[0]))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (heads, T, Dh) -> x * cos + rotate_half(x) * sin; cos/sin (T, Dh)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class KVStep(nn.Module):
    def __init__(self, model: Transformer, head_rows: torch.Tensor | None = None) -> None:
        super().__init__()
        config = model.config
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.intermediate_size, self.eps = config.intermediate_size, config.rms_norm_eps
        self.window = config.sliding_window or 0  # 0: no sliding window
        self.qk_norm = config.qk_norm
        self.layers = nn.ModuleList(LayerWeights(block, config) for block in model.layers)
        self.register_buffer("embed", model.embed.weight.detach().float().contiguous().clone())
        head = model.head_weight.detach().float()
        self.register_buffer("head", (head[head_rows] if head_rows is not None else head).contiguous().clone())
        self.register_buffer("norm", model.norm.weight.detach().float().clone())
        self.register_buffer("inv_freq", inverse_frequencies(config).float())

    def forward(self, tokens: torch.Tensor, past_keys: torch.Tensor,
                past_values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        start = past_keys.shape[2]
        steps = tokens.shape[0]
        end = start + steps
        x = F.embedding(tokens, self.embed)  # (T, D)
        positions = torch.arange(steps, dtype=torch.float32) + start  # (T,)
        angles = positions[:, None] * self.inv_freq[None, :]  # (T, Dh/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T, Dh)
        cos, sin = angles.cos(), angles.sin()
        query_pos = torch.arange(steps)[:, None] + start  # (T, 1)
        key_pos = torch.arange(end)[None, :]  # (1, S + T)
        allowed = key_pos <= query_pos  # (T, S + T)
        if self.window > 0:
            allowed = allowed & (key_pos > query_pos - self.window)
        new_keys: List[torch.Tensor] = []
        new_values: List[torch.Tensor] = []
        i = 0
        for layer in self.layers:
            h = rms_norm(x, layer.attn_norm, self.eps)
            qkv = F.linear(h, layer.wqkv, layer.qkv_bias)  # (T, Q + 2KV)
            q = qkv[:, :self.q_size].reshape(steps, self.num_heads, self.head_dim)  # (T, H, Dh)
            k = qkv[:, self.q_size:self.q_size + self.kv_size].reshape(steps, self.num_kv_heads, self.head_dim)
            v = qkv[:, self.q_size + self.kv_size:].reshape(steps, self.num_kv_heads, self.head_dim)
            if self.qk_norm:
                q, k = rms_norm(q, layer.q_norm, self.eps), rms_norm(k, layer.k_norm, self.eps)
            q = rotate(q.transpose(0, 1), cos, sin)  # (H, T, Dh)
            k = rotate(k.transpose(0, 1), cos, sin)  # (Hkv, T, Dh)
            v = v.transpose(0, 1)  # (Hkv, T, Dh)
            new_keys.append(k)
            new_values.append(v)
            keys = torch.cat((past_keys[i], k), dim=1)  # (Hkv, S + T, Dh)
            values = torch.cat((past_values[i], v), dim=1)  # (Hkv, S + T, Dh)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed,
                                                 enable_gqa=self.num_heads != self.num_kv_heads)  # (H, T, Dh)
            out = out.transpose(0, 1).reshape(steps, self.q_size)  # (T, H*Dh)
            x = x + F.linear(out, layer.wo, layer.o_bias)
            h = rms_norm(x, layer.ffn_norm, self.eps)
            gate_up = F.linear(h, layer.w_gate_up, layer.gate_up_bias)  # (T, 2I)
            activated = F.silu(gate_up[:, :self.intermediate_size]) * gate_up[:, self.intermediate_size:]
            x = x + F.linear(activated, layer.w_down, layer.down_bias)
            i += 1
        logits = F.linear(rms_norm(x, self.norm, self.eps), self.head)  # (T, V')
        return logits, torch.stack(new_keys), torch.stack(new_values)  # (T, V'), (L, Hkv, T, Dh) x 2


def save_torchscript(step: KVStep, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript; we say so in --help
        torch.jit.script(step).save(str(path))


def save_exported(step: KVStep, path: Path) -> None:
    """A torch.export program with dynamic token count and cache length."""
    layers, kv_heads, head_dim = len(step.layers), step.num_kv_heads, step.head_dim
    example = (torch.zeros(3, dtype=torch.long), torch.zeros(layers, kv_heads, 5, head_dim),
               torch.zeros(layers, kv_heads, 5, head_dim))
    steps, cached = torch.export.Dim("steps", min=1, max=4096), torch.export.Dim("cached", min=0, max=1 << 20)
    program = torch.export.export(step, example, dynamic_shapes=({0: steps}, {2: cached}, {2: cached}))
    torch.export.save(program, str(path))
