"""Kernels with plain-torch references and a dispatcher.

The CPU kernel (csrc/, C compiled at install, one library per CPU path: cpu_paths) is batch-invariant: a row's
result does not depend on how many rows share the call, so a (k + 1)-token verify pass equals k + 1 decode steps bit
for bit and greedy speculative decoding is exactly plain decoding. `cpu_kernel.CpuKernel` binds the whole library
(its matmuls, attention and fused passes) through cffi from its one header, csrc/interface.h, where every struct,
enum and constant that crosses into Python is declared; `runner.KernelRunner` decides for one model whether and how
each pass runs there (a projection at a time, or the whole pass fused, a greedy draft in one call), its
`FusedWeights` holding the model's layers as the fused calls read them; and `records` holds the plain records those calls are handed and hand back
(a head, a draft request, the draft). `cpu_packing` packs int8 weights and `block_formats` llama.cpp's block types (and
edge's int4). For GPUs, `triton_kernels` run int4/int8 weights and the quantized KV caches, each matching its
plain-torch reference (`quant`, `quant_weight`, `kv_quant`), and `dispatch` picks the kernel or the reference.
`cpu_bench` and `bench` measure them; `cache` is edge's cache folder. This package imports nothing from edge: a model
reaches the runner as plain tensors and its shape record (edge/model/kernel_glue.py hands them over).
"""
