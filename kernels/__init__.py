"""Kernels with plain-torch references and a dispatcher.

Built so far: `cpu_matmul.RowwiseMatmul`, a batch-invariant matmul and attention for CPU decoding (C, compiled on
first use): a row's result does not depend on how many rows share the call, so a (k + 1)-token verify pass equals
k + 1 decode steps bit for bit and greedy speculative decoding is exactly plain decoding; `fused_model.FusedWeights`
holds a model's layers as its fused C calls read them (pointer table, layer orders, ModelViews). GPU kernels
(Triton/CUDA) for int4 weights and quantized KV come with the issue "Step 7 of 7". This package imports nothing from
edge.
"""
