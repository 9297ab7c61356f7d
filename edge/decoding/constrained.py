"""Output that follows a grammar by construction: JSON, a JSON schema, or a tool call, with or without speculation.

    grammar = response_format_grammar({"type": "json_schema", "json_schema": {"schema": ...}})  # llguidance's
    constraint = engine.constraint(grammar)      # the grammar's state for one reply, over this model's vocabulary
    constraint.mask(logits)                      # tokens the grammar forbids next: -inf
    constraint.consume(tokens)                   # advance the state by the tokens emitted

Schemas compile to a grammar, and the grammar to a token mask at each position, with llguidance (a Rust library:
one small wheel, no dependencies, masks in tens of microseconds). It is an optional extra: `pip install
'edge[structured]'`.

With speculation the verify pass masks the target's logits at each position with the state advanced along the
drafted tokens before it (`check_draft`): a drafted token the grammar forbids is rejected where it stands, since
the target's masked choice can never be it, so the draft is cut there. Greedy output is then exactly plain
constrained greedy output, for any drafter. Sampling keeps the forbidden token as a certain rejection (its target
probability is 0), so the residual is sampled where plain rejection sampling samples it and the output is
distributed as constrained sampling from the target.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch

from edge.decoding.drafters.base import Draft
from edge.decoding.schema_cycles import endless_cycle
from edge.errors import SamplingError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # json.dumps' layout
INSTALL_HINT = "structured output needs llguidance: pip install 'edge[structured]'"


class GrammarError(SamplingError):
    """A response format, schema or tool list edge cannot turn into a grammar (one line naming the feature)."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise GrammarError(INSTALL_HINT) from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A compiled-to-text grammar (llguidance's JSON form) and what it was made from, for error messages."""

    text: str
    what: str  # "response_format", "tools", ...


def json_schema_grammar(schema: Any, what: str = "response_format.json_schema.schema") -> Grammar:
    """The grammar of JSON documents valid under `schema` (compact layout: json.dumps' separators, no other
    whitespace). A keyword llguidance does not implement is a GrammarError naming it, and so is a cycle of $refs
    that no finite document gets out of (edge/decoding/schema_cycles.py)."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"{what} must be a JSON schema (an object), got {type(schema).__name__}")
    cycle = endless_cycle(schema)
    if cycle is not None:
        raise GrammarError(f"{what} has no finite instance: its $refs form a cycle every instance must follow "
                           f"({' → '.join(cycle)}); make one step of it optional (leave the property out of "
                           "required, let the array be empty, or add an anyOf branch without the $ref)")
    llg = _llguidance()
    try:
        text = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as error:
        raise GrammarError(f"{what} is not a usable JSON schema ({_first_line(error)}); send a JSON schema "
                           "object") from None
    problem = llg.LLMatcher.validate_grammar(text)
    if problem and not problem.startswith("WARNING"):
        raise GrammarError(f"{what}: {_feature(problem)}")
    return Grammar(text, what)


def response_format_grammar(response_format: Any) -> Grammar | None:
    """The grammar an OpenAI `response_format` asks for: {"type": "text"} (None: free text), {"type":
    "json_object"} (any JSON object) or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar({"type": "object"}, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise GrammarError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}; '
                               "add the schema")
        return json_schema_grammar(spec["schema"])
    raise GrammarError(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _feature(problem: str) -> str:
    """llguidance's complaint as one line that names the feature and the fix."""
    line = _first_line(problem)
    if line.startswith("Unimplemented keys"):
        return (f"the schema uses {line.partition(': ')[2]}, which edge's grammar (llguidance) does not support; "
                "remove it from the schema")
    if line.startswith("Unknown format"):
        return f"the schema's {line.lower()}, which edge's grammar (llguidance) does not support; remove it"
    return f"the schema cannot be compiled to a grammar ({line}); simplify or fix it"


def _first_line(error: object) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


class GrammarVocabulary:
    """A tokenizer's vocabulary as llguidance reads it, built once per engine (about a second on a large one)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        llg = _llguidance()
        self.vocab_size = vocab_size  # the model's rows: may be more (padding) or fewer than the tokenizer's ids
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokenizer = llg.LLTokenizer(tokenizer.backend.to_str(), eos_token=sorted(eos_token_ids))

    def constraint(self, grammar: Grammar) -> "Constraint":
        matcher = _llguidance().LLMatcher(self.tokenizer, grammar.text, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{grammar.what}: {_feature(matcher.get_error())}")
        matcher.compute_bitmask()  # a grammar no token can start (llguidance then reports an error)
        if matcher.is_error():
            raise GrammarError(f"{grammar.what} admits no JSON value: nothing can be written that it accepts (a "
                               "$ref that only leads back to itself has no finite instance); fix the schema")
        return Constraint(matcher, self.vocab_size, self.eos_token_ids, grammar.what)


class Constraint:
    """The grammar's state for one reply: which tokens may come next, advanced by each emitted token."""

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: frozenset[int] = frozenset(),
                 what: str = "the grammar") -> None:
        self.matcher, self.vocab_size, self.eos_token_ids, self.what = matcher, vocab_size, eos_token_ids, what

    def allowed(self) -> torch.Tensor:
        """(V,) bool: the tokens the grammar allows next (end-of-sequence once it is complete)."""
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        size = min(self.vocab_size, bits.size)
        allowed[:size] = torch.from_numpy(bits[:size].astype(bool))
        # every id that ends a reply here only where the grammar may end (a tokenizer whose second end-of-sequence
        # id is also an ordinary piece of text would otherwise end a reply mid-string)
        accepting = self.matcher.is_accepting()
        for token in self.eos_token_ids:
            if token < self.vocab_size:
                allowed[token] = accepting
        return allowed

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (V,) with the forbidden tokens at -inf."""
        return logits.masked_fill(~self.allowed().to(logits.device), float("-inf"))

    def consume(self, tokens: Sequence[int]) -> None:
        """Advance by emitted tokens, up to an end-of-sequence token (the reply ends there; a step may emit more)."""
        for token in tokens:
            if not self.matcher.consume_token(token):
                raise self._broken(token)
            if token in self.eos_token_ids:
                return

    def _broken(self, token: int) -> GrammarError:
        """The grammar engine gave up part way (a schema too tangled for it): said in the schema's terms."""
        problem = re.sub(r"\btokens? (id )?\d+", "a token", _first_line(self.matcher.get_error() or "no reason"))
        return GrammarError(f"{self.what}: the grammar engine (llguidance) gave up part way through the reply "
                            f"({problem.removeprefix('parser error: ')}); simplify the schema")

    def check_draft(self, draft: Draft, keep_rejected: bool) -> tuple[Draft, torch.Tensor]:
        """The draft cut at the first token the grammar forbids, and the masks (rows, V) of the verify pass: row i
        allows what the grammar allows after the draft's first i tokens. `keep_rejected` keeps the forbidden token
        as the last one (a sure rejection, for rejection sampling); a drafted end-of-sequence ends the draft. A row
        after either allows everything (it is never read). The state is left where it was."""
        masks, consumed, keep = [], 0, len(draft.tokens)
        for i, token in enumerate(draft.tokens):
            allowed = self.allowed()
            masks.append(allowed)
            if not (token < self.vocab_size and allowed[token]):  # forbidden: the target can never choose it
                keep = i + 1 if keep_rejected else i
                break
            if token in self.eos_token_ids:  # the reply would end here: nothing after it is read
                keep = i + 1
                break
            if not self.matcher.consume_token(token):
                raise self._broken(token)
            consumed += 1
        else:
            masks.append(self.allowed())
        self.matcher.rollback(consumed)  # (llguidance cannot roll an end-of-sequence back: it is never consumed here)
        masks.extend(torch.ones(self.vocab_size, dtype=torch.bool) for _ in range(keep + 1 - len(masks)))
        return _cut(draft, keep), torch.stack(masks)  # (keep + 1, V)


def _cut(draft: Draft, n: int) -> Draft:
    if n == len(draft.tokens):
        return replace(draft, branches=None)
    return Draft(tokens=draft.tokens[:n], probs=None if draft.probs is None else draft.probs[:n],
                 confidences=draft.confidences[:n])
