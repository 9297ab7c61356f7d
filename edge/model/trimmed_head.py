"""VocabTrim on the torch backend: a drafter head over only the kept token ids, logits back in the full vocabulary.

    head = TrimmedHead(model, kept)        # kept (V',) token ids, e.g. from `python -m edge.export.vocab_trim`
    logits = head.logits(hidden)           # hidden (1, T, D) -> (V,) for the last position; dropped ids are -inf
    draft_head(model, head)                # the kept rows as one-call greedy drafting scores them (KernelHead)

The kept rows are copied once (V' x D: in 8-bit blocks where the head is a GGUF file's, else 16-bit on the CPU
kernel); the target keeps its full head, so verification is over every token and a
token the drafter cannot propose is simply produced by the target.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from edge.errors import SamplingError
from edge.model.kernel_glue import kernel_head
from edge.model.transformer import Transformer
from edge.kernels.block_formats import BlockMatrix
from edge.kernels.records import KernelHead


class TrimmedHead:
    def __init__(self, model, kept: torch.Tensor) -> None:
        vocab = model.config.vocab_size
        if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= vocab:
            raise SamplingError(f"the draft vocabulary must hold token ids in 0..{vocab - 1}; check the file")
        self.model, self.kept = model, torch.unique(kept.to(torch.int64))  # (V',) sorted, each id once
        rows = kept_rows(model, self.kept)  # (V', D)
        self.blocks: BlockMatrix | None = None
        if isinstance(model.packed_head, BlockMatrix) and model.runner.matmul is not None:
            # a GGUF head (block formats): the kept rows in 8-bit blocks, a quarter of their float32 bytes and about
            # what the file stores a row in; drafts only propose, so 8 bits of the file's values are enough
            self.blocks = BlockMatrix.quantized("q8_0", rows.float().contiguous())
            rows = rows[:0]
        elif rows.dtype == torch.float32 and model.runner.matmul is not None:
            rows = rows.to(torch.float16)  # on the CPU kernel: drafts only propose, and 16-bit rows read half the bytes
        self.weight = rows.contiguous()  # (V', D), or (0, D) where the rows are in `blocks`

    @property
    def kernel_head(self) -> KernelHead:
        """The kept rows (V', D) and their token ids (V',), as one-call greedy drafting scores them."""
        if self.blocks is not None:
            return KernelHead(self.blocks.table_entry, self.blocks.rows, token_ids=self.kept, packed_format="blocks")
        return KernelHead(self.weight, self.weight.shape[0], token_ids=self.kept)

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes if self.blocks is not None else self.weight.nbytes

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (1, T, D) -> logits (V,) of the last position over the full vocabulary."""
        last = hidden[0, -1:]  # (1, D)
        if self.blocks is not None:
            part = self.model.runner.packed_head(last.float(), self.blocks, self.blocks.rows)[0]  # (V',)
        else:
            part = self.model.runner.linear(last, self.weight, None)[0]  # (V',)
        return expand_vocabulary(part, self.kept, self.model.config.vocab_size)  # (V,)


def kept_rows(model, kept: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """The head's rows `kept` (V', D): from a block head a chunk of rows at a time, so that the whole head is never
    widened to float32 at once (a 152k-token head is 0.5 GB in float32)."""
    matrix = model.packed_head
    if not isinstance(matrix, BlockMatrix):
        return model.head_weight.index_select(0, kept)
    parts = []
    for first in range(0, matrix.rows, chunk):
        wanted = kept[(kept >= first) & (kept < first + chunk)] - first  # (n,) rows of this chunk
        if wanted.numel():
            parts.append(matrix.dequantized(first, min(chunk, matrix.rows - first)).index_select(0, wanted))
    return torch.cat(parts)  # kept is sorted ascending, so the chunks come in its order


def draft_head(model: Transformer, trimmed: TrimmedHead | None, vocab_size: int | None = None) -> KernelHead:
    """The head a drafter's one-call greedy draft scores (kernel_glue.draft_greedy): its trimmed rows (VocabTrim),
    else `model`'s head cut to its leading `vocab_size` rows (a draft vocabulary padded beyond the target's; None:
    all), packed where `model` packed it."""
    return trimmed.kernel_head if trimmed is not None else kernel_head(model, vocab_size)


def expand_vocabulary(logits: torch.Tensor, kept: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits (..., V') over the `kept` ids -> (..., V) over the full vocabulary, -inf for every dropped id."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))  # (..., V)
    full[..., kept] = logits
    return full


def read_vocabulary(path: str | Path) -> torch.Tensor:
    """Kept token ids from a JSON file: {"kept_ids": [...]} (edge-export, edge.export.vocab_trim) or a plain list."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise SamplingError(f"cannot read the draft vocabulary {path}: {error}") from None
    ids = data.get("kept_ids") if isinstance(data, dict) else data
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise SamplingError(f"{path} is not a draft vocabulary: expected {{\"kept_ids\": [token ids]}}")
    return torch.tensor(sorted(set(ids)), dtype=torch.long)
