"""The ONNX Runtime backend: an exported graph (edge/export/onnx_graph.py) driven through the same calls as `Transformer`.

    model = OnnxModel(path_to_model_onnx, config)
    cache = model.new_cache(max_len)              # (layers, max_len, Hkv, Dh): the runtime owns it
    out = model(tokens, start, cache)             # tokens (1, T) at [start, start + T) -> handle (1, T, V')
    logits = model.logits(out)                    # (1, T, V): a trimmed head's logits put back in the full vocabulary

(the calls every exported backend shares: edge/backends/exported_model.py). The graph takes the cache's valid prefix as
inputs and returns the new keys/values, which are written into the cache here; so rollback is moving a length,
exactly as for the torch model, and the decoding strategies and drafters run unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edge.errors import BundleError
from edge.model.config import ModelConfig
from edge.backends.exported_model import ExportedModel
from edge.model.kv_cache import KVCache


class OnnxKVCache(KVCache):
    """The KV cache in the layout the graph reads: (layers, max_len, Hkv, Dh), so each layer's valid prefix
    [0, start) is one contiguous block passed to onnxruntime without a copy."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int) -> None:
        shape = (num_layers, max_len, num_kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=torch.float32)  # (L, S, Hkv, Dh)
        self.values = torch.zeros(shape, dtype=torch.float32)  # (L, S, Hkv, Dh)
        self.key_arrays, self.value_arrays = self.keys.numpy(), self.values.numpy()  # the same memory
        self.max_len = max_len
        self.length = 0

    def write(self, layer, start, keys, values):
        raise NotImplementedError("the ONNX backend writes its cache through OnnxModel")


class OnnxModel(ExportedModel):
    """One exported graph in an onnxruntime session (fp32 activations; weights may be quantized in the graph)."""

    def __init__(self, path: str | Path, config: ModelConfig, *, vocab_map: torch.Tensor | None = None,
                 threads: int | None = None) -> None:
        """`threads`: onnxruntime's intra-op threads (default: torch's). A drafter runs with 1: its graph is small,
        and a second session's worker threads would spin-wait against the target's on a machine with few cores."""
        import onnxruntime as ort

        super().__init__(path, config, vocab_map)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: no notices about unused initializers
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        check_graph(self.session, config, path, len(vocab_map) if vocab_map is not None else config.vocab_size)
        outputs = [output.name for output in self.session.get_outputs()]
        layers = range(config.num_layers)
        self._past_names = [(f"past_key.{i}", f"past_value.{i}") for i in layers]
        self._new = [(outputs.index(f"key.{i}"), outputs.index(f"value.{i}")) for i in layers]
        self._logits = outputs.index("logits")

    def new_cache(self, max_len: int) -> OnnxKVCache:
        config = self.config
        return OnnxKVCache(config.num_layers, config.num_kv_heads, config.head_dim, max_len)

    def _step(self, tokens: torch.Tensor, start: int, cache: OnnxKVCache) -> torch.Tensor:
        end = start + tokens.shape[0]
        feeds = {"input_ids": tokens.numpy().astype(np.int64, copy=False), "start": np.array(start, np.int64)}
        for layer, (key_name, value_name) in enumerate(self._past_names):
            feeds[key_name] = cache.key_arrays[layer, :start]  # (start, Hkv, Dh), a view
            feeds[value_name] = cache.value_arrays[layer, :start]
        outputs = self.session.run(None, feeds)
        for layer, (key_index, value_index) in enumerate(self._new):
            cache.key_arrays[layer, start:end] = outputs[key_index]  # (T, Hkv, Dh)
            cache.value_arrays[layer, start:end] = outputs[value_index]
        return torch.from_numpy(outputs[self._logits])  # (T, V')


def check_graph(session, config: ModelConfig, path: Path, vocab: int) -> None:
    """The graph's inputs and outputs have the shapes its config gives (a past key and value per layer of
    Hkv x Dh, logits over `vocab` tokens); a BundleError naming the first that does not."""
    inputs = {item.name: item.shape for item in session.get_inputs()}
    outputs = {item.name: item.shape for item in session.get_outputs()}
    expected = {"logits": (outputs, [vocab])}
    for layer in range(config.num_layers):
        for name in (f"past_key.{layer}", f"past_value.{layer}"):
            expected[name] = (inputs, [config.num_kv_heads, config.head_dim])
        for name in (f"key.{layer}", f"value.{layer}"):
            expected[name] = (outputs, [config.num_kv_heads, config.head_dim])
    for name, (table, tail) in expected.items():
        shape = table.get(name)
        if shape is None:
            problem = f"has no {'input' if table is inputs else 'output'} {name}"
        elif any(isinstance(got, int) and got != want for got, want in zip(shape[-len(tail):], tail)):
            problem = f"gives {name} the shape {list(shape)}, not [..., {', '.join(map(str, tail))}]"
        else:
            continue
        raise BundleError(f"the graph {path} {problem}, which its config ({config.num_layers} layers, "
                          f"{config.num_kv_heads} KV heads of {config.head_dim}, {vocab} tokens) needs; the bundle's "
                          "files do not belong together: re-export it with edge-export")
