"""NaN and Inf in a model: a cheap look at load, the first logits of every reply, and a full search when those fail.

    name = nonfinite_tensor(model)                  # at load: norms, biases and a sample of the embedding's rows
    problem = nonfinite_logits(logits)              # (V,) logits of a reply's first step: None when they are usable
    name = nonfinite_tensor(model, everything=True) # once the logits failed: every float tensor, to name the culprit

A damaged file (a GGUF whose weights hold NaN, a bit flip in a norm) would otherwise decode garbage or an empty reply
and finish as if nothing happened. The load check reads only the small tensors and EMBEDDING_SAMPLE rows of the
embedding (whatever its storage: float, int8 or GGUF blocks), so it costs nothing next to loading; a NaN inside a
matrix shows in the first logits instead.
"""

from __future__ import annotations

import torch
from torch import nn

EMBEDDING_SAMPLE = 256  # rows of the embedding looked at on load, evenly spread over the vocabulary


def nonfinite_tensor(model: nn.Module, *, everything: bool = False) -> tuple[str, str] | None:
    """(name, what it holds) of the first tensor holding NaN or Inf: among the 1-D parameters (norms, biases) and
    EMBEDDING_SAMPLE rows of the embedding, or among every floating parameter and buffer with `everything`; None
    when all are finite."""
    for name, tensor in _tensors(model, everything):
        found = _nonfinite(tensor)
        if found is not None:
            return name, found
    embed = getattr(model, "embed", None)
    if embed is not None:
        vocab = model.config.vocab_size
        rows = torch.linspace(0, vocab - 1, min(EMBEDDING_SAMPLE, vocab)).round().long().unique()
        with torch.inference_mode():
            found = _nonfinite(embed(rows.to(model.device)))
        if found is not None:
            return "embed.weight", f"{found} in its rows"
    return None


def nonfinite_logits(logits: torch.Tensor) -> str | None:
    """What is wrong with a step's logits (V,), or None: NaN or +Inf anywhere, or no finite value at all (-Inf
    marks a token a grammar or a trimmed head rules out; all of them leaves nothing to choose)."""
    nan, positive = int(torch.isnan(logits).sum()), int(torch.isposinf(logits).sum())
    if nan or positive:
        kinds = [f"{nan} NaN" if nan else "", f"{positive} +Inf" if positive else ""]
        return f"{' and '.join(kind for kind in kinds if kind)} of {logits.numel()} values"
    if not bool(torch.isfinite(logits).any()):
        return f"no finite value among {logits.numel()}"
    return None


def _tensors(model: nn.Module, everything: bool):
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and (everything or (tensor.dim() == 1 and name != "inv_freq"
                                                         and not name.startswith("inv_freq"))):
            yield name, tensor


def _nonfinite(tensor: torch.Tensor) -> str | None:
    """"NaN (3 of 64 values)", "Inf (...)" or None."""
    if tensor.device.type == "meta":
        return None
    values = tensor.detach()
    nan = int(torch.isnan(values).sum())
    if nan:
        return f"NaN ({nan} of {values.numel()} values)"
    infinite = int(torch.isinf(values).sum())
    return f"Inf ({infinite} of {values.numel()} values)" if infinite else None
