"""The model a GGUF file holds, computed exactly: every tensor dequantized by the gguf package (the values the file's
bytes stand for, as llama.cpp's dequantization gives them) and the transformer run in float64 torch. Written here
from the architectures' definitions (llama.cpp's graphs for llama, qwen2 and qwen3), it shares no code with edge's
model: RMSNorm with the file's epsilon, rotary positions with the file's base (llama files rotate adjacent pairs of
a head, their q/k rows permuted by the converter; qwen2 and qwen3 rotate its halves), grouped-query attention, q/k/v
biases where the file has them (qwen2), qwen3's q/k norms, SwiGLU, and the head (output.weight, else the tied
token_embd.weight).

    model = FileModel("model.gguf")
    logits = model.logits(windows)                     # windows (W, T) int64 -> (W * T, V) float64
    logits = model.logits(windows, eight_bit=True)     # each matmul's input quantized as llama.cpp and edge do

Memory: every window passes through a layer before the next; each matrix is dequantized when it is used and dropped
after, and the head is dequantized in chunks of rows, so the float64 weights held at once are one matrix (one chunk
of the head): the logits (W * T, V) are the largest thing kept.

With `eight_bit`, a matmul over a block-quantized matrix first quantizes its input as both runtimes do (llama.cpp's
Q8_0 / Q8_1 / Q8_K activations): per block of 32 for the 32-weight types (codes round(x * 127 / max|x|), ties to
even, the scale max|x| / 127 rounded to float16, and for Q4_1 / Q5_1 the block minimum multiplied by float16(sum of
codes * max|x| / 127)), per block of 256 for the k-quants (the scale 1 / (127 / max|x|) in float32); the rest stays
float64. Given the same inputs a runtime's matmul is this one to float32 rounding; over a whole model the two are
alike in size, not position by position, since a code is decided by an input's last bits (bench/fidelity.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, quants

ARCHITECTURES = ("llama", "qwen2", "qwen3")
ROTATE_HALVES = ("qwen2", "qwen3")  # llama.cpp's NEOX rope; its llama files rotate adjacent pairs
BLOCK_SIZES = {GGMLQuantizationType[name]: size for name, size in (
    ("Q8_0", 32), ("Q4_0", 32), ("Q4_1", 32), ("Q5_0", 32), ("Q5_1", 32), ("Q4_K", 256), ("Q5_K", 256),
    ("Q6_K", 256))}
WITH_MINIMUM = (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_1)  # d * q + m per block of 32 (Q8_1 activations)
HEAD_ROWS = 16384  # rows of the head dequantized at a time


@dataclass(frozen=True)
class Numbers:
    """What the file's metadata says about the transformer."""
    arch: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dims: int
    rope_base: float
    position_scale: float  # positions are divided by it (linear rope scaling; 1 without)
    eps: float
    add_bos: bool
    bos_id: int | None


def _field(reader: GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_numbers(reader: GGUFReader) -> Numbers:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise SystemExit(f"the exact reference runs {', '.join(ARCHITECTURES)} files; this one is {arch!r}")
    key = lambda name, default=None: _field(reader, f"{arch}.{name}", default)  # noqa: E731
    heads = key("attention.head_count")
    head_dim = key("attention.key_length") or key("embedding_length") // heads
    scaling = key("rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise SystemExit(f"the exact reference does not implement rope scaling {scaling!r}")
    vocabulary = _field(reader, "tokenizer.ggml.model")
    return Numbers(arch=arch, layers=key("block_count"), heads=heads, kv_heads=key("attention.head_count_kv", heads),
                   head_dim=head_dim, rotary_dims=key("rope.dimension_count", head_dim),
                   rope_base=key("rope.freq_base", 10000.0),
                   position_scale=key("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0,
                   eps=key("attention.layer_norm_rms_epsilon"),
                   add_bos=_field(reader, "tokenizer.ggml.add_bos_token", vocabulary == "llama"),
                   bos_id=_field(reader, "tokenizer.ggml.bos_token_id"))


def _quotient(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b elementwise, the quotient C's division gives (torch's `number / tensor` multiplies by a reciprocal, one
    ulp off at times); 0 where b is 0."""
    return torch.where(b > 0, torch.div(a, torch.where(b > 0, b, torch.ones_like(b))), torch.zeros_like(b))


def eight_bit(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) float64 -> (the values a runtime multiplies (M, K) float64, and per block of 32 the error of
    llama.cpp's rounded scaled sum (M, K / 32): float16(sum * max|x| / 127) - scale * sum, which Q4_1 / Q5_1 multiply
    by the block's minimum). The runtimes hold x in float32 and quantize it there."""
    rows, columns = x.shape
    padded = -(-columns // block) * block
    blocks = torch.nn.functional.pad(x.float(), (0, padded - columns)).reshape(rows, -1, block)  # (M, B, block)
    top = blocks.abs().amax(dim=-1, keepdim=True)  # (M, B, 1) float32
    inverse = _quotient(torch.full_like(top, 127.0), top)  # 127 / max|x|
    codes = torch.round(blocks * inverse).clamp(-127, 127)  # float32 product, rounded half to even
    step = _quotient(top, torch.full_like(top, 127.0))  # max|x| / 127
    scale = step.half().float() if block == 32 else _quotient(torch.ones_like(top), inverse)
    values = (codes.double() * scale.double()).reshape(rows, padded)[:, :columns]  # (M, K)
    sums = codes.sum(dim=-1, keepdim=True)  # (M, B, 1), exact in float32
    scaled_sums = (sums * step).half().double()
    return values, (scaled_sums - scale.double() * sums.double())[..., 0]  # (M, K), (M, B)


class FileModel:
    def __init__(self, path: str | Path) -> None:
        self.reader = GGUFReader(path)
        self.tensors = {tensor.name: tensor for tensor in self.reader.tensors}
        self.numbers = read_numbers(self.reader)
        self.head_name = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"

    @property
    def vocab_size(self) -> int:
        return int(self.tensors[self.head_name].shape[1])

    def weight(self, name: str, rows: slice | np.ndarray = slice(None)) -> torch.Tensor:
        """The tensor's values as float64: (N, K) for a matrix (those `rows` of it), (K,) for a vector."""
        tensor = self.tensors[name]
        data = tensor.data if len(tensor.shape) == 1 else tensor.data[rows]
        return torch.from_numpy(quants.dequantize(data, tensor.tensor_type).astype(np.float64))

    def minimums(self, name: str, rows: slice) -> torch.Tensor:
        """A Q4_1 / Q5_1 matrix's block minimums (N, K / 32) float64: each block's second float16."""
        data = self.tensors[name].data[rows]  # (N, blocks * block bytes) uint8
        per_block = data.reshape(data.shape[0], -1, data.shape[1] // (self.tensors[name].shape[0] // 32))
        return torch.from_numpy(np.ascontiguousarray(per_block[..., 2:4]).view(np.float16)[..., 0].astype(np.float64))

    def project(self, x: torch.Tensor, name: str, eight_bit_inputs: bool, rows: slice = slice(None)) -> torch.Tensor:
        """x (M, K) @ the matrix `name` (its `rows`).T (+ its bias) -> (M, N) float64."""
        weight = self.weight(f"{name}.weight", rows)  # (N, K)
        kind = self.tensors[f"{name}.weight"].tensor_type
        if eight_bit_inputs and kind in BLOCK_SIZES:
            x, sum_errors = eight_bit(x, BLOCK_SIZES[kind])
            y = x @ weight.T
            if kind in WITH_MINIMUM:
                y += sum_errors @ self.minimums(f"{name}.weight", rows).T
        else:
            y = x @ weight.T
        if f"{name}.bias" in self.tensors:
            y += self.weight(f"{name}.bias")
        return y

    def rms_norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.numbers.eps) * self.weight(name)

    def rotary(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, rotary_dims / 2) float64 of positions 0 .. T - 1."""
        n = self.numbers
        inverse = n.rope_base ** (-torch.arange(0, n.rotary_dims, 2, dtype=torch.float64) / n.rotary_dims)
        if "rope_freqs.weight" in self.tensors:  # Llama 3's scaling: one factor per frequency
            inverse = inverse / self.weight("rope_freqs.weight")
        angles = torch.arange(steps, dtype=torch.float64)[:, None] / n.position_scale * inverse  # (T, R / 2)
        return angles.cos(), angles.sin()

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (W, T, H, Dh): its first rotary_dims of each head rotated by position."""
        n = self.numbers
        part, rest = x[..., :n.rotary_dims], x[..., n.rotary_dims:]
        if n.arch in ROTATE_HALVES:
            first, second = part[..., :n.rotary_dims // 2], part[..., n.rotary_dims // 2:]
        else:
            first, second = part[..., 0::2], part[..., 1::2]
        cos, sin = cos[:, None], sin[:, None]  # (T, 1, R / 2)
        turned = (first * cos - second * sin, first * sin + second * cos)
        if n.arch in ROTATE_HALVES:
            return torch.cat([*turned, rest], dim=-1)
        return torch.cat([torch.stack(turned, dim=-1).flatten(-2), rest], dim=-1)

    def attention(self, x: torch.Tensor, layer: int, eight_bit_inputs: bool) -> torch.Tensor:
        """x (W, T, D) normed -> the attention's output (W, T, D), causal within each window."""
        n, (windows, steps, _) = self.numbers, x.shape
        flat = x.reshape(windows * steps, -1)
        shaped = lambda y, heads: y.reshape(windows, steps, heads, n.head_dim)  # noqa: E731
        q = shaped(self.project(flat, f"blk.{layer}.attn_q", eight_bit_inputs), n.heads)  # (W, T, H, Dh)
        k = shaped(self.project(flat, f"blk.{layer}.attn_k", eight_bit_inputs), n.kv_heads)  # (W, T, Hkv, Dh)
        v = shaped(self.project(flat, f"blk.{layer}.attn_v", eight_bit_inputs), n.kv_heads)
        if f"blk.{layer}.attn_q_norm.weight" in self.tensors:  # qwen3: each head normed before rotation
            q = self.rms_norm(q, f"blk.{layer}.attn_q_norm.weight")
            k = self.rms_norm(k, f"blk.{layer}.attn_k_norm.weight")
        cos, sin = self.rotary(steps)
        q, k = self.rotate(q, cos, sin).transpose(1, 2), self.rotate(k, cos, sin).transpose(1, 2)  # (W, H, T, Dh)
        group = n.heads // n.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.transpose(1, 2).repeat_interleave(group, dim=1)  # (W, H, T, Dh)
        future = torch.ones(steps, steps, dtype=torch.bool).triu(1)  # (T, T)
        out = torch.empty_like(q)
        for w in range(windows):  # one window's scores (H, T, T) at a time
            scores = (q[w] @ k[w].transpose(-1, -2)) / math.sqrt(n.head_dim)
            out[w] = scores.masked_fill(future, -math.inf).softmax(dim=-1) @ v[w]
        mixed = out.transpose(1, 2).reshape(windows * steps, n.heads * n.head_dim)  # (W * T, H * Dh)
        return self.project(mixed, f"blk.{layer}.attn_output", eight_bit_inputs).reshape(windows, steps, -1)

    def feed_forward(self, x: torch.Tensor, layer: int, eight_bit_inputs: bool) -> torch.Tensor:
        """x (W, T, D) normed -> SwiGLU's output (W, T, D)."""
        flat = x.reshape(-1, x.shape[-1])  # (W * T, D)
        gate = self.project(flat, f"blk.{layer}.ffn_gate", eight_bit_inputs)  # (W * T, F)
        hidden = torch.nn.functional.silu(gate) * self.project(flat, f"blk.{layer}.ffn_up", eight_bit_inputs)
        return self.project(hidden, f"blk.{layer}.ffn_down", eight_bit_inputs).reshape(x.shape)

    def logits(self, windows: torch.Tensor, eight_bit: bool = False) -> np.ndarray:
        """windows (W, T) int64 token ids, each from position 0 -> logits (W * T, V) float64."""
        x = self.weight("token_embd.weight", windows.reshape(-1).numpy()).reshape(*windows.shape, -1)  # (W, T, D)
        for layer in range(self.numbers.layers):
            x = x + self.attention(self.rms_norm(x, f"blk.{layer}.attn_norm.weight"), layer, eight_bit)
            x = x + self.feed_forward(self.rms_norm(x, f"blk.{layer}.ffn_norm.weight"), layer, eight_bit)
        final = self.rms_norm(x, "output_norm.weight").reshape(-1, x.shape[-1])  # (W * T, D)
        logits = np.empty((final.shape[0], self.vocab_size), dtype=np.float64)  # (W * T, V)
        head = self.head_name.removesuffix(".weight")
        for first in range(0, self.vocab_size, HEAD_ROWS):
            rows = slice(first, min(first + HEAD_ROWS, self.vocab_size))
            logits[:, rows] = self.project(final, head, eight_bit, rows).numpy()
        return logits
