"""edge's Llama-family model as an ONNX graph with the KV cache as explicit inputs and outputs (batch 1).

    inputs   input_ids (T,) int64          the tokens at positions [start, start + T)
             start () int64                 how many positions the cache already holds
             past_key.i, past_value.i       (start, Hkv, Dh) float32 for each layer i: the cache's valid prefix
    outputs  logits (T, V')                 V' = V, or the kept rows of a trimmed (VocabTrim) head
             key.i, value.i                 (T, Hkv, Dh) float32: what the runtime writes at [start, start + T)

The runtime owns the cache (`edge.backends.onnx_backend`): it passes the valid prefix and stores the new rows itself, so
rolling back rejected drafts is moving a length, and a verify pass over k + 1 tokens is one run like any other.
Every projection is a MatMul against a (K, N) initializer, the shape onnxruntime's weight quantizers expect.

The graph is built node by node from the model's tensors (no tracing), so what it computes is what this file says:
RMSNorm, fused qkv and gate/up projections, rotary embeddings from a precomputed table, grouped-query attention
with a causal (and sliding-window) mask, SwiGLU, tied or separate head.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from edge.model.config import ModelConfig
from edge.model.transformer import Transformer
from edge.model.rope import inverse_frequencies

OPSET = 17
IR_VERSION = 9  # onnxruntime reads up to 13; onnx 1.23 would write 14 by default


class GraphBuilder:
    """Collects nodes and initializers; every helper returns the name of the tensor it produced."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, **attributes) -> str:
        output = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [output], **attributes))
        return output

    def ops(self, op_type: str, inputs: list[str], count: int, hint: str, **attributes) -> list[str]:
        outputs = [self.name(hint) for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, **attributes))
        return outputs

    def constant(self, value: np.ndarray, hint: str) -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def ints(self, values: list[int], hint: str = "shape") -> str:
        return self.constant(np.array(values, dtype=np.int64), hint)

    def rename(self, tensor: str, output: str) -> None:
        self.nodes.append(helper.make_node("Identity", [tensor], [output]))


def build_graph(model: Transformer, head_rows: torch.Tensor | None = None) -> onnx.ModelProto:
    """The ONNX model for `model` (float32 weights). head_rows (V',) keeps only those rows of the head (VocabTrim)."""
    config = model.config
    g = GraphBuilder()
    weights = {name: tensor.detach().float().cpu().numpy() for name, tensor in model.state_dict().items()}

    start_1d = g.op("Unsqueeze", ["start", g.ints([0], "axis0")], "start_1d")  # (1,)
    steps = g.op("Shape", ["input_ids"], "steps")  # (1,)
    end = g.op("Add", [start_1d, steps], "end")  # (1,)
    scalar = g.ints([], "scalar_shape")
    positions = g.op("Range", ["start", g.op("Reshape", [end, scalar], "end_scalar"),
                               g.constant(np.array(1, dtype=np.int64), "one")], "positions")  # (T,)

    x = g.op("Gather", [g.constant(weights["embed.weight"], "embed"), "input_ids"], "embedded")  # (T, D)
    cos, sin = rope_tables(g, config, positions)  # (T, 1, Dh) each
    mask = attention_mask(g, config, positions, end)  # (G*T, start + T) additive

    for i in range(config.num_layers):
        prefix = f"layers.{i}."
        h = rms_norm(g, x, weights[prefix + "attn_norm.weight"], config.rms_norm_eps)
        attended = attention(g, config, h, weights, prefix + "attn.", i, cos, sin, mask)  # (T, D)
        x = g.op("Add", [x, attended], "residual")
        h = rms_norm(g, x, weights[prefix + "ffn_norm.weight"], config.rms_norm_eps)
        x = g.op("Add", [x, feed_forward(g, config, h, weights, prefix + "ffn.")], "residual")  # (T, D)

    x = rms_norm(g, x, weights["norm.weight"], config.rms_norm_eps)
    head = weights["embed.weight"] if config.tie_word_embeddings else weights["lm_head.weight"]  # (V, D)
    if head_rows is not None:
        head = head[head_rows.cpu().numpy()]  # (V', D)
    g.rename(g.op("MatMul", [x, g.constant(head.T, "head")], "head_out"), "logits")  # (T, V')

    kv_shape = ["past", config.num_kv_heads, config.head_dim]
    new_shape = ["steps", config.num_kv_heads, config.head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["steps"]),
              helper.make_tensor_value_info("start", TensorProto.INT64, [])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["steps", head.shape[0]])]
    for i in range(config.num_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}.{i}", TensorProto.FLOAT, kv_shape))
            outputs.append(helper.make_tensor_value_info(f"{kind}.{i}", TensorProto.FLOAT, new_shape))
    graph = helper.make_graph(g.nodes, "edge", inputs, outputs, g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                             producer_name="edge-export")


def rms_norm(g: GraphBuilder, x: str, weight: np.ndarray, eps: float) -> str:
    """x (..., C) -> x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    mean_square = g.op("ReduceMean", [g.op("Mul", [x, x], "square")], "mean_square", axes=[-1], keepdims=1)
    denominator = g.op("Sqrt", [g.op("Add", [mean_square, g.constant(np.array(eps, np.float32), "eps")])])
    return g.op("Mul", [g.op("Div", [x, denominator], "normed"), g.constant(weight, "norm_weight")], "norm")


def linear(g: GraphBuilder, x: str, weight: np.ndarray, bias: np.ndarray | None, hint: str) -> str:
    """x (T, K) @ weight.T (K, N) (+ bias) -> (T, N); weight is (N, K) as torch stores it."""
    out = g.op("MatMul", [x, g.constant(weight.T, hint)], hint + "_out")
    return out if bias is None else g.op("Add", [out, g.constant(bias, hint + "_bias")], hint + "_biased")


def rope_tables(g: GraphBuilder, config: ModelConfig, positions: str) -> tuple[str, str]:
    """cos and sin (T, 1, Dh) for the positions, gathered from tables over every position the model supports."""
    inv_freq = inverse_frequencies(config)  # (Dh/2,)
    every = torch.arange(config.max_position_embeddings, dtype=torch.float32)  # (P,)
    angles = every[:, None] * inv_freq[None, :]  # (P, Dh/2), the product edge's model computes
    angles = torch.cat((angles, angles), dim=-1)  # (P, Dh)
    tables = []
    for name, table in (("cos", angles.cos()), ("sin", angles.sin())):
        rows = g.op("Gather", [g.constant(table.numpy(), name + "_table"), positions], name)  # (T, Dh)
        tables.append(g.op("Unsqueeze", [rows, g.ints([1], "axis1")], name + "_heads"))  # (T, 1, Dh)
    return tables[0], tables[1]


def apply_rope(g: GraphBuilder, x: str, cos: str, sin: str, head_dim: int) -> str:
    """x (T, heads, Dh) -> x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)."""
    half = g.ints([head_dim // 2, head_dim // 2], "halves")
    first, second = g.ops("Split", [x, half], 2, "half", axis=-1)
    rotated = g.op("Concat", [g.op("Neg", [second]), first], "rotated", axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])], "roped")


def attention_mask(g: GraphBuilder, config: ModelConfig, positions: str, end: str) -> str:
    """Additive mask (G*T, start + T): 0 where query row g*T + t (at position start + t) may see a key, else -inf."""
    group = config.num_heads // config.num_kv_heads
    query = g.op("Unsqueeze", [g.op("Tile", [positions, g.ints([group], "group")], "query_pos"),
                               g.ints([1], "axis1")], "query_col")  # (G*T, 1)
    zero = g.constant(np.array(0, dtype=np.int64), "zero")
    keys = g.op("Range", [zero, g.op("Reshape", [end, g.ints([], "scalar")], "end_scalar"),
                          g.constant(np.array(1, dtype=np.int64), "one")], "key_pos")  # (S,)
    allowed = g.op("LessOrEqual", [keys, query], "causal")  # (G*T, S)
    if config.sliding_window is not None:
        oldest = g.op("Sub", [query, g.constant(np.array(config.sliding_window, dtype=np.int64), "window")])
        allowed = g.op("And", [allowed, g.op("Greater", [keys, oldest], "in_window")], "allowed")
    return g.op("Where", [allowed, g.constant(np.array(0.0, np.float32), "open"),
                          g.constant(np.array(-np.inf, np.float32), "closed")], "mask")


def attention(g: GraphBuilder, config: ModelConfig, x: str, weights: dict, prefix: str, layer: int, cos: str,
              sin: str, mask: str) -> str:
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    group = heads // kv_heads
    qkv = linear(g, x, weights[prefix + "wqkv.weight"], weights.get(prefix + "wqkv.bias"), "wqkv")  # (T, Q+2KV)
    sizes = g.ints([config.q_size, config.kv_size, config.kv_size], "qkv_sizes")
    q, k, v = g.ops("Split", [qkv, sizes], 3, "qkv", axis=-1)
    q = g.op("Reshape", [q, g.ints([-1, heads, head_dim])], "q")  # (T, H, Dh)
    k = g.op("Reshape", [k, g.ints([-1, kv_heads, head_dim])], "k")  # (T, Hkv, Dh)
    v = g.op("Reshape", [v, g.ints([-1, kv_heads, head_dim])], "v")  # (T, Hkv, Dh)
    if config.qk_norm:
        q = rms_norm(g, q, weights[prefix + "q_norm.weight"], config.rms_norm_eps)
        k = rms_norm(g, k, weights[prefix + "k_norm.weight"], config.rms_norm_eps)
    q, k = apply_rope(g, q, cos, sin, head_dim), apply_rope(g, k, cos, sin, head_dim)
    g.rename(k, f"key.{layer}")
    g.rename(v, f"value.{layer}")

    keys = g.op("Concat", [f"past_key.{layer}", k], "keys", axis=0)  # (S, Hkv, Dh)
    values = g.op("Concat", [f"past_value.{layer}", v], "values", axis=0)  # (S, Hkv, Dh)
    keys_t = g.op("Transpose", [keys], "keys_t", perm=[1, 2, 0])  # (Hkv, Dh, S)
    values_h = g.op("Transpose", [values], "values_h", perm=[1, 0, 2])  # (Hkv, S, Dh)
    q = g.op("Reshape", [q, g.ints([-1, kv_heads, group, head_dim])], "q_groups")  # (T, Hkv, G, Dh)
    q = g.op("Transpose", [q], "q_heads", perm=[1, 2, 0, 3])  # (Hkv, G, T, Dh)
    q = g.op("Reshape", [q, g.ints([kv_heads, -1, head_dim])], "q_rows")  # (Hkv, G*T, Dh)
    scores = g.op("MatMul", [q, keys_t], "scores")  # (Hkv, G*T, S)
    scores = g.op("Mul", [scores, g.constant(np.array(head_dim ** -0.5, np.float32), "scale")], "scaled")
    probs = g.op("Softmax", [g.op("Add", [scores, mask], "masked")], "probs", axis=-1)  # (Hkv, G*T, S)
    out = g.op("MatMul", [probs, values_h], "attended")  # (Hkv, G*T, Dh)
    out = g.op("Reshape", [out, g.ints([kv_heads, group, -1, head_dim])], "attended_groups")  # (Hkv, G, T, Dh)
    out = g.op("Transpose", [out], "attended_t", perm=[2, 0, 1, 3])  # (T, Hkv, G, Dh)
    out = g.op("Reshape", [out, g.ints([-1, config.q_size])], "attended_rows")  # (T, H*Dh)
    return linear(g, out, weights[prefix + "wo.weight"], weights.get(prefix + "wo.bias"), "wo")  # (T, D)


def feed_forward(g: GraphBuilder, config: ModelConfig, x: str, weights: dict, prefix: str) -> str:
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one fused projection."""
    gate_up = linear(g, x, weights[prefix + "w_gate_up.weight"], weights.get(prefix + "w_gate_up.bias"), "w_gate_up")
    sizes = g.ints([config.intermediate_size, config.intermediate_size], "gate_up_sizes")
    gate, up = g.ops("Split", [gate_up, sizes], 2, "gate_up", axis=-1)  # (T, I) each
    activated = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])], "silu"), up], "swiglu")  # (T, I)
    return linear(g, activated, weights[prefix + "w_down.weight"], weights.get(prefix + "w_down.bias"), "w_down")
