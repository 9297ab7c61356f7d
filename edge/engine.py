"""Engine: the embedding API. Load a checkpoint once, then stream events from `generate` or `chat`.

    engine = Engine.load("path/to/checkpoint")
    for event in engine.chat([{"role": "user", "content": "Hi"}], max_new_tokens=64):
        print(event.text, end="", flush=True)

The engine owns one preallocated KV cache. Each call reuses the longest prefix of its prompt that is already in
the cache (the earlier turns of a chat), rolls the cache back to it and prefills only the rest.

In `chat`, when the rendered conversation starts with the text of the previous call (its prompt and the reply
exactly as generated), the earlier tokens are kept as the model produced them and only the new text is encoded.
Re-encoding a reply can split it into different tokens than the model generated, which would force a re-prefill
of the whole reply; keeping the generated tokens is what the model actually saw.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import threading
import time
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from edge import events as ev
from edge.decoding.loop import Autoregressive, DecodingStrategy, Step
from edge.backends.bundle import is_bundle, read_bundle
from edge.model.calibration import CALIBRATION_TEXT
from edge.text.chat_template import check_messages, read_template_file
from edge.decoding.constrained import Constraint, Grammar, GrammarError, GrammarVocabulary, response_format_grammar
from edge.decoding.drafters import Drafter
from edge.decoding.registry import DrafterSpec, DraftTarget, trim_vocabulary
from edge.errors import (BundleError, CheckpointError, ContextLengthError, EngineBusyError, PromptError,
                         SamplingError)
from edge.events import Event, Stats
from edge.model.key_scales import outlier_key_scales
from edge.model.kv_cache import common_prefix
from edge.load_spec import DEFAULT_MAX_CONTEXT, DraftModelOptions, LoadSpec
from edge.sources.loading import check_checkpoint, load_model, not_a_folder
from edge.model.transformer import Transformer
from edge.model.offload import offload_layers
from edge.model.packed_weights import quantize_weights
from edge.planning import fit_to_budget
from edge.model.quantized_kv_cache import QuantizedKVCache, kv_formats
from edge.decoding.sampling import SamplingParams, history_tensor, next_token
from edge.decoding.speculative import DraftLength, SpeculativeDecoding
from edge.text.stopping import StopStrings
from edge.text.tokenizer import StreamDecoder, Tokenizer
from edge.decoding.tools import plan_tool_use
from memory.device import return_freed_heap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings; the text is cut before the first one
    ignore_eos: bool = False  # keep going past end-of-sequence tokens (benchmarks)
    speculate: bool = True  # use the engine's drafter, if it has one (False: plain decoding)
    task: str | None = None  # a label such as "code" or "chat": adaptive drafters remember choices per task
    should_stop: Callable[[], bool] | None = None  # checked after every step; True ends generation ("stopped")
    # OpenAI's response_format: {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}};
    # the output then follows it by construction (edge/decoding/constrained.py)
    response_format: dict | None = None

    @classmethod
    def merged(cls, options: "GenerationOptions | None", overrides: dict) -> "GenerationOptions":
        """`options` (default: the defaults) with `overrides` (field names as keywords) applied, checked."""
        if options is None:
            return cls.from_kwargs(overrides)
        if not isinstance(options, GenerationOptions):
            raise SamplingError(f"options must be a GenerationOptions, got {type(options).__name__}; pass fields such "
                                "as max_new_tokens=... as keywords")
        return cls.from_kwargs({**{f.name: getattr(options, f.name) for f in dataclasses.fields(cls)}, **overrides})

    @classmethod
    def from_kwargs(cls, options: dict) -> "GenerationOptions":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise SamplingError(f"unknown generation option {unknown[0]!r}; valid options: {', '.join(sorted(names))}")
        if isinstance(options.get("stop"), str):
            options = {**options, "stop": (options["stop"],)}
        if isinstance(options.get("stop"), (list, tuple)):
            options = {**options, "stop": tuple(options["stop"])}
        result = cls(**options)
        result.check()
        return result

    def check(self) -> None:
        """Raise SamplingError (one line) for an option of the wrong type or out of range."""
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise SamplingError(message)
        require(type(self.max_new_tokens) is int and self.max_new_tokens >= 1,
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        require(isinstance(self.stop, tuple) and all(isinstance(text, str) for text in self.stop),
                f"stop must be a string or a list of strings, got {self.stop!r}")
        for name in ("ignore_eos", "speculate"):
            require(isinstance(getattr(self, name), bool), f"{name} must be True or False, got {getattr(self, name)!r}")
        require(self.task is None or isinstance(self.task, str), f"task must be a label (text), got {self.task!r}")
        require(self.should_stop is None or callable(self.should_stop),
                f"should_stop must be a function returning True to stop, got {self.should_stop!r}")
        require(self.response_format is None or isinstance(self.response_format, dict),
                'response_format must be a dict such as {"type": "json_object"}, got ' + repr(self.response_format))
        _ = self.sampling  # SamplingParams checks the sampling values

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty, self.seed)


class Engine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, max_context: int = DEFAULT_MAX_CONTEXT,
                 kv_cache: str = "float32") -> None:
        self.model = model
        self.tokenizer = tokenizer
        config = model.config
        self.max_context = min(max_context, config.max_position_embeddings)
        self.device = model.device
        self.kv_cache = kv_cache
        if kv_cache in (None, "float32") or kv_cache == str(model.dtype).removeprefix("torch."):
            self.cache = model.new_cache(self.max_context)
        elif isinstance(model, Transformer):
            keys, values = kv_formats(kv_cache)
            self.cache = QuantizedKVCache.for_model(config, self.max_context, key_format=keys, value_format=values,
                                                    device=self.device)
            # outlier key channels (Qwen's) scaled down before they are quantized: measured once, here
            self.cache.key_scales = outlier_key_scales(model, tokenizer.encode(CALIBRATION_TEXT))
        else:
            raise SamplingError("a quantized KV cache runs on the torch backend; load the checkpoint folder")
        self._history: list[int] = []  # prompt + generated tokens of the last call; the cache holds a prefix of it
        self._busy = threading.Lock()  # held while a generation runs: one engine, one reply at a time
        self.eos_token_ids = frozenset(tokenizer.eos_token_ids) | frozenset(config.eos_token_ids)
        self.drafter: Drafter | None = None
        self.draft_length = _draft_length("adaptive")
        self.plan = None  # the memory plan this engine was sized by (Engine.load with a memory_budget)
        self.bundle = None  # the edge-export bundle this engine runs, when loaded from one
        self.backend = "torch"  # or the bundle's backend: onnx, torchscript, torch-export
        self.spec: LoadSpec | None = None  # what Engine.load / from_spec loaded (None: made from a model directly)
        self._grammar_vocabulary: GrammarVocabulary | None = None  # built on the first constrained reply

    @classmethod
    def load(cls, path: str | Path, *, progress: Callable[[str, float], None] | None = None, **options) -> "Engine":
        """Load a Hugging Face checkpoint folder (config.json, safetensors weights, tokenizer.json), an edge-export
        bundle, a .gguf file or a Hub id ("org/name", from the Hugging Face cache or downloaded;
        edge/sources/model_source.py): `Engine.from_spec(LoadSpec.from_options(path, **options))`. The options
        (edge/load_spec.py):

        `dtype`, `device`, `max_context`; `drafter` turns on speculative decoding (a spec, edge/decoding/registry.py)
        and `draft_length` is "adaptive", "adaptive:P" or a fixed number of drafted tokens per step. With
        `memory_budget` ("6GiB" or bytes) the memory planner sizes the context and may step the drafter down to fit;
        `engine.plan` says what it chose and why. Without one, what is requested is allocated as asked. A bundle runs
        on `backend` ("onnx", "torchscript" or "torch-export"; default: the first the bundle has), and drafter
        "bundle" is the bundle's own; a checkpoint folder with backend "onnx" is exported once into the cache (int8)
        and run from there. `draft_vocab` (a JSON file from `python -m export.vocab_trim`) trims a model drafter's
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
        return cls.from_spec(LoadSpec.from_options(path, **options), progress=progress)

    @classmethod
    def from_spec(cls, spec: LoadSpec, *, progress: Callable[[str, float], None] | None = None) -> "Engine":
        """Load what `spec` names; `engine.spec` is the spec it loaded (after the memory plan, when it had a
        budget)."""
        report = progress or (lambda stage, fraction: None)
        if not spec.path.is_dir():
            raise CheckpointError(not_a_folder(spec.path))
        bundled = is_bundle(spec.path)
        spec.check_combination(bundled)
        if bundled:
            return cls._load_bundle(spec, report)
        if spec.backend == "onnx":  # a checkpoint on ONNX Runtime: export it once into the cache (int8), then run that
            return cls.from_spec(_exported(spec, report), progress=progress)
        if spec.backend not in (None, "torch"):
            raise CheckpointError(f"backend {spec.backend!r} runs exported bundles; {spec.path} is a checkpoint folder "
                                  "(run it on torch or onnx, or export it with edge-export --format torchscript)")
        plan = None
        if spec.memory_budget is not None:
            spec, plan = fit_to_budget(spec)
        check_checkpoint(spec.path)  # config.json, then the weight files, then the tokenizer: the first problem
        report("reading the tokenizer", 0.0)
        tokenizer = _tokenizer(spec)
        report("mapping the weights", 0.1)
        if spec.offload_layers:  # split on the host, then move what stays to the device
            model = load_model(spec.path, dtype=spec.dtype, device="cpu")
            offload_layers(model, list(spec.offload_layers), spec.device)
            model = model.to(spec.device)
            if torch.device(spec.device).type != "cpu":
                model.runner.use(None)  # the batch-invariant kernel is the CPU's
        else:
            model = load_model(spec.path, dtype=spec.dtype, device=spec.device, dequantize=spec.weights == "float16")
        if spec.weights in ("int8", "int4"):
            report(f"quantizing the weights to {spec.weights}", 0.6)
            quantize_weights(model, spec.weights)
        elif spec.weights == "float16" and model.embed.weight.dtype == torch.float32:
            model.store_weights(torch.float16)
        report("allocating the KV cache", 0.7)
        engine = cls(model, tokenizer, max_context=spec.max_context, kv_cache=spec.kv_format or "float32")
        engine.spec = spec
        if spec.drafter is not None:
            report(f"loading the drafter ({spec.drafter})", 0.8)
        engine.use_drafter(spec.drafter, spec.draft_length)
        engine.plan = plan
        return_freed_heap()  # what loading freed stays resident in the C heap otherwise
        report("loaded", 1.0)
        return engine

    @classmethod
    def _load_bundle(cls, spec: LoadSpec, report: Callable[[str, float], None]) -> "Engine":
        """An edge-export bundle on one of its backends; drafter "bundle" (or "builtin") is the bundle's own."""
        report("checking the bundle's files", 0.0)
        bundle = read_bundle(spec.path)
        backend = bundle.pick_backend(spec.backend)
        report("reading the tokenizer", 0.3)
        tokenizer = _tokenizer(spec)
        report(f"opening the target ({backend})", 0.4)
        engine = cls(bundle.open_model("target", backend), tokenizer, max_context=spec.max_context)
        engine.bundle, engine.backend, engine.spec = bundle, backend, spec
        if spec.drafter is not None:
            report(f"opening the drafter ({spec.drafter})", 0.8)
        engine.use_drafter(spec.drafter, spec.draft_length)
        report("loaded", 1.0)
        return engine

    def use_drafter(self, drafter: "str | DrafterSpec | Drafter | None", draft_length: int | str = "adaptive", *,
                    dtype: str | None = None, draft_vocab: "str | Path | torch.Tensor | None" = None,
                    draft_context: int | None = None, draft_weights: str | None = None,
                    draft_kv: str | None = None) -> None:
        """Speculate with `drafter` (a spec such as "early-exit:4", or a Drafter), or stop speculating (None).
        A separate draft model computes in `dtype` with its own options (`draft_context`, `draft_weights`,
        `draft_kv`); each one left out is the engine's load spec's (edge/load_spec.py). `draft_vocab` trims a model
        drafter's head to those token ids (or a JSON file of them)."""
        length = _draft_length(draft_length)
        loaded = self.spec.draft if self.spec is not None else DraftModelOptions()
        options = DraftModelOptions(draft_context if draft_context is not None else loaded.context,
                                    draft_weights or loaded.weights, draft_kv or loaded.kv_cache)
        if isinstance(drafter, (str, DrafterSpec)) or drafter is None:
            spec = DrafterSpec.parse(drafter)
            if self.spec is not None:
                self.spec = self.spec.replace(drafter=spec, draft=options)
            drafter = spec.build(DraftTarget(self.model, self.cache, self.tokenizer,
                                             self._draft_context(options.context, length),
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
        if drafter is not None and self.model.dtype != torch.float32:
            log.warning("speculative decoding in %s is not guaranteed token-identical to plain decoding: "
                        "half-precision matmuls round differently for k+1 tokens than for 1; use float32 for "
                        "exact output", str(self.model.dtype).removeprefix("torch."))

    def _draft_context(self, requested: int | None, length: DraftLength) -> int:
        if requested is None:
            return self.max_context
        least = 2 * (length.longest + 1)  # a window restart keeps half, and a draft must fit after it
        if not isinstance(requested, int) or not least <= requested:
            raise SamplingError(f"draft context must be a whole number of at least {least} tokens (twice the longest "
                                f"draft plus one), got {requested!r}")
        return min(requested, self.max_context)

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
        (a GenerationOptions) and/or its fields as keywords (which override it)."""
        opts = GenerationOptions.merged(options, overrides)
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError("the prompt is empty; pass some text to continue")
            ids = self.tokenizer.encode(_checked_text(prompt, "the prompt"), add_special_tokens=True)
        else:
            ids = _token_ids(prompt)
        return self._stream(ids, opts, response_format_grammar(opts.response_format))

    def chat(self, messages: Sequence[dict], options: GenerationOptions | None = None, *,
             template_kwargs: dict | None = None, tools: Sequence[dict] | None = None,
             tool_choice: str | dict | None = None, **overrides) -> Iterator[Event]:
        """Answer the last message of a conversation rendered with the checkpoint's chat template.

        `tools` (OpenAI's [{"type": "function", "function": {"name", "description", "parameters"}}]) go to a template
        that renders them, else into a system message saying how to call them (edge/decoding/tools.py). With
        `tool_choice` "required" or {"type": "function", "function": {"name": ...}} the reply is one JSON tool call by
        construction; "auto" (the default with tools) lets the model choose; "none" asks for text. Read the calls
        from the reply's text with `edge.decoding.tools.parse_tool_calls(text, tools)`. `options` and keywords as
        for generate()."""
        opts = GenerationOptions.merged(options, overrides)
        check_messages(messages)
        plan = plan_tool_use(self.tokenizer, list(messages), tools, tool_choice)
        kwargs = {**(template_kwargs or {}), **plan.template_kwargs}
        text = self.tokenizer.apply_chat_template(plan.messages, add_generation_prompt=True, **kwargs)
        grammar = plan.grammar or response_format_grammar(opts.response_format)
        return self._stream(self._continue_history(_checked_text(text, "the chat")), opts, grammar)

    def fit_chat(self, messages: Sequence[dict], reserve: int, *, template_kwargs: dict | None = None
                 ) -> tuple[list[dict], int]:
        """The context-full policy for chats: drop the oldest turns (never the system prompt or the last message)
        until the rendered chat plus `reserve` tokens for the reply fits the context. Returns the messages to send
        and how many were dropped; raises PromptError if even the last message alone does not fit."""
        def render(kept: list[dict]) -> str:
            return self.tokenizer.apply_chat_template(kept, add_generation_prompt=True, **(template_kwargs or {}))
        return self.fit_messages(messages, reserve, render)

    def fit_messages(self, messages: Sequence[dict], reserve: int, render: Callable[[list[dict]], str]
                     ) -> tuple[list[dict], int]:
        """`fit_chat` for any rendering of the messages to prompt text (a base model's running text, say)."""
        check_messages(messages)
        messages = list(messages)
        head = [m for m in messages[:1] if m.get("role") == "system"]
        turns = messages[len(head):]
        dropped = 0
        while True:
            text = render(head + turns)
            size = len(self.tokenizer.encode(_checked_text(text, "the chat"), add_special_tokens=False))
            if size + reserve <= self.max_context:
                return head + turns, dropped
            if len(turns) <= 1:
                raise ContextLengthError(f"the last message is {size} tokens and the reply needs {reserve} more, but the "
                                  f"context holds {self.max_context}; {self._context_fix(size + reserve)}")
            cut = 2 if len(turns) > 2 and turns[0].get("role") == "user" else 1  # a user turn and its reply
            turns, dropped = turns[cut:], dropped + cut

    def _context_fix(self, needed: int) -> str:
        """How to make `needed` tokens fit: a longer context (--max-context), unless the model's own limit is the
        bound."""
        limit = self.model.config.max_position_embeddings
        if needed > limit:
            return f"shorten it: the model itself reads at most {limit} tokens"
        return f"shorten it, or load with a longer context (--max-context {needed}, or max_context={needed})"

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

    def _continue_history(self, text: str) -> list[int]:
        """Token ids for a rendered chat: the last call's tokens as generated, if `text` continues them."""
        if self._history:
            known = self.tokenizer.decode(self._history, skip_special_tokens=False)
            if text.startswith(known):
                return self._history + self.tokenizer.encode(text[len(known):], add_special_tokens=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    # -- the loop ---------------------------------------------------------------------------------------------

    def constraint(self, grammar: Grammar) -> Constraint:
        """A fresh state of `grammar` over this model's vocabulary (the vocabulary is read once per engine)."""
        if self._grammar_vocabulary is None:
            self._grammar_vocabulary = GrammarVocabulary(self.tokenizer, self.model.config.vocab_size,
                                                         self.eos_token_ids)
        return self._grammar_vocabulary.constraint(grammar)

    def _stream(self, prompt_ids: list[int], opts: GenerationOptions, grammar: Grammar | None = None
                ) -> Iterator[Event]:
        self._check_prompt(prompt_ids)
        params = opts.sampling
        generator = params.generator(self.device)
        if grammar is not None and opts.ignore_eos:
            raise GrammarError("ignore_eos cannot go with a response format or a forced tool call: the grammar ends "
                               "the reply; leave ignore_eos out")
        constraint = self.constraint(grammar) if grammar is not None else None
        strategy: DecodingStrategy
        if self.drafter is not None and opts.speculate:
            if opts.task is not None and hasattr(self.drafter, "set_task"):
                self.drafter.set_task(opts.task)
            length = dataclasses.replace(self.draft_length)  # each call starts from the configured length
            strategy = SpeculativeDecoding(self.model, self.cache, params, generator, self.drafter, length, constraint)
        else:
            strategy = Autoregressive(self.model, self.cache, params, generator, constraint)
        return self._run(prompt_ids, opts, strategy, generator, constraint)

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise PromptError("the prompt is empty; pass some text to continue")
        if len(prompt_ids) >= self.max_context:
            raise ContextLengthError(f"the prompt is {len(prompt_ids)} tokens but the context holds {self.max_context}; "
                              f"{self._context_fix(len(prompt_ids) + 1)}")
        vocab = self.model.config.vocab_size
        bad = next((token for token in prompt_ids if not 0 <= token < vocab), None)
        if bad is not None:
            raise PromptError(f"token id {bad} is outside the vocabulary (0..{vocab - 1}); encode with this model's tokenizer")

    def _run(self, prompt_ids: list[int], opts: GenerationOptions, strategy: DecodingStrategy,
             generator: torch.Generator, constraint: Constraint | None = None) -> Iterator[Event]:
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("this engine is already generating a reply (another iterator or thread); finish "
                                  "or close that one first (iterator.close()), or load a second Engine")
        try:
            yield from self._generate(prompt_ids, opts, strategy, generator, constraint)
        finally:
            self._busy.release()

    def _generate(self, prompt_ids: list[int], opts: GenerationOptions, strategy: DecodingStrategy,
                  generator: torch.Generator, constraint: Constraint | None = None) -> Iterator[Event]:
        stats = Stats(prompt_tokens=len(prompt_ids))
        tokens = list(prompt_ids)
        text_stream = StreamDecoder(self.tokenizer)
        stops = StopStrings(opts.stop)
        step, wall_s = self._prefill(tokens, stats, opts.sampling, generator, constraint), None
        self._history = tokens  # from here on the cache holds a prefix of `tokens`
        budget = 1  # the prefill emits exactly one token
        while True:
            appended = self._append(tokens, step.tokens[:budget], opts)
            finish = ev.FINISH_EOS if self._is_eos(appended[-1], opts) else None
            visible = appended[:-1] if finish else appended
            drafted_count = sum(step.drafted[: len(visible)])  # accepted drafts lead each step's tokens
            drafted_text, hit_stop = stops.push(text_stream.push(visible[:drafted_count]))
            text = drafted_text
            if not hit_stop:
                target_text, hit_stop = stops.push(text_stream.push(visible[drafted_count:]))
                text += target_text
            _count_step(stats, step, len(appended), wall_s)
            finish = finish or self._finish_reason(stats, tokens, opts, hit_stop)
            if finish is not None and not hit_stop:
                tail, hit_stop = stops.push(text_stream.flush())
                text += tail if hit_stop else tail + stops.flush()
                finish = ev.FINISH_STOP_STRING if hit_stop else finish
            yield Event(text, tuple(appended), tuple(step.drafted[: len(appended)]), stats.snapshot(), finish,
                        drafted_chars=len(drafted_text))
            if finish is not None:
                return
            budget = min(opts.max_new_tokens - stats.generated_tokens, self.max_context - len(tokens))
            t0 = time.perf_counter()
            with torch.inference_mode():
                step = strategy.step(tokens, budget)
            wall_s = time.perf_counter() - t0

    def _is_eos(self, token: int, opts: GenerationOptions) -> bool:
        return token in self.eos_token_ids and not opts.ignore_eos

    def _append(self, tokens: list[int], emitted: list[int], opts: GenerationOptions) -> list[int]:
        """Append emitted tokens up to the first end-of-sequence; keep the cache one token behind `tokens`."""
        appended = []
        for token in emitted:
            appended.append(token)
            if self._is_eos(token, opts):
                break
        tokens.extend(appended)
        if self.cache.length > len(tokens) - 1:  # a step cached tokens past an end-of-sequence
            self.cache.rollback(len(tokens) - 1)
        return appended

    def _finish_reason(self, stats: Stats, tokens: list[int], opts: GenerationOptions, hit_stop: bool) -> str | None:
        if hit_stop:
            return ev.FINISH_STOP_STRING
        if stats.generated_tokens >= opts.max_new_tokens:
            return ev.FINISH_MAX_TOKENS
        if len(tokens) >= self.max_context:
            return ev.FINISH_CONTEXT
        if opts.should_stop is not None and opts.should_stop():
            return ev.FINISH_STOPPED
        return None

    def _prefill(self, tokens: list[int], stats: Stats, params: SamplingParams, generator: torch.Generator,
                 constraint: Constraint | None = None) -> Step:
        """Roll the cache back to the longest cached prefix of `tokens`, run the rest, and choose the first token."""
        cached = self._history[: self.cache.length]  # what the previous call left in the cache
        reuse = common_prefix(cached, tokens[:-1])  # at least the last token is run
        self.cache.rollback(reuse)
        todo = tokens[reuse:]
        t0 = time.perf_counter()
        with torch.inference_mode():
            hidden = self.model(torch.tensor([todo], device=self.device), reuse, self.cache)  # (1, T, D)
            logits = self.model.logits(hidden[:, -1:])[0, -1]  # (V,)
            t1 = time.perf_counter()
            if constraint is not None:
                logits = constraint.mask(logits)
            token = next_token(logits, params, history_tensor(tokens, params, self.device), generator)
            if constraint is not None:
                constraint.consume([token])
        t2 = time.perf_counter()
        stats.prefill_s, stats.reused_tokens, stats.prefill_tokens = t2 - t0, reuse, len(todo)
        return Step(tokens=[token], drafted=[False], verify_s=t1 - t0, sample_s=t2 - t1)


def _count_step(stats: Stats, step: Step, new_tokens: int, wall_s: float | None) -> None:
    """Add one step to the counters; the first step comes from the prefill (wall_s None), not from decoding."""
    stats.generated_tokens += new_tokens
    stats.steps += 1
    if wall_s is not None:
        stats.decode_tokens += new_tokens
        stats.decode_s += wall_s
    stats.draft_s += step.draft_s
    stats.verify_s += step.verify_s
    stats.sample_s += step.sample_s
    stats.drafted += step.drafted_count
    accepted = sum(step.drafted)
    stats.accepted += accepted
    if step.drafted_count:
        slots = stats.accepted_by_position
        slots.extend([0] * (step.drafted_count - len(slots)))
        for position in range(accepted):
            slots[position] += 1


def _tokenizer(spec: LoadSpec) -> Tokenizer:
    """The model's tokenizer, with the spec's chat template file in place of its own."""
    tokenizer = Tokenizer.from_dir(spec.path)
    if spec.chat_template is not None:
        tokenizer.set_chat_template(read_template_file(spec.chat_template))
    return tokenizer


def _draft_length(value: int | str | DraftLength) -> DraftLength:
    return value if isinstance(value, DraftLength) else DraftLength.parse(value)



def _exported(spec: LoadSpec, report: Callable[[str, float], None]) -> LoadSpec:
    """The spec that runs a checkpoint folder on ONNX Runtime: its int8 export in the cache, made once by the
    exporter edge-export registers (the "edge.exporters" entry point: export/auto_export.py). A draft checkpoint
    rides in the export as the bundle's drafter, unless its own weights or cache are asked for: then it runs on
    torch beside the exported target."""
    drafter = spec.drafter
    bake = drafter is not None and drafter.is_draft_checkpoint() and not (spec.draft.weights or spec.draft.kv_cache)
    report("exporting to ONNX (once; cached)", 0.0)
    bundle = _exporter("onnx")(spec.path, draft=drafter.folder() if bake else None)
    return spec.replace(path=bundle, drafter=dataclasses.replace(drafter, kind="bundle", argument="") if bake
                        else drafter)


def _exporter(name: str) -> Callable[..., Path]:
    found = entry_points(group="edge.exporters", name=name)
    try:
        return next(iter(found)).load()
    except (StopIteration, ImportError) as error:
        missing = getattr(error, "name", None) or "edge's exporter"
        raise BundleError(f"running a checkpoint on ONNX Runtime exports it first, which needs {missing}: pip install "
                          "'edge[export]', or export it yourself with edge-export") from None


def _checked_text(text: str, what: str) -> str:
    """`text` if it is valid Unicode throughout; a lone surrogate (undecodable bytes read with surrogateescape, as
    Python reads a command line or a pipe) is a PromptError naming where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PromptError(f"{what} is not valid UTF-8 text (an undecodable byte at character {error.start}); "
                          "save or pipe it as UTF-8") from None
    return text


def _token_ids(prompt: object) -> list[int]:
    """A prompt given as token ids: any sequence of integers (ints, numpy or 0-d torch integers); bytes would read as
    byte values, so they are refused like every other non-prompt."""
    kind = type(prompt).__name__
    if isinstance(prompt, (bytes, bytearray)):
        raise PromptError(f"a prompt is text (str) or a list of token ids (ints), got {kind}; decode it first: "
                          "prompt.decode('utf-8')")
    try:
        return [operator.index(token) for token in prompt]
    except TypeError:
        raise PromptError(f"a prompt is text (str) or a list of token ids (ints), got {kind}") from None
