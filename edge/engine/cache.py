"""The engine's KV cache and the conversation it holds.

The engine owns one preallocated KV cache (`new_cache`): in the compute dtype, or quantized (int8, int8-int4,
hierarchical) with outlier key channels scaled down first. Each call reuses the longest prefix of its prompt that is
already in the cache (the earlier turns of a chat), rolls the cache back to it and prefills only the rest
(`Reply.prefill`, edge/engine/reply.py).

In `chat`, when the rendered conversation starts with the text of the previous call (its prompt and the reply
exactly as generated), the earlier tokens are kept as the model produced them and only the new text is encoded
(`continued_tokens`). Re-encoding a reply can split it into different tokens than the model generated, which would
force a re-prefill of the whole reply; keeping the generated tokens is what the model actually saw.
"""

from __future__ import annotations

from edge.errors import SamplingError
from edge.model.calibration import CALIBRATION_TEXT
from edge.model.key_scales import outlier_key_scales
from edge.model.kv_cache import KVCache
from edge.model.quantized_kv_cache import QuantizedKVCache, kv_formats
from edge.model.transformer import Transformer
from edge.text.message_text import RenderedChat
from edge.text.tokenizer import Tokenizer


def new_cache(model: Transformer, tokenizer: Tokenizer, max_context: int, kv_cache: str | None) -> KVCache:
    """A cache of `max_context` positions for `model`: its own dtype's (`kv_cache` None, "float32" or the model's
    dtype), else the quantized format `kv_cache` names, which runs on the torch backend only."""
    if kv_cache in (None, "float32") or kv_cache == str(model.dtype).removeprefix("torch."):
        return model.new_cache(max_context)
    if not isinstance(model, Transformer):
        raise SamplingError("a quantized KV cache runs on the torch backend; load the checkpoint folder")
    keys, values = kv_formats(kv_cache)
    cache = QuantizedKVCache.for_model(model.config, max_context, key_format=keys, value_format=values,
                                       device=model.device)
    # outlier key channels (Qwen's) scaled down before they are quantized: measured once, here
    cache.key_scales = outlier_key_scales(model, tokenizer.encode(CALIBRATION_TEXT))
    return cache


def continued_tokens(tokenizer: Tokenizer, history: list[int], chat: RenderedChat) -> list[int]:
    """Token ids for a rendered chat: the last call's tokens (`history`) as generated, if the chat's text continues
    them (and does not continue them inside a special-token string from a message, which encodes as text)."""
    if history:
        known = tokenizer.decode(history, skip_special_tokens=False)
        if chat.text.startswith(known) and not any(start < len(known) < end for start, end in chat.literal_spans):
            return history + tokenizer.encode_rendered(chat, len(known))
    return tokenizer.encode_rendered(chat)
