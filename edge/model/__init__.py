"""The model and what it computes with: the Llama-family transformer (transformer.py) and its config, rotary
positions, the KV cache (plain and quantized, with per-channel key scales), the projections and the factory that binds
them to the model's kernel runner (linears.py), where the model meets edge's CPU kernel (kernel_glue.py), the weight
formats (int8/int4 packed, llama.cpp's blocks), layer offload, the one calibration pass, and the trimmed drafter head
that runs over the target's hidden states.

`from edge.model import Transformer` is the transformer module's public face; the other modules are imported by name.
"""

from edge.model.linears import Linear, LinearFactory
from edge.model.transformer import Attention, Block, FeedForward, RMSNorm, Transformer

__all__ = ["Attention", "Block", "FeedForward", "Linear", "LinearFactory", "RMSNorm", "Transformer"]
