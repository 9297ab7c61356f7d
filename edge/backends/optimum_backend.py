"""Graphs written by optimum's ONNX exporter (`text-generation-with-past`), for architectures edge's model file does
not cover (GPT-2, Phi, ...), behind the same calls as every exported backend (edge/backends/exported_model.py).

optimum's convention differs from edge's graph: the cache goes in as `past_key_values.i.key/value` (1, Hkv, S, Dh)
with an attention mask and position ids, and comes back whole as `present.i.key/value` (1, Hkv, S + T, Dh). The
runtime still owns the cache: it passes the valid prefix, keeps only the new rows of `present`, and rolls back by
moving a length. The model's shape is read from the graph's inputs and outputs, since edge's ModelConfig does not
describe these architectures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from edge.model.config import ModelConfig
from edge.backends.exported_model import ExportedModel
from edge.model.kv_cache import KVCache


def graph_config(session, config_dir: Path) -> ModelConfig:
    """A ModelConfig with what the runtime needs (layers, KV heads, head size, vocabulary, context, end tokens)."""
    inputs = {i.name: i.shape for i in session.get_inputs()}
    layers = sum(1 for name in inputs if name.startswith("past_key_values.") and name.endswith(".key"))
    _, kv_heads, _, head_dim = inputs["past_key_values.0.key"]
    vocab = session.get_outputs()[0].shape[-1]
    hf = json.loads((config_dir / "config.json").read_text())
    context = hf.get("max_position_embeddings") or hf.get("n_positions") or hf.get("n_ctx") or 2048
    eos = hf.get("eos_token_id")
    return ModelConfig(architecture=f"optimum:{hf.get('model_type', 'unknown')}", vocab_size=int(vocab),
                       hidden_size=int(kv_heads) * int(head_dim), intermediate_size=0, num_layers=layers,
                       num_heads=int(kv_heads), num_kv_heads=int(kv_heads), head_dim=int(head_dim), rms_norm_eps=0.0,
                       rope_theta=0.0, max_position_embeddings=int(context),
                       eos_token_ids=tuple(eos if isinstance(eos, list) else [eos] if eos is not None else []))


class OptimumOnnxModel(ExportedModel):
    def __init__(self, path: str | Path, config_dir: Path, *, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        super().__init__(path, graph_config(session, config_dir))
        self.session = session
        self._inputs = {i.name for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        layers = range(self.config.num_layers)
        self._present = [(outputs.index(f"present.{i}.key"), outputs.index(f"present.{i}.value")) for i in layers]
        self._logits = outputs.index("logits")

    def weight_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))  # + external data

    def _step(self, tokens: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        end = start + tokens.shape[0]
        keys, values = cache.keys.numpy(), cache.values.numpy()  # (L, 1, Hkv, S, Dh)
        feeds = {"input_ids": tokens.numpy().astype(np.int64)[None]}
        if "attention_mask" in self._inputs:
            feeds["attention_mask"] = np.ones((1, end), dtype=np.int64)
        if "position_ids" in self._inputs:
            feeds["position_ids"] = np.arange(start, end, dtype=np.int64)[None]
        for layer in range(self.config.num_layers):
            feeds[f"past_key_values.{layer}.key"] = keys[layer, :, :, :start]  # (1, Hkv, start, Dh)
            feeds[f"past_key_values.{layer}.value"] = values[layer, :, :, :start]
        outputs = self.session.run(None, feeds)
        for layer, (key_index, value_index) in enumerate(self._present):
            keys[layer, :, :, start:end] = outputs[key_index][:, :, start:end]  # the new rows of (1, Hkv, S+T, Dh)
            values[layer, :, :, start:end] = outputs[value_index][:, :, start:end]
        return torch.from_numpy(outputs[self._logits][0])  # (T, V)
