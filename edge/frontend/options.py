"""Command-line options shared by edge-chat, edge-serve and edge-bench: which model, how to load it, how to sample."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from edge.sources import catalogue, default_model
from edge.sources.builtin import builtin_drafter_path, builtin_feature_drafter_path
from edge.sources.draft_finder import drafts_beside
from edge.sources.installed_heads import installed_head
from edge.sources.default_model import DEFAULT_MODEL_HELP
from edge.decoding.registry import usage as drafter_usage
from edge.decoding.sampling import DEFAULTS, OPTIONS, asked_over, label
from edge.engine import GenerationOptions
from edge.errors import SettingError
from edge.load_spec import (BACKENDS, DEFAULT_MAX_CONTEXT, DRAFT_KV_CACHES, DRAFT_WEIGHTS, DTYPES, LOAD_WEIGHTS,
                             LoadSpec)
from edge.sources.model_source import hub_cache_dir, named_model_file, resolve_model
from edge.sources.sampling_config import RECOMMENDABLE, recommended_sampling
from edge.planning import plan
from edge.model.quantized_kv_cache import KV_CACHE_CHOICES


def add_model_arguments(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    help_text = ("a checkpoint folder (Hugging Face layout: config.json, *.safetensors, tokenizer.json), an "
                 "edge-export bundle, a .gguf file (run in its own quantization: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                 "Q4_K, Q5_K, Q6_K, or F16/BF16/F32) or a Hub id (org/name, org/name@revision, org/name:Q4_K_M "
                 "for a GGUF repo): taken from the Hugging Face cache, else downloaded unless HF_HUB_OFFLINE is set; "
                 "or a name from `edge list` once `edge pull NAME` downloaded it")
    if positional:
        parser.add_argument("model", nargs="?", help=f"{help_text}; {DEFAULT_MODEL_HELP}")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="weight and KV-cache dtype (default: float32)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--weights", default=None, choices=LOAD_WEIGHTS,
                        help="re-quantize the layers' matrices and the head at load for edge's CPU kernel: int8 (per "
                             "output channel, activations per row) or int4 (groups of 32, about half of int8's "
                             "bytes). Each is a slightly different model (logits move by about 1%% at int8, more at "
                             "int4); speculation stays exactly equal to its own plain decoding. float16: 16-bit "
                             "matrices computed in float32 (a GGUF file's quantized blocks dequantized: about 3x its "
                             "size in memory). Default: the weights as stored; a GGUF file runs in its own "
                             "quantization")
    parser.add_argument("--kv-cache", default=None, choices=KV_CACHE_CHOICES,
                        help="store the KV cache quantized: int8, int8-int4 (int8 keys, int4 values) or "
                             "hierarchical (QuantSpec's int4+int4; --drafter quantspec selects it); default: --dtype")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="what runs the model. A checkpoint folder runs on torch by default; onnx exports it "
                             "once (int8, cached in ~/.cache/edge/bundles; needs pip install 'edge[export]') and runs "
                             "it on ONNX Runtime, several times faster on a CPU. A bundle runs its first target "
                             "(ONNX when exported) unless one is named")
    parser.add_argument("--max-context", type=int, default=DEFAULT_MAX_CONTEXT,
                        help=f"tokens the preallocated KV cache holds (default: {DEFAULT_MAX_CONTEXT})")
    parser.add_argument("--memory-budget", metavar="SIZE",
                        help="memory to plan for, e.g. 6GiB or 512MiB: the planner shortens the context and steps "
                             "the drafter down (draft model -> n-gram -> off) until weights, KV cache and "
                             "speculation fit (default: no plan, allocate what is asked)")
    parser.add_argument("--plan", action="store_true",
                        help="print the memory plan (as JSON) for the budget, or for the free memory without one, "
                             "and exit without loading weights")
    parser.add_argument("--chat-template", metavar="FILE", default=None,
                        help="a Jinja chat template to use instead of the model's own; a base model (one without a "
                             "template) runs as a completion model unless given one")


def load_spec(args: argparse.Namespace, drafter: str | None) -> LoadSpec:
    """The load spec the command line names (`drafter`: the drafter chosen, with the command's own default)."""
    return LoadSpec.from_options(resolve_model_path(args.model), dtype=args.dtype, device=args.device,
                                 weights=args.weights, max_context=args.max_context, backend=args.backend,
                                 kv_cache=args.kv_cache, memory_budget=args.memory_budget, drafter=drafter,
                                 draft_length=args.draft_length, draft_context=args.draft_context,
                                 draft_weights=args.draft_weights, draft_kv=args.draft_kv,
                                 chat_template=getattr(args, "chat_template", None))


def default_drafter(args: argparse.Namespace) -> str | None:
    """The drafter asked for ("none": off); else plain decoding when sampling (the default, and any temperature above
    0: drafts are accepted less often, and sampling's penalty moves the text off the drafters' own); when greedy
    (--temperature 0), for a model named on the command line, its pulled catalogue draft or the smallest GGUF file
    beside a GGUF model with its tokenizer (a draft model), else the EAGLE-3 head built here for it (each said on
    stderr), else plain decoding; for the default
    model, the fastest drafter measured on it:
    retrieval (its own replies, and prompt lookup) on SmolLM2-135M-Instruct, and on the built-in model n-gram lookup
    backed by its feature drafter (or its draft model where no feature drafter ships). edge-chat and edge-serve share
    it."""
    if args.drafter is not None:
        return None if args.drafter == "none" else args.drafter
    if args.temperature != 0:  # sampling: the default, and any temperature above 0
        return None
    if args.model is not None:
        return draft_beside(args.model)
    if default_model.packaged_file() is not None:
        return "retrieval"
    if builtin_feature_drafter_path() is not None:
        return "hybrid:feature"
    return "hybrid:builtin" if builtin_drafter_path() is not None else None


def draft_beside(model: str) -> str | None:
    """The drafter for a named model: draft:FILE for its catalogue draft where pulled, else the smallest GGUF file
    beside a named GGUF model with its tokenizer (edge/sources/draft_finder.py), else the EAGLE-3 head built here for
    it (python -m train.install_head), said on stderr; None where there is none. A draft model comes first because
    it measured faster: on Qwen2.5-Coder-1.5B Q4_K_M its 0.5B sibling in Q4_0 gave 1.13x plain decoding, the head
    trained here (45% of its first draft tokens agreeing) 1.03x (docs/benchmarks.md, "Speculation on a real 1.5B
    file")."""
    pulled = catalogue_draft(model)
    if pulled is not None:
        return pulled
    found = drafts_beside(model)
    if found:
        print(f"drafting with {found[0].name} (beside the model, same tokenizer; the adaptive draft length pauses it "
              "where it does not pay; --drafter none turns it off)", file=sys.stderr)
        return f"draft:{found[0]}"
    head = installed_head(named_model_file(model))
    if head is None:
        return None
    print(f"drafting with the EAGLE-3 head built for this model ({head}; the adaptive draft length pauses it where "
          "it does not pay; --drafter none turns it off)", file=sys.stderr)
    return f"eagle3:{head}"


def catalogue_draft(model: str) -> str | None:
    """draft:FILE for a catalogue model's draft (edge/models/catalogue/catalogue.json) where it is pulled, said on
    stderr; None where the model is not a catalogue name, has no draft, or its draft is not pulled."""
    entry = catalogue.lookup(model) if not Path(model).exists() else None
    draft = catalogue.lookup(entry.draft) if entry is not None and entry.draft else None
    path = catalogue.pulled_file(draft, hub_cache_dir()) if draft is not None else None
    if path is None:
        return None
    print(f"drafting with {draft.name} (its draft in edge's catalogue; the adaptive draft length pauses it where it "
          "does not pay; --drafter none turns it off)", file=sys.stderr)
    return f"draft:{path}"


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads decoding uses (default: torch's, one per core); on a machine busy with "
                             "other work, fewer threads than cores wait less on each other")


def command_spec(args: argparse.Namespace) -> LoadSpec | None:
    """What edge-chat and edge-serve load: the command line's spec with their default drafter, and --threads
    applied; None when --plan asked for the plan only (printed here)."""
    if args.threads is not None and args.threads < 1:  # checked before the model is read
        raise SettingError(f"--threads must be at least 1, got {args.threads}")
    spec = load_spec(args, default_drafter(args))
    if args.plan:
        # edge-serve's slots (None: as many as fit) and their prompt cache
        print_plan(spec, getattr(args, "parallel", 1), getattr(args, "prompt_cache_bytes", 0))
        return None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return spec


def print_plan(spec: LoadSpec, slots: int | None = 1, prompt_cache: int = 0) -> None:
    """--plan: the plan for this spec (the one Engine.from_spec loads under its budget) with `slots` replies decoded
    together (edge-serve --parallel) and their prompt cache of `prompt_cache` bytes, from config files only."""
    chosen = plan(spec, slots=slots, prompt_cache=prompt_cache)
    print(json.dumps(chosen.to_dict(), indent=1))
    print(chosen.summary(), file=sys.stderr)


def add_speculation_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("speculative decoding (lossless: the output is the target's own)")
    group.add_argument("--drafter", default=None, metavar="SPEC",
                       help=f"draft with: {drafter_usage()}, or none; default when greedy (--temperature 0): "
                            "retrieval (the model's own replies, and n-gram lookup) for the default model, "
                            "hybrid:feature (n-gram lookup, then the built-in feature drafter) for the built-in model; "
                            "for a model you name, its pulled catalogue draft or the smallest GGUF file beside it with "
                            "its tokenizer (a draft model), else the EAGLE-3 head built for it (python -m "
                            "train.install_head), else plain decoding; plain decoding when sampling (the default)")
    group.add_argument("--draft-length", default="adaptive", metavar="K",
                       help="tokens drafted per step: 'adaptive' (default: each step the length with the most "
                            "expected tokens per second, from the verify and draft times measured so far and the "
                            "acceptance), 'adaptive:P' (adaptive, and a draft also stops before a token its drafter "
                            "gives a probability below P) or a fixed number")
    group.add_argument("--draft-context", type=int, default=None, metavar="N",
                       help="a separate draft model's own cache length: it drafts from a window of the newest N "
                            "tokens (less memory; default: the whole context)")
    group.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default=None,
                       help="store a separate draft model's weights in bfloat16 while computing in float32 (half its "
                            "weight memory), or quantize its layers to int8 or int4 (edge's CPU kernel: faster "
                            "drafting, notably beside an ONNX bundle); the output is unchanged (default: --dtype)")
    group.add_argument("--draft-kv", choices=DRAFT_KV_CACHES, default=None,
                       help="store a separate draft model's own KV cache quantized (default: float32)")


def add_sampling_arguments(parser: argparse.ArgumentParser, **defaults) -> None:
    """The shared generation options' flags (--max-new-tokens, --temperature, ...), each from its field in
    SamplingParams (type, default, limits and help); `defaults` overrides a field's default for this command. A flag
    left out is None here: `generation_options` fills it from the model's recommended sampling, else the default."""
    group = parser.add_argument_group(
        "sampling", "defaults: the model's recommended sampling where its files carry one (generation_config.json, "
                    "a GGUF file's general.sampling.*), else llama.cpp's and Ollama's; --temperature 0 is greedy "
                    "(without a repetition penalty unless --repetition-penalty asks for one)")
    for name, limits in OPTIONS.items():
        default = defaults.get(name, DEFAULTS[name])
        taken = dict(action="append", default=[]) if limits.kind is str else dict(type=limits.kind, default=None)
        usage = limits.usage(default)
        if name in RECOMMENDABLE:
            usage = usage[:-1] + ", or the model's recommended)"
        group.add_argument(flag(name), metavar=limits.metavar, help=usage, **taken)  # str: repeated
    parser.set_defaults(sampling_defaults={**DEFAULTS, **defaults})


def flag(name: str) -> str:
    return "--" + label(name)


def generation_options(args: argparse.Namespace, recommended: dict | None = None) -> GenerationOptions:
    """The sampling flags as options, over the model's `recommended` sampling (sampling_config.recommended_sampling)
    and the command's defaults; a value out of its limits is a SamplingError naming the flag."""
    asked = {name: getattr(args, name) for name in OPTIONS}
    asked = {name: tuple(value) if isinstance(value, list) else value for name, value in asked.items()}  # --stop
    for name, limits in OPTIONS.items():
        if asked[name] is not None:
            limits.check(asked[name], flag(name))
    asked = {name: value for name, value in asked.items() if value is not None}
    defaults = {**getattr(args, "sampling_defaults", DEFAULTS), **(recommended or {})}
    return GenerationOptions(**asked_over(defaults, asked))


def model_options(args: argparse.Namespace, spec: LoadSpec | None) -> GenerationOptions:
    """`generation_options` over the recommended sampling of the model `spec` loads (read from its folder)."""
    return generation_options(args, recommended_sampling(spec.path) if spec is not None else None)


def resolve_model_path(model: str | None) -> Path:
    """The checkpoint folder to load: the one given (a .gguf file or a Hub id resolved to its folder), or the default
    model (edge/sources/default_model.py: SmolLM2-135M-Instruct where installed, else the built-in model, said once)."""
    return resolve_model(model or default_model.default_model_path())
