"""The engine: load a model once, then stream replies (`from edge.engine import Engine, GenerationOptions`).

    engine.py    Engine: generate, chat, complete, fit_chat, use_drafter, reset; load and from_spec call the loader
    loader.py    load_engine: a LoadSpec to a ready engine (bundle, ONNX export or checkpoint; config.json read once)
    options.py   GenerationOptions: one reply's options, checked when made
    reply.py     Reply: prefill, the step loop; ReplyText: stop strings, end-of-sequence, loops, an Event per step
    batched.py   BatchedReplies: several replies decoded together in one fused pass a step (edge-serve's slots)
    prepared.py  a request's prompt ids and grammar, as generate, chat and the batch prepare them
    cache.py     the KV cache an engine allocates, and a chat's tokens continued as they were generated
    drafting.py  the draft length, a draft model's options and its cache length, for use_drafter
    context.py   fit_messages: a chat's oldest turns dropped until it fits the context
    prompts.py   what a prompt may be: valid text or token ids, inside the vocabulary and the context
"""

from edge.engine.engine import Engine
from edge.engine.loader import load_engine
from edge.engine.options import GenerationOptions

__all__ = ["Engine", "GenerationOptions", "load_engine"]
