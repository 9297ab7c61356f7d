"""POST /v1/chat/completions: a chat through the model's template, with `response_format` (a JSON object, or JSON
under a schema, by grammar) and `tools` with `tool_choice`.

A reply's tool calls come back as OpenAI's `message.tool_calls` (finish_reason "tool_calls"); in a stream as one
`delta.tool_calls` chunk once the call is complete, text that may open a call held back until it is known not to be
one (edge/decoding/tools.py).
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from edge.decoding.constrained import response_format_grammar
from edge.decoding.tools import ToolPlan, plan_tool_use
from edge.engine import Engine, GenerationOptions
from edge.engine.prepared import chat_prompt
from edge.errors import EdgeError
from edge.serve.errors import ApiError
from edge.serve.relay import respond
from edge.serve.request_body import engine_options, parsed, parsed_body, prompt_limits, utf8
from edge.serve.responses import Reply
from edge.serve.schemas import ChatCompletionRequest
from edge.serve.state import ServerState, State, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, state: State) -> Response:
    body, messages, plan = await parsed_body(request, state, partial(checked_chat, state))
    options = engine_options(body, state.config)
    tools, tool_choice = body.tool_list(), body.tool_choice_value()

    def generation(engine: Engine, should_stop) -> Any:
        return engine.chat(messages, dataclasses.replace(options, should_stop=should_stop), tools=tools,
                           tool_choice=tool_choice, special_tokens_in_messages=body.special_tokens_in_messages)

    def batch_prompt(engine: Engine, should_stop) -> tuple[list[int], GenerationOptions] | None:
        opts = GenerationOptions.merged(dataclasses.replace(options, should_stop=should_stop), {})
        ids, grammar = chat_prompt(engine.tokenizer, messages, opts, [], tools=tools, tool_choice=tool_choice,
                                   special_tokens_in_messages=body.special_tokens_in_messages)
        return (ids, opts) if grammar is None else None

    reply = Reply(chat=True, model=state.config.model_id, tools=tuple(tools) if plan.parse else None)
    return await respond(request, state, reply, generation, body, "messages", batch_prompt, options.max_new_tokens)


def checked_chat(state: ServerState, raw: bytes) -> tuple[ChatCompletionRequest, list[dict], ToolPlan]:
    """In a worker thread: the body parsed, its response_format and tools usable by this model, the rendered chat
    within the prompt limits."""
    body = parsed(ChatCompletionRequest, raw)
    engine = state.loaded_engine()
    if engine.tokenizer.chat_template is None:
        raise ApiError(400, "this model has no chat template: send a plain prompt to /v1/completions, or start "
                       "edge-serve with a chat template (--chat-template FILE)", param="messages",
                       code="no_chat_template")
    messages, tokenizer = body.template_messages(), engine.tokenizer
    try:
        response_format_grammar(body.response_format)  # a schema llguidance cannot compile is refused here
    except EdgeError as error:
        raise ApiError(400, str(error), param="response_format", code="invalid_response_format") from None
    try:
        plan = plan_tool_use(tokenizer, messages, body.tool_list(), body.tool_choice_value())
    except EdgeError as error:
        raise ApiError(400, str(error), param="tools") from None
    def prompt_tokens() -> int:
        chat = tokenizer.render_chat(plan.messages, add_generation_prompt=True,
                                     special_tokens_in_messages=body.special_tokens_in_messages, **plan.template_kwargs)
        utf8(chat.text, "the chat", "messages")
        return len(tokenizer.encode_rendered(chat))

    prompt_limits(state.config, engine, "messages", chat_chars(messages, body.tool_list()), prompt_tokens)
    return body, messages, plan


def chat_chars(messages: list[dict], tools: list[dict] | None) -> int:
    """The characters of a chat's messages, their tool calls and the tools offered: what the character limit counts."""
    return sum(len(message["content"] or "") + (len(json.dumps(message["tool_calls"]))
                                                if message.get("tool_calls") else 0)
               for message in messages) + (len(json.dumps(tools)) if tools else 0)
