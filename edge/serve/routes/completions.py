"""POST /v1/completions: a plain prompt (text, or token ids) continued."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from edge.engine import Engine, GenerationOptions
from edge.engine.prepared import text_prompt
from edge.serve.relay import respond
from edge.serve.request_body import engine_options, parsed, parsed_body, prompt_limits, utf8
from edge.serve.responses import Reply
from edge.serve.schemas import CompletionRequest
from edge.serve.state import ServerState, State, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def completions(request: Request, state: State) -> Response:
    body = await parsed_body(request, state, partial(checked_completion, state))
    prompt, options = body.prompt, engine_options(body, state.config)

    def generation(engine: Engine, should_stop) -> Any:
        return engine.generate(prompt, dataclasses.replace(options, should_stop=should_stop))

    def batch_prompt(engine: Engine, should_stop) -> tuple[list[int], GenerationOptions] | None:
        opts = GenerationOptions.merged(dataclasses.replace(options, should_stop=should_stop), {})
        ids, grammar = text_prompt(engine.tokenizer, prompt, opts)
        return (ids, opts) if grammar is None else None

    return await respond(request, state, Reply(chat=False, model=state.config.model_id), generation, body, "prompt",
                         batch_prompt, options.max_new_tokens)


def checked_completion(state: ServerState, raw: bytes) -> CompletionRequest:
    """In a worker thread: the body parsed, its prompt within the prompt limits."""
    body = parsed(CompletionRequest, raw)
    engine, prompt = state.loaded_engine(), body.prompt
    if isinstance(prompt, str):
        prompt_limits(state.config, engine, "prompt", len(prompt),
                      lambda: len(engine.tokenizer.encode(utf8(prompt, "the prompt", "prompt"))))
    else:  # token ids
        prompt_limits(state.config, engine, "prompt", 0, lambda: len(prompt))
    return body
