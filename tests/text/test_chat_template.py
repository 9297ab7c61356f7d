"""ChatTemplate renders exactly what transformers' apply_chat_template(tokenize=False) renders.

The templates below mimic the real ones of the model families edge targets (Llama 3, Llama 2 / Mistral,
ChatML as in Qwen2.5 and SmolLM, Qwen3, TinyLlama / Zephyr, Gemma 3, Phi-3 and Phi-4-mini); each is rendered by edge
and by transformers for several conversations and settings, and the texts must be equal.
"""

from __future__ import annotations

import datetime
import json

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers

from edge.text.chat_template import ChatTemplate, _compile
from edge.errors import PromptError, TokenizerError
from edge.text.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

LLAMA3 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

CHATML = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions.\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN3 = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == "system" and loop.first %}
        {%- continue %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system") %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

GENERATION_BLOCK = """{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<a>{{ m.content }}</a>
{% endgeneration %}{% else %}<{{ m.role }}>{{ m.content }}
{% endif %}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"""

GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""  # Gemma 3's (raise_exception, bos_token, `is string` / `is iterable` tests, a model role)
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
        "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"
        "{% endif %}")  # Phi-3 / Phi-3.5-mini's
PHI4_MINI = ("{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
             "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
             "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
             "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
             "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")  # Phi-4-mini's

TEMPLATES = {"llama3": LLAMA3, "llama2": LLAMA2, "chatml": CHATML, "qwen3": QWEN3, "zephyr": ZEPHYR,
             "generation": GENERATION_BLOCK, "gemma3": GEMMA3, "phi3": PHI3, "phi4_mini": PHI4_MINI}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello! 👋"}],
    "system_user": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi"}],
    "multi_turn": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Und auf Deutsch? 日本語でも"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": " hi "},
    ],
    "thinking": [
        {"role": "user", "content": "Solve x+1=2"},
        {"role": "assistant", "content": "<think>\nx = 2 - 1\n</think>\n\nx = 1"},
        {"role": "user", "content": "And x+2=2?"},
        {"role": "assistant", "content": "x = 0", "reasoning_content": "subtract 2"},
    ],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}

SPECIALS = ["<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A tiny byte-level tokenizer (no merges) saved with a Qwen3-style template and bos/eos/unk tokens."""
    vocab = {char: index for index, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(SPECIALS)
    path = tmp_path_factory.mktemp("chat")
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<|im_end|>",
        chat_template=QWEN3, clean_up_tokenization_spaces=False,
    ).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hf(checkpoint):
    return transformers.AutoTokenizer.from_pretrained(checkpoint)


def reference(hf, template: str, messages, **kwargs):
    """transformers' rendering, or the exception it raised."""
    try:
        return hf.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)
    except Exception as error:  # noqa: BLE001 - compared with edge's behaviour below
        return error


def assert_same_rendering(hf, template: str, messages, **kwargs):
    expected = reference(hf, template, messages, **kwargs)
    ours = ChatTemplate(template, hf.special_tokens_map)
    if isinstance(expected, Exception):
        with pytest.raises(TokenizerError) as error:
            ours.render(messages, **kwargs)
        assert "\n" not in str(error.value)
        assert str(error.value).startswith("chat template error: ")
    else:
        assert ours.render(messages, **kwargs) == expected


@pytest.mark.parametrize("family", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_transformers(hf, family, conversation, add_generation_prompt):
    assert_same_rendering(hf, TEMPLATES[family], CONVERSATIONS[conversation], date_string="26 Jul 2024",
                          add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("enable_thinking", [True, False])
@pytest.mark.parametrize("conversation", ["user", "thinking"])
def test_qwen3_enable_thinking(hf, enable_thinking, conversation):
    assert_same_rendering(hf, QWEN3, CONVERSATIONS[conversation], add_generation_prompt=True,
                          enable_thinking=enable_thinking)
    rendered = ChatTemplate(QWEN3).render(CONVERSATIONS[conversation], enable_thinking=enable_thinking)
    assert rendered.endswith("<think>\n\n</think>\n\n") != enable_thinking


def test_llama3_date_from_strftime_now(hf):
    messages = CONVERSATIONS["user"]
    rendered = ChatTemplate(LLAMA3, hf.special_tokens_map).render(messages)
    assert rendered.startswith("<s><|start_header_id|>system")
    assert f"Today Date: {datetime.datetime.now():%d %b %Y}" in rendered


def test_tools_and_tool_calls(hf):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "12°C"},
        {"role": "assistant", "content": "It is 12°C."},
    ]
    for kwargs in ({"tools": tools}, {"tools": None}, {}):
        assert_same_rendering(hf, CHATML, messages, add_generation_prompt=False, **kwargs)
    assert "Zürich" in ChatTemplate(CHATML).render(messages, tools=tools)  # tojson keeps non-ASCII


def test_tojson_options_and_special_token_variables(hf):
    template = ("{{ messages | tojson(indent=2, sort_keys=True) }}|{{ messages[0] | tojson(separators=(',', ':')) }}"
                "|{{ bos_token }}{{ eos_token }}{{ unk_token }}{{ pad_token }}|{{ extra }}|{{ tools }}{{ documents }}")
    messages = [{"role": "user", "content": "<b>é & ü</b>", "z": 1}]
    assert_same_rendering(hf, template, messages, extra="x")
    assert_same_rendering(hf, template, messages, bos_token="override")


def test_documents_are_passed(hf):
    template = "{% for d in documents %}[{{ d.title }}]{{ d.text }}{% endfor %}{{ messages[0].content }}"
    documents = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]
    assert_same_rendering(hf, template, CONVERSATIONS["user"], documents=documents)


def test_raise_exception_becomes_one_line_tokenizer_error():
    with pytest.raises(TokenizerError) as error:
        ChatTemplate(LLAMA2, {"bos_token": "<s>", "eos_token": "</s>"}).render(CONVERSATIONS["not_alternating"])
    message = str(error.value)
    assert message.startswith("chat template error: Conversation roles must alternate user/assistant")
    assert "\n" not in message


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{{ m.content }",  # syntax error
    "{{ messages[0].content + 1 }}",  # str + int
    "{{ undefined_variable.attribute }}",  # undefined
    "{% generation %}unclosed",  # generation block never closed
    "{{ raise_exception('bad\\nmulti-line\\nmessage') }}",
])
def test_template_errors_are_one_line(template):
    with pytest.raises(TokenizerError) as error:
        ChatTemplate(template).render(CONVERSATIONS["user"])
    assert str(error.value).startswith("chat template error: ")
    assert "\n" not in str(error.value)


def test_sandbox_blocks_mutation():
    with pytest.raises(TokenizerError):
        ChatTemplate("{{ messages.append(1) }}").render(CONVERSATIONS["user"])


def test_template_compiled_once():
    ChatTemplate(ZEPHYR, {"eos_token": "</s>"}).render(CONVERSATIONS["user"])
    assert _compile(ZEPHYR) is _compile(ZEPHYR)


@pytest.mark.parametrize("messages, words", [
    ([], "empty"),
    ("hello", "list"),
    ([{"content": "no role"}], "role"),
    ([{"role": "user"}], "content"),
    (["just a string"], "dict"),
    ([{"role": "user", "content": 3}], "content"),
])
def test_invalid_messages(messages, words):
    with pytest.raises(PromptError) as error:
        ChatTemplate(ZEPHYR, {"eos_token": "</s>"}).render(messages)
    assert words in str(error.value)
    assert "\n" not in str(error.value)


def test_tools_must_be_dicts():
    with pytest.raises(TokenizerError):
        ChatTemplate(CHATML).render(CONVERSATIONS["user"], tools=[print])


def test_empty_template_refused():
    with pytest.raises(TokenizerError):
        ChatTemplate("  ")


def test_tokenizer_uses_checkpoint_template(checkpoint, hf):
    tok = Tokenizer.from_dir(checkpoint)
    assert tok.chat_template.source == QWEN3
    assert tok.chat_template.special_tokens == hf.special_tokens_map
    for messages in CONVERSATIONS.values():
        for kwargs in ({"add_generation_prompt": True}, {"add_generation_prompt": False},
                       {"add_generation_prompt": True, "enable_thinking": False}):
            assert tok.apply_chat_template(messages, **kwargs) == hf.apply_chat_template(
                messages, tokenize=False, **kwargs)
            assert tok.encode_chat(messages, **kwargs) == hf.apply_chat_template(messages, tokenize=True, **kwargs)


def test_saved_files_are_what_transformers_writes(checkpoint):
    """Guards the fixture: 4.57 writes the template to chat_template.jinja, not tokenizer_config.json."""
    assert (checkpoint / "chat_template.jinja").read_text() == QWEN3
    assert "chat_template" not in json.loads((checkpoint / "tokenizer_config.json").read_text())


@pytest.mark.parametrize("source", ["{% for m in messages %}{% endfor %}{% break %}", "{{ not {[0, 0]: 0} }}"])
def test_a_template_jinja_cannot_compile_past_its_own_checks_is_the_templates_one_line_error(source):
    """{% break %} outside a loop (Python's SyntaxError in Jinja's compiler) and a list as a dict key (TypeError while
    compiling): blamed on the template, in one line, at load and at a render."""
    from edge.errors import EdgeError
    from edge.text.chat_template import ChatTemplate, check_template

    for attempt in (lambda: check_template(source, "--chat-template t.jinja"),
                    lambda: ChatTemplate(source).render([{"role": "user", "content": "hi"}])):
        with pytest.raises(EdgeError, match="fix the template") as error:
            attempt()
        assert "\n" not in str(error.value)
