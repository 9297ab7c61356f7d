"""Weight formats for an exported graph: fp32 (as built), fp16 storage, and int8/int4 through MatMulNBits.

    quantize(model_proto, QuantSettings("int4", block_size=32, accuracy_level=4)) -> model_proto

int8 and int4 are weight-only, group-wise (one scale per `block_size` weights of an input column), run by
onnxruntime's MatMulNBits: int8 symmetric; int4 mixed, as llama.cpp's Q4_K_M is: 4-bit asymmetric groups (a scale
and an integer zero point each) for the MLP's gate/up and the attention output, 8 bits for q/k/v, the MLP's down
projection and the head. (With every matrix in 4 bits, round-to-nearest groups moved SmolLM2-135M's logits by 8% per
matmul, 47-53% over its 30 layers; the mixture, 18%, about what one 4-bit matmul moves a larger model.) With accuracy level 4 the activations are quantized to int8 per block *of each row*,
so a row's result does not depend on the other rows of the call: a (k + 1)-token verify pass computes each token's
logits exactly as a 1-token step would, which keeps speculative decoding token-identical on this backend. (Per-tensor
dynamic quantization, onnxruntime's `quantize_dynamic`, shares one activation scale across all rows and loses that
property, so it is not offered.) Lower accuracy levels compute in float and are not row-invariant either.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

WEIGHT_FORMATS = ("fp32", "fp16", "int8", "int4")
ROW_INVARIANT_ACCURACY_LEVEL = 4
EIGHT_BIT_IN_INT4 = ("head", "wqkv", "w_down")  # edge/export/onnx_graph.py's weight names kept at 8 bits in an int4 export


@dataclass(frozen=True)
class QuantSettings:
    weights: str = "int8"  # one of WEIGHT_FORMATS
    block_size: int = 32  # int8/int4: weights per quantization group (a power of two, at least 16)
    accuracy_level: int = ROW_INVARIANT_ACCURACY_LEVEL  # int8/int4: MatMulNBits compute type (4 = int8)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {self.weights!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block size must be a power of two >= 16 (e.g. 32), got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"accuracy level must be 0-4 (4: int8 compute), got {self.accuracy_level}")

    @property
    def row_invariant(self) -> bool:
        """Whether a multi-token pass computes every row exactly as a one-token pass (exact speculation)."""
        return self.weights in ("fp32", "fp16") or self.accuracy_level == ROW_INVARIANT_ACCURACY_LEVEL

    def describe(self) -> dict:
        settings = asdict(self)
        if self.weights in ("fp32", "fp16"):
            settings.pop("block_size"), settings.pop("accuracy_level")
        return settings


def quantize(model: onnx.ModelProto, settings: QuantSettings) -> onnx.ModelProto:
    if settings.weights == "fp32":
        return model
    if settings.weights == "fp16":
        return store_half(model, _is_weight)
    for number, node in enumerate(model.graph.node):  # the quantizer picks nodes by name
        node.name = node.name or f"{node.op_type}_{number}"
    if settings.weights == "int8":
        quantized = _matmul_nbits(model, settings, 8, symmetric=True)
    else:
        eight = [node.name for node in model.graph.node if node.op_type == "MatMul" and len(node.input) > 1
                 and node.input[1].startswith(EIGHT_BIT_IN_INT4)]
        layers = _matmul_nbits(model, settings, 4, symmetric=False, exclude=eight)
        quantized = _matmul_nbits(layers, settings, 8, symmetric=True, include=eight) if eight else layers
    # the embedding table is a lookup, not a MatMul: keep it in half precision
    return store_half(quantized, lambda node, index, name: node.op_type == "Gather" and _is_weight(node, index, name))


def _matmul_nbits(model: onnx.ModelProto, settings: QuantSettings, bits: int, symmetric: bool,
                  exclude: list[str] | None = None, include: list[str] | None = None) -> onnx.ModelProto:
    """The float MatMuls (those in `include`, or all but `exclude`) as MatMulNBits of `bits`."""
    config = DefaultWeightOnlyQuantConfig(block_size=settings.block_size, is_symmetric=symmetric,
                                          accuracy_level=settings.accuracy_level, bits=bits)
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level, quiet.level = quiet.level, logging.WARNING
    try:
        quantizer = MatMulNBitsQuantizer(model, algo_config=config, nodes_to_exclude=exclude, nodes_to_include=include)
        quantizer.process()
    finally:
        quiet.setLevel(level)
    return quantizer.model.model


def _is_weight(node: onnx.NodeProto, index: int, name: str) -> bool:
    """A MatMul's weight or the embedding table (not the rotary tables, which stay float32)."""
    if node.op_type == "MatMul":
        return index == 1
    return node.op_type == "Gather" and index == 0 and name.startswith("embed")


def store_half(model: onnx.ModelProto, chosen) -> onnx.ModelProto:
    """Store the float32 initializers that `chosen(node, input_index, name)` picks as float16, cast back on use."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    converted: dict[str, str] = {}
    casts = []
    for node in graph.node:
        for index, name in enumerate(node.input):
            tensor = initializers.get(name)
            if tensor is None or tensor.data_type != TensorProto.FLOAT or not chosen(node, index, name):
                continue
            if name not in converted:
                half = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), name + "_fp16")
                graph.initializer.remove(tensor)
                graph.initializer.append(half)
                converted[name] = name + "_as_float"
                casts.append(helper.make_node("Cast", [half.name], [converted[name]], to=TensorProto.FLOAT))
            node.input[index] = converted[name]
    for cast in reversed(casts):
        graph.node.insert(0, cast)
    return model
