"""The plan: what to allocate so that decoding fits the budget, and what was given up to get there.

    plan = make_plan(PlanRequest(target=shape, context=4096, drafter="model", drafter_shape=draft, draft_length=12),
                     budget=probe("cpu", "2GiB").budget)
    plan.to_dict()   # JSON: max context, drafter, draft length, the footprint, the step-downs taken and why

When the request does not fit, the planner steps down in this order, recording each step and its reason:

    1. the draft model's weights stored in bfloat16 (computing in float32): half its weight memory
    2. the draft model's own KV cache stored as int8 (a float16 scale per vector): about a quarter
    3. a shorter draft context: the draft model's cache holds `min_draft_context` tokens (it drafts from a window
       of the newest tokens), not the whole context
    4. a separate draft model -> the n-gram drafter (no weights, no cache), if the draft model does not fit even
       with the shortest context
    5. speculation off (no verify buffers), if speculation does not fit even with the shortest context
    6. a shorter context (halved until it fits, down to `min_context`)

Speculation is what edge is for, so it is kept at the cost of context as long as it fits at all.

Then the slots (edge-serve --parallel): each reply decoded together with others holds its own KV cache of the
planned context beside the engine's, and their fused passes a buffer of BATCH_ROWS rows. `slots` asks for that many
(fewer when fewer fit, a step-down with its reason), None for as many as fit up to AUTO_SLOTS; one slot allocates
nothing more (replies one at a time, in the engine's own cache). Last, with more than one slot, the prompt cache:
`prompt_cache` bytes of host memory for the keys and values a slot held before another reply took it (less when
less is left, a step-down).

(The design's last step - offloading layers to the CPU, on a GPU - joins the order as the engine
learns them; a plan only ever asks for what the engine can allocate.) Below `minimum` - the plain model at
`min_context` - nothing fits, and `make_plan` raises a BudgetError naming that minimum. `lower_bound` is the least
memory that still keeps the requested speculation on at `min_context`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from edge.memory.budget import BudgetError, format_size
from edge.memory.footprint import Footprint, ModelShape, footprint

# self: early exit / layer skip, sharing the target's weights and KV; quantspec: the same plus int4/int8 copies of
# the projections, reading the target's (hierarchical) KV
DRAFTERS = ("none", "ngram", "self", "quantspec", "model")
AUTO_SLOTS = 4  # slots when none are asked for and more fit (llama-server's default); more gain little on a CPU
BATCH_ROWS = 128  # the most rows of one fused pass of the batch (edge/kernels/runner.py FUSED_CHUNK)


@dataclass(frozen=True)
class PlanRequest:
    target: ModelShape
    context: int
    drafter: str = "none"
    drafter_shape: ModelShape | None = None  # for drafter == "model"
    draft_length: int = 12  # the most tokens one step may draft
    weight_dtype: str = "float32"
    kv_dtype: str = "float32"
    min_context: int = 256
    draft_context: int | None = None  # a draft model's own cache length (None: the target's context)
    min_draft_context: int = 256  # the shortest draft context the planner steps down to
    drafter_weight_dtype: str | None = None  # a quantized (exported) drafter's weights (None: weight_dtype)
    narrow_drafter: bool = False  # whether the engine can store this drafter's weights in bfloat16 (a step-down)
    draft_kv_dtype: str | None = None  # the draft model's cache format (None: kv_dtype)
    can_offload: bool = False  # the device has a host to offload layers to (a GPU): the last step-down
    quantspec_bits: int = 4  # a quantspec drafter's weight bits
    quantizable_draft_kv: bool = False  # whether the engine can store the draft model's cache as int8 (a step-down)
    stored_weight_bytes: int | None = None  # the target's weights exactly, where the shape cannot say (a GGUF file's
    #                                         blocks); weight_dtype then only names them
    slots: int | None = 1  # replies decoded together, each with its own KV cache (None: as many as fit, AUTO_SLOTS)
    prompt_cache: int = 0  # bytes asked for the slots' prompt cache (edge-serve --prompt-cache)

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        if self.drafter == "model" and self.drafter_shape is None:
            raise ValueError("a 'model' drafter needs its drafter_shape")


@dataclass
class Plan:
    budget: int
    max_context: int
    drafter: str
    draft_length: int
    weight_dtype: str
    kv_dtype: str
    footprint: Footprint
    minimum: int  # the plain model at min_context: below this nothing runs
    lower_bound: int  # the requested speculation at min_context: below this speculation is switched off
    steps: list[str] = field(default_factory=list)  # the step-downs taken, each with its reason
    draft_context: int | None = None  # a draft model's cache length when shorter than max_context
    drafter_weights: str | None = None  # a draft model's weight storage when narrower than weight_dtype
    draft_kv: str | None = None  # a draft model's cache format when quantized
    offloaded_layers: list[int] = field(default_factory=list)  # target layers streamed from host memory
    runtime_overhead: int = 0  # the runtime's own memory (interpreter, torch, kernels), measured when planning;
    # reported beside the plan, not taken from the budget, which is for what the model allocates
    slots: int = 1  # replies decoded together (edge-serve --parallel)
    slot_bytes: int = 0  # what more than one slot allocates: a KV cache each, and the batch's pass buffers
    prompt_cache_bytes: int = 0  # the slots' prompt cache (host memory for keys and values they held)

    @property
    def total(self) -> int:
        """Everything the plan allocates: the footprint, the slots' and their prompt cache."""
        return self.footprint.total + self.slot_bytes + self.prompt_cache_bytes

    @property
    def expected_peak(self) -> int:
        """What the process should peak at: the runtime's own memory plus everything the plan allocates."""
        return self.runtime_overhead + self.total

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def to_dict(self) -> dict:
        data = asdict(self)
        data["footprint"] = self.footprint.to_dict()
        data["expected_peak"] = self.expected_peak
        return data

    def summary(self) -> str:
        speculation = "off" if self.drafter == "none" else f"{self.drafter}, k <= {self.draft_length}"
        cache = f", prompt cache {format_size(self.prompt_cache_bytes)}" if self.prompt_cache_bytes else ""
        slots = f"; {self.slots} slots ({format_size(self.slot_bytes)}){cache}" if self.slots > 1 else ""
        lines = [f"plan: {format_size(self.total)} of a {format_size(self.budget)} budget; context "
                 f"{self.max_context} tokens; speculation {speculation}{slots}"]
        if self.runtime_overhead:
            lines.append(f"  runtime: {format_size(self.runtime_overhead)} more for the interpreter and libraries "
                         f"(expected peak {format_size(self.expected_peak)})")
        lines += [f"  step-down: {step}" for step in self.steps]
        return "\n".join(lines)


def _footprint(request: PlanRequest, context: int, offloaded: int = 0) -> Footprint:
    drafting = request.drafter != "none"
    return footprint(request.target, context, weight_dtype=request.weight_dtype, kv_dtype=request.kv_dtype,
                     drafter=request.drafter_shape if request.drafter == "model" else None,
                     drafter_weight_dtype=request.drafter_weight_dtype, draft_kv_dtype=request.draft_kv_dtype,
                     draft_context=min(request.draft_context or context, context),
                     draft_length=request.draft_length if drafting else 0, offloaded_layers=offloaded,
                     quantized_self_draft=request.quantspec_bits if request.drafter == "quantspec" else None,
                     target_weight_bytes=request.stored_weight_bytes)


def make_plan(request: PlanRequest, budget: int) -> Plan:
    minimum = _footprint(replace(request, drafter="none"), request.min_context).total
    if budget < minimum and request.can_offload:
        return _offload_plan(request, budget, minimum)
    if budget < minimum:
        raise BudgetError(f"the memory budget {format_size(budget)} cannot hold the model: it needs at least "
                          f"{format_size(minimum)} ({minimum} bytes: weights and a {request.min_context}-token KV "
                          "cache); raise the budget or use a smaller or quantized model")
    lower_bound = _footprint(request, request.min_context).total
    steps: list[str] = []
    current, context = request, request.context

    def needs(candidate: PlanRequest, tokens: int) -> int:
        return _footprint(candidate, tokens).total

    if current.drafter == "model" and needs(current, context) > budget and current.narrow_drafter:
        steps.append(f"draft model weights float32 -> bfloat16: with float32 weights speculation makes "
                     f"{format_size(needs(current, context))}")
        current = replace(current, drafter_weight_dtype="bfloat16", narrow_drafter=False)
    if current.drafter == "model" and needs(current, context) > budget and current.quantizable_draft_kv:
        steps.append(f"draft KV cache {current.kv_dtype} -> int8: with it speculation makes "
                     f"{format_size(needs(current, context))}")
        current = replace(current, draft_kv_dtype="int8", quantizable_draft_kv=False)
    window = min(request.min_draft_context, context)
    if current.drafter == "model" and needs(current, context) > budget and (current.draft_context or context) > window:
        steps.append(f"draft context {current.draft_context or context} -> {window} tokens: the draft model's cache "
                     f"for the whole context makes {format_size(needs(current, context))}")
        current = replace(current, draft_context=window)
    if needs(current, request.min_context) > budget and current.drafter == "model":
        steps.append(f"draft model -> n-gram drafter: with the draft model's weights and cache even a "
                     f"{request.min_context}-token context needs {format_size(needs(current, request.min_context))}")
        current = replace(current, drafter="ngram", drafter_shape=None)
    if needs(current, request.min_context) > budget and current.drafter != "none":
        steps.append(f"speculation off: its verify buffers need {format_size(needs(current, request.min_context))} "
                     f"at a {request.min_context}-token context")
        current = replace(current, drafter="none")
    while needs(current, context) > budget and context > request.min_context:
        shorter = max(request.min_context, context // 2)
        steps.append(f"context {context} -> {shorter} tokens: {format_size(needs(current, context))} needed with "
                     f"{context}")
        context = shorter
    draft_context = (min(current.draft_context, context) if current.drafter == "model" and current.draft_context
                     else None)
    narrowed = current.drafter == "model" and current.drafter_weight_dtype == "bfloat16" != request.weight_dtype
    plan = Plan(budget, context, current.drafter, current.draft_length if current.drafter != "none" else 0,
                request.weight_dtype, request.kv_dtype, _footprint(current, context), minimum, lower_bound, steps,
                draft_context, "bfloat16" if narrowed else None,
                current.draft_kv_dtype if current.drafter == "model" else None)
    plan.slots, plan.slot_bytes = _slots(request, context, budget - plan.footprint.total, steps)
    plan.prompt_cache_bytes = _prompt_cache(request, plan.slots, budget - plan.total, steps)
    assert plan.fits, "minimum was checked above"
    return plan


def _slots(request: PlanRequest, context: int, room: int, steps: list[str]) -> tuple[int, int]:
    """How many replies are decoded together, and the bytes their caches and pass buffers take from `room` (what
    the rest of the plan left of the budget): those asked for (None: as many as fit, up to AUTO_SLOTS), fewer when
    fewer fit (a step-down in `steps`); 1, allocating nothing, when fewer than two fit."""
    if request.slots == 1:
        return 1, 0
    cache = request.target.kv_bytes(context, request.kv_dtype)
    buffers = request.target.verify_buffer_bytes(BATCH_ROWS, context)
    fitting = max(0, (room - buffers) // cache)
    slots = min(AUTO_SLOTS if request.slots is None else request.slots, fitting)
    if request.slots is not None and slots < request.slots:
        steps.append(f"slots {request.slots} -> {max(slots, 1)}: {request.slots} replies' KV caches of {context} "
                     f"tokens need {format_size(request.slots * cache + buffers)} beside the rest of the plan")
    return (slots, slots * cache + buffers) if slots > 1 else (1, 0)


def _prompt_cache(request: PlanRequest, slots: int, room: int, steps: list[str]) -> int:
    """The bytes of the slots' prompt cache: those asked for, fewer when fewer are left (a step-down in `steps`);
    none with one slot (the engine's own cache keeps the last conversation)."""
    if slots <= 1 or request.prompt_cache <= 0:
        return 0
    kept = max(0, min(request.prompt_cache, room))
    if kept < request.prompt_cache:
        steps.append(f"prompt cache {format_size(request.prompt_cache)} -> {format_size(kept)}: what is left of the "
                     f"budget beside the model and {slots} slots")
    return kept


def _offload_plan(request: PlanRequest, budget: int, minimum: int) -> Plan:
    """The last step-down (a GPU): keep the drafter if possible, and stream the fewest last layers from host
    memory at the shortest context; the first layers (where early exits draft) stay on the device."""
    layers = request.target.num_layers
    for drafter in dict.fromkeys([request.drafter, "ngram", "none"]):
        candidate = replace(request, drafter=drafter, drafter_shape=request.drafter_shape if drafter == "model"
                            else None)
        for offloaded in range(1, layers + 1):
            footprint = _footprint(candidate, request.min_context, offloaded)
            if footprint.total <= budget:
                steps = [] if drafter == request.drafter else [f"{request.drafter} drafter -> {drafter}: even with "
                                                               "layers offloaded it does not fit"]
                steps.append(f"offload {offloaded} of {layers} layers to host memory: the model at a "
                             f"{request.min_context}-token context needs {format_size(minimum)} on the device")
                return Plan(budget, request.min_context, drafter, request.draft_length if drafter != "none" else 0,
                            request.weight_dtype, request.kv_dtype, footprint, minimum,
                            _footprint(request, request.min_context).total, steps,
                            offloaded_layers=list(range(layers - offloaded, layers)))
    least = _footprint(replace(request, drafter="none"), request.min_context, layers).total
    raise BudgetError(f"the memory budget {format_size(budget)} cannot hold the model even with every layer "
                      f"offloaded: it needs at least {format_size(least)} on the device; raise the budget")
