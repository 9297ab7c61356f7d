"""An EAGLE-3 head as published on the Hugging Face Hub, read as it is, and its one decoder layer.

    config.json     architectures ["LlamaForCausalLMEagle3"], hidden_size, intermediate_size, num_attention_heads,
                    num_key_value_heads, head_dim, rms_norm_eps, rope_theta (rope_scaling), vocab_size (the
                    target's), draft_vocab_size, and optionally eagle_config.eagle_aux_hidden_state_layer_ids
    *.safetensors   fc.weight (D, 3D); midlayer.self_attn.{q,k,v,o}_proj.weight (q/k/v read 2D columns);
                    midlayer.mlp.{gate,up,down}_proj.weight; midlayer.{input_layernorm,hidden_norm,
                    post_attention_layernorm}.weight; norm.weight; lm_head.weight (Vd, D); d2t (Vd,) int64 (draft
                    id d is target token d + d2t[d]); t2d (V,) bool; optionally embed_tokens.weight (else the
                    target's embedding)

A row of the layer, at position p, with g the feature (fc of the target's three streams, or the layer's own previous
output) and e the embedding of the next token:

    h = hidden_norm(g);  x = g + o_proj(attention(cat(input_layernorm(e), h)))   (residual h with norm_before_residual)
    out = x + mlp(post_attention_layernorm(x))        -> the next row's g;  logits = lm_head(norm(out))  (Vd,)

Which target streams the fc reads: `target_layers` (edge/model/layer_features.py ids, the stream leaving a layer).
eagle_aux_hidden_state_layer_ids (under eagle_config, or at the top level) come in two conventions: vLLM reads them as
the stream entering layer i (Hugging Face's hidden_states[i]), the SpecForge trainer writes the stream leaving layer
i, always with 1 first; as SGLang does, ids starting with 1 are read the second way, others the first; without them,
EAGLE-3's default (the streams entering layers 2, L // 2 and L - 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from edge.errors import CheckpointError
from edge.kernels.block_formats import BlockMatrix
from edge.kernels.runner import KernelRunner
from edge.memory.footprint import ModelShape
from edge.model.config import ModelConfig
from edge.model.layer_features import default_layers
from edge.model.rope import apply_rope, inverse_frequencies
from edge.sources.loading import PICKLE_SUFFIXES, load_hf_tensors
from edge.sources.model_source import HubName, hub_cache_dir, hub_offline

ARCHITECTURE = "LlamaForCausalLMEagle3"
LAYER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "input_layernorm",
         "hidden_norm", "post_attention_layernorm")
SAFETENSORS_HINT = ("convert it once, in an environment you trust, with: python -c \"import torch, safetensors.torch "
                    "as s; s.save_file(torch.load('pytorch_model.bin'), 'model.safetensors')\"")


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int  # the target's
    draft_vocab_size: int
    layer_ids: list[int] | None  # eagle_aux_hidden_state_layer_ids as written, None: EAGLE-3's default
    norm_before_residual: bool
    rope: ModelConfig  # what inverse_frequencies reads: head_dim, rope_theta, rope_scaling

    @classmethod
    def read(cls, folder: Path) -> "Eagle3Config":
        try:
            raw = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            raise CheckpointError(f"{folder} has no readable config.json; pass an EAGLE-3 head's folder or Hub id")
        if ARCHITECTURE not in (raw.get("architectures") or []):
            raise CheckpointError(f"{folder} is not an EAGLE-3 head (its config.json lacks architectures "
                                  f"[\"{ARCHITECTURE}\"]); for an EAGLE-1 drafter trained by edge use feature:PATH")
        if raw.get("norm_before_fc") or raw.get("target_hidden_size", raw["hidden_size"]) != raw["hidden_size"]:
            raise CheckpointError(f"the EAGLE-3 head in {folder} normalizes or resizes the target's features before "
                                  "its fc (norm_before_fc, target_hidden_size), which edge does not run; use a head "
                                  "without them")
        eagle = raw.get("eagle_config") or {}
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        scaling = dict(raw.get("rope_scaling") or {}) or None
        if scaling is not None and "rope_type" not in scaling:
            scaling["rope_type"] = scaling.get("type", "default")
        rope = ModelConfig(architecture=ARCHITECTURE, vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
                           intermediate_size=raw["intermediate_size"], num_layers=1, num_heads=heads,
                           num_kv_heads=raw.get("num_key_value_heads", heads), head_dim=head_dim,
                           rms_norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=raw.get("rope_theta", 10000.0),
                           max_position_embeddings=raw.get("max_position_embeddings", 2048), rope_scaling=scaling)
        return cls(raw["hidden_size"], raw["intermediate_size"], heads, rope.num_kv_heads, head_dim,
                   rope.rms_norm_eps, raw["vocab_size"], raw.get("draft_vocab_size") or raw["vocab_size"],
                   eagle.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids")),
                   bool(raw.get("norm_before_residual", False)), rope)

    def shape(self) -> ModelShape:
        """Its sizes as the memory planner counts a one-layer model's (the head over the draft vocabulary)."""
        return replace(self.rope, vocab_size=self.draft_vocab_size).shape()

    def target_layers(self, num_layers: int) -> tuple[int, ...]:
        """The target layers whose output streams the fc reads (edge/model/layer_features.py ids)."""
        if self.layer_ids is None:
            return default_layers(num_layers)
        if self.layer_ids and self.layer_ids[0] == 1:  # SpecForge's: the stream leaving layer i
            return tuple(self.layer_ids)
        return tuple(layer - 1 for layer in self.layer_ids)  # vLLM's: the stream entering layer i


def head_folder(name: str | Path) -> Path:
    """An EAGLE-3 head's folder: a folder as it is, or a Hub id from the Hugging Face cache (downloading config.json
    and the safetensors when it is not cached and HF_HUB_OFFLINE is not set)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    hub = HubName.parse(str(name))
    if hub is None or hub.tag or hub.file:
        raise CheckpointError(f"EAGLE-3 head {name} is neither a folder nor a Hub id; pass eagle3:FOLDER or "
                              "eagle3:OWNER/NAME")
    from huggingface_hub import snapshot_download

    for local in (True, False) if not hub_offline() else (True,):
        try:
            return Path(snapshot_download(hub.repo, revision=hub.revision, cache_dir=hub_cache_dir(),
                                          allow_patterns=["*.json", "*.safetensors"], local_files_only=local))
        except Exception as exc:  # not cached, then offline, an unknown repo or no network: one line either way
            problem = type(exc).__name__
    raise CheckpointError(f"EAGLE-3 head {hub} is not in the Hugging Face cache at {hub_cache_dir()} and could not be "
                          f"downloaded ({problem}); download it once, or pass its folder")


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The head's tensors by their names without a leading "model." and with "layers.0." read as "midlayer."."""
    safetensors = list(folder.glob("*.safetensors"))
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if not safetensors and pickles:
        raise CheckpointError(f"{folder / pickles[0]} is a pickle, which edge never loads (it can run code); "
                              f"{SAFETENSORS_HINT}")
    if not safetensors:
        raise CheckpointError(f"no safetensors weights in {folder}; pass an EAGLE-3 head's folder")
    names = {}
    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        tensors = load_hf_tensors(folder).tensors
    else:  # a head saved under another file name
        from safetensors.torch import load_file

        tensors = {name: t for path in safetensors for name, t in load_file(path).items()}
    for name, tensor in tensors.items():
        name = name.removeprefix("model.")
        names["midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name] = tensor
    return names


class Eagle3Layer:
    """The head's decoder layer, fc, final norm and draft-vocabulary head as plain tensors, with its own KV cache of
    `max_len` positions (rolled back by moving `length`). Norms and cache are in the target's dtype; the matrices too,
    unless `runner` (the target's kernel runner) reads their 16-bit form directly (then they stay 16-bit: half the
    memory, and the kernel widens them in registers), or `blocks`: then they are quantized once to 8-bit blocks
    (q8_0), a quarter of their float32 bytes, which is what a drafted token costs on a memory-bound CPU (a target in
    a GGUF file's block formats asks for it: drafts only propose, and the target checks every token)."""

    def __init__(self, config: Eagle3Config, tensors: dict[str, torch.Tensor], max_len: int,
                 dtype: torch.dtype, device: torch.device, runner: KernelRunner | None = None,
                 blocks: bool = False) -> None:
        self.config, self.runner = config, runner
        self.weights = {name: _stored(t, dtype, device, runner, blocks) for name, t in tensors.items()
                        if name not in ("d2t", "t2d", "embed_tokens.weight")}
        shape = (config.num_kv_heads, max_len, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (Hkv, S, Dh)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (Hkv, S, Dh)
        self.length = 0
        inv_freq = inverse_frequencies(config.rope).to(device)  # (R/2,)
        angles = torch.arange(max_len, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (S, R/2)
        angles = torch.cat((angles, angles), dim=-1)  # (S, R)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)  # (S, R) each

    @property
    def max_len(self) -> int:
        return self.keys.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.weights.values()) + self.keys.nbytes + self.values.nbytes

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        weight = self.weights[name]
        if isinstance(weight, BlockMatrix):
            return self.runner.blocks(x.float(), weight).to(x.dtype)
        return self.runner.linear(x, weight) if self.runner is not None else F.linear(x, weight)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return self.weights[name] * x32.to(x.dtype)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's streams (T, 3D) -> the layer's feature (T, D)."""
        return self._linear(features, "fc.weight")

    def forward(self, g: torch.Tensor, embeds: torch.Tensor, start: int, positions: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> torch.Tensor:
        """Rows in cache slots [start, start + T): feature g (T, D) and the next tokens' embeddings (T, D) -> the
        layer's output (T, D), the next row's feature; its keys/values are written to those slots. A row sits at its
        slot's position and sees the slots up to its own; or, for a token tree's nodes, at `positions` (T,), seeing
        the slots `visible` (T, start + T) marks (the context, its ancestors', its own)."""
        c, linear, steps = self.config, self._linear, g.shape[0]
        h = self._norm(g, "midlayer.hidden_norm.weight")  # (T, D)
        joined = torch.cat((self._norm(embeds, "midlayer.input_layernorm.weight"), h), dim=-1)  # (T, 2D)
        q = linear(joined, "midlayer.self_attn.q_proj.weight").view(steps, c.num_heads, c.head_dim)
        k = linear(joined, "midlayer.self_attn.k_proj.weight").view(steps, c.num_kv_heads, c.head_dim)
        v = linear(joined, "midlayer.self_attn.v_proj.weight").view(steps, c.num_kv_heads, c.head_dim)
        rotation = slice(start, start + steps) if positions is None else positions
        cos, sin = self.cos[rotation], self.sin[rotation]  # (T, R) each
        q, k = apply_rope(q.transpose(0, 1), cos, sin), apply_rope(k.transpose(0, 1), cos, sin)  # (H|Hkv, T, Dh)
        end = start + steps
        self.keys[:, start:end], self.values[:, start:end] = k, v.transpose(0, 1)
        self.length = end
        mask = visible
        if mask is None:
            query_pos = torch.arange(start, end, device=g.device)[:, None]  # (T, 1)
            mask = torch.arange(end, device=g.device)[None, :] <= query_pos  # (T, end)
        out = F.scaled_dot_product_attention(q[None], self.keys[None, :, :end], self.values[None, :, :end],
                                             attn_mask=mask, enable_gqa=c.num_kv_heads != c.num_heads)  # (1, H, T, Dh)
        out = out[0].transpose(0, 1).reshape(steps, c.num_heads * c.head_dim)  # (T, H*Dh)
        x = (h if c.norm_before_residual else g) + linear(out, "midlayer.self_attn.o_proj.weight")  # (T, D)
        normed = self._norm(x, "midlayer.post_attention_layernorm.weight")
        gate = F.silu(linear(normed, "midlayer.mlp.gate_proj.weight"))  # (T, I)
        return x + linear(gate * linear(normed, "midlayer.mlp.up_proj.weight"), "midlayer.mlp.down_proj.weight")

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """The layer's output (T, D) -> logits over the draft vocabulary (T, Vd)."""
        return self._linear(self._norm(out, "norm.weight"), "lm_head.weight")


def _stored(tensor: torch.Tensor, dtype: torch.dtype, device: torch.device, runner: KernelRunner | None,
            blocks: bool = False) -> torch.Tensor | BlockMatrix:
    """A head tensor as the layer keeps it: a matrix in 8-bit blocks where `blocks` and the kernel runs, a 16-bit
    matrix as it is where `runner`'s kernel reads it with float32 activations, anything else in the compute dtype."""
    matmul = runner.matmul if runner is not None else None
    if blocks and matmul is not None and tensor.dim() == 2 and tensor.is_floating_point():
        return BlockMatrix.quantized("q8_0", tensor.float().contiguous())  # (N, K) in blocks of 32
    keep = (tensor.dim() == 2 and tensor.dtype in (torch.bfloat16, torch.float16) and dtype == torch.float32
            and matmul is not None and matmul.supports(tensor))
    return tensor.to(device=device, dtype=tensor.dtype if keep else dtype).contiguous()
