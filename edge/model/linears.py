"""The model's projections and the factory that makes them, each bound to the model's kernel runner.

    linears = LinearFactory(KernelRunner(CpuKernel.load()))       # or LinearFactory(): torch's matmul until bound
    model = Transformer(config, linears=linears)                  # every projection made by linears.linear(...)
    linears.packed(linear, "int8"); linears.int4(linear); linears.blocks(matrix, bias)   # the packed formats

Each module keeps the runner it was made with, one per model (edge/kernels/runner.py): the runner decides per call whether
the batch-invariant kernel or torch computes it, and switching the model's kernel (KernelRunner.use, widen) reaches
every projection at once.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.model.block_weights import BlockLinear
from edge.model.packed_weights import PackedLinear
from edge.kernels.block_formats import BlockMatrix, PackedArena
from edge.kernels.cpu_packing import pack_int8
from edge.kernels.runner import KernelRunner


class Linear(nn.Linear):
    """nn.Linear computed through its model's kernel runner: with the batch-invariant kernel, any call of at most the
    runner's max_rows rows computes each row exactly as a 1-row call would, so a (k + 1)-token verify pass reproduces
    k + 1 decode steps bit for bit."""

    def __init__(self, in_features: int, out_features: int, bias: bool, runner: KernelRunner,
                 device: torch.device | str | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device)
        self.runner = runner

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:  # on "meta" there is nothing to initialise (and torch would import dynamo to try)
            super().reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.runner.linear(x, self.weight, self.bias)


class LinearFactory:
    """Makes a model's projections, float or packed, every one bound to `runner` (default: a runner without the kernel,
    which torch computes until it is given one)."""

    def __init__(self, runner: KernelRunner | None = None) -> None:
        self.runner = runner if runner is not None else KernelRunner()

    def linear(self, in_features: int, out_features: int, bias: bool,
               device: torch.device | str | None = None) -> Linear:
        return Linear(in_features, out_features, bias, self.runner, device)

    def packed(self, source: nn.Module, fmt: str) -> PackedLinear:
        """`source` (float Linear, or a PackedLinear or BlockLinear: re-quantizing what its codes stand for) packed in
        `fmt` ("int8": per output channel, edge/kernels/cpu_packing.py)."""
        return PackedLinear(pack_int8(source.weight), fmt, source.in_features, source.out_features, source.bias,
                            self.runner)

    def int4(self, source: nn.Module, arena: PackedArena | None = None) -> BlockLinear:
        """`source` (float, int8-packed or in blocks) as edge's int4: its values quantized to 4 bits with a searched
        scale and minimum per 32 inputs."""
        return self.blocks(BlockMatrix.quantized("q4_1", source.weight, arena=arena), source.bias)

    def blocks(self, matrix: BlockMatrix, bias: torch.Tensor | None) -> BlockLinear:
        """A projection whose weight is `matrix` in llama.cpp's block formats (a GGUF file's types, or edge's int4)."""
        return BlockLinear(matrix, bias, self.runner)
