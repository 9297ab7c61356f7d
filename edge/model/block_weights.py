"""A model's matrices in llama.cpp's block formats, as a GGUF file stores them (edge/kernels/block_formats.py): the layers'
projections, the embedding and the head, run by edge's CPU kernel for every row count.

    linear = BlockLinear(BlockMatrix.stack([q, k, v]), bias, runner)     # a fused projection, its types as stored
    embed = BlockEmbedding(matrix)                                      # rows dequantized as they are looked up

The model's layers are then packed as "blocks" (edge/model/packed_weights.py packed_format): the fused C calls read
each matrix through its BlockMatrix, the norms in float32, and the head (`packed_head`, which may be the embedding's
own matrix) in its own format.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.kernels.block_formats import BlockMatrix


class BlockLinear(nn.Module):
    """A linear layer whose weight is a BlockMatrix (one segment per fused source, each in its own type), run by the
    kernel through its model's `runner` (edge/kernels/runner.py). `table_entry` is what the fused calls' weight table
    points at."""

    def __init__(self, matrix: BlockMatrix, bias: torch.Tensor | None, runner) -> None:
        super().__init__()
        self.matrix, self.in_features, self.out_features = matrix, matrix.columns, matrix.rows
        self.register_buffer("table_entry", matrix.table_entry, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)  # (N,)
        self.runner = runner

    @property
    def format(self) -> str:
        return "+".join(self.matrix.formats)

    @property
    def weight(self) -> torch.Tensor:
        """The float32 values (N, K) the blocks stand for (made on each call: for re-quantizing and exporting)."""
        return self.matrix.dequantized()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., K) float32 -> (..., N) float32
        return self.runner.blocks(x, self.matrix, self.bias)

    def extra_repr(self) -> str:
        return f"{self.format}, in_features={self.in_features}, out_features={self.out_features}"


class BlockEmbedding(nn.Module):
    """An embedding kept in its block format: each token's row is dequantized when it is looked up."""

    def __init__(self, matrix: BlockMatrix) -> None:
        super().__init__()
        self.matrix = matrix
        self.num_embeddings, self.embedding_dim = matrix.rows, matrix.columns
        self.register_buffer("table_entry", matrix.table_entry, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """Every row as float32 (V, D), made on each call (a trimmed drafter head, an export)."""
        return self.matrix.dequantized()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # (B, T) int64 -> (B, T, D) float32
        flat = tokens.reshape(-1).tolist()
        rows = torch.stack([self.matrix.dequantized(token, 1)[0] for token in flat]) if flat else \
            torch.empty(0, self.embedding_dim)
        return rows.view(*tokens.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{'+'.join(self.matrix.formats)}, {self.num_embeddings}x{self.embedding_dim}"
