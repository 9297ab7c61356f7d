"""Tokenizer and StreamDecoder against transformers, on tokenizers built here (no model hub).

Two tokenizer families are trained on a small multilingual corpus:
  * byte-level BPE (GPT-2 / Llama 3 style: ByteLevel pre-tokenizer and decoder, bos added by the post-processor);
  * SentencePiece-style BPE (Llama 2 / TinyLlama style: Metaspace pre-tokenizer, byte_fallback `<0xE2>` tokens,
    Replace/ByteFallback/Fuse/Strip decoder, `<s>` added by a TemplateProcessing post-processor).
Each is saved with transformers' `save_pretrained` and reloaded by both `AutoTokenizer` and `edge.text.tokenizer`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as RawTokenizer

from edge.errors import PromptError, TokenizerError
from edge.text.tokenizer import StreamDecoder, Tokenizer, clean_up_tokenization

transformers = pytest.importorskip("transformers")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a sunny day, isn't it?",
    "We're testing tokenizers: numbers 12345, 3.14159 and symbols #@%&*()[]{}.",
    "Café naïve façade — “quoted” text, déjà vu, crème brûlée, Straße, Ærøskøbing.",
    "日本語のテキストです。東京は大きな都市です。今日は良い天気ですね。",
    "中文测试，你好世界！我们正在测试分词器。今天天气很好。",
    "Emoji time 😀🎉👍🏽 and family 👨‍👩‍👧 plus hearts ❤️💙 and flags 🇫🇷.",
    "Привет, мир! Как дела? Всё хорошо.",
    "مرحبا بالعالم، كيف حالك؟",
    "def main():\n    print('hello world')\n    return 0\n",
    "Tabs\tand\nnewlines\n\nare whitespace too.",
] * 3

TEXTS = [
    "Hello world",
    " leading space",
    "double  space and trailing space ",
    "new\nlines\n\nand\ttabs",
    "Café naïve façade — “quotes”",
    "日本語のテキストです。",
    "中文测试，你好世界！",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧 and 🦜",
    "mixed: Ünïcödé ±∞ ≠ ≈ ẞ",
    "Привет, мир",
    "مرحبا بالعالم",
    "don't stop , ok ? yes ! they 're here",
    "a",
    "",
    "   ",
]

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there 👋"},
    {"role": "assistant", "content": "Hello! 你好"},
    {"role": "user", "content": "Café?"},
]

LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = '' %}\n"
    "{%- endif %}\n"
    "{%- if system_message %}\n"
    "    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)

ZEPHYR_TEMPLATE = (
    "{% for message in messages %}\n"
    "{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n"
    "{{ '<|assistant|>' }}\n"
    "{% endif %}\n"
    "{% endfor %}"
)

BYTE_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


# ---------------------------------------------------------------------------------------------------------------
# Building the tokenizers
# ---------------------------------------------------------------------------------------------------------------


def build_byte_level() -> RawTokenizer:
    """A Llama-3-style byte-level BPE with header/eot special tokens and two non-special added tokens."""
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=BYTE_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    return tok


def build_sentencepiece_style() -> RawTokenizer:
    """A Llama-2/TinyLlama-style BPE: Metaspace, byte_fallback with <0xNN> tokens, <s> added in front."""
    trainee = RawTokenizer(models.BPE(unk_token="<unk>"))
    trainee.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=450, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=90,
                                  show_progress=False)
    trainee.train_from_iterator(CORPUS, trainer)
    learned = json.loads(trainee.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{byte:02X}>": 3 + byte for byte in range(256)})
    for token, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in learned["merges"]]
    tok = RawTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def save(raw: RawTokenizer, directory: Path, **kwargs) -> Path:
    """Save through transformers' PreTrainedTokenizerFast.save_pretrained, as a checkpoint would be."""
    kwargs.setdefault("clean_up_tokenization_spaces", False)
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, **kwargs).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def raw_tokenizers() -> dict[str, RawTokenizer]:
    return {"byte": build_byte_level(), "sp": build_sentencepiece_style()}


@pytest.fixture(scope="session")
def dirs(raw_tokenizers, tmp_path_factory) -> dict[str, Path]:
    byte_dir = save(raw_tokenizers["byte"], tmp_path_factory.mktemp("byte"), bos_token="<|begin_of_text|>",
                    eos_token="<|end_of_text|>", chat_template=LLAMA3_TEMPLATE)
    (byte_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 4]}))
    (byte_dir / "config.json").write_text(json.dumps({"eos_token_id": 1, "bos_token_id": 0}))
    sp_dir = save(raw_tokenizers["sp"], tmp_path_factory.mktemp("sp"), bos_token="<s>", eos_token="</s>",
                  unk_token="<unk>", chat_template=ZEPHYR_TEMPLATE)
    return {"byte": byte_dir, "sp": sp_dir}


@pytest.fixture(scope="session")
def hf(dirs):
    return {kind: transformers.AutoTokenizer.from_pretrained(path) for kind, path in dirs.items()}


@pytest.fixture(scope="session")
def edge_tok(dirs) -> dict[str, Tokenizer]:
    return {kind: Tokenizer.from_dir(path) for kind, path in dirs.items()}


KINDS = ["byte", "sp"]


# ---------------------------------------------------------------------------------------------------------------
# encode / decode / vocabulary
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(kind, add_special_tokens, hf, edge_tok):
    for text in TEXTS + ["<|eot_id|> and <s> in text", "<think>plan</think>answer"]:
        expected = hf[kind](text, add_special_tokens=add_special_tokens)["input_ids"]
        assert edge_tok[kind].encode(text, add_special_tokens=add_special_tokens) == expected, text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_transformers(kind, skip, hf, edge_tok):
    for text in TEXTS:
        ids = hf[kind](text)["input_ids"] + [hf[kind].eos_token_id]
        assert edge_tok[kind].decode(ids, skip_special_tokens=skip) == hf[kind].decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("kind", KINDS)
def test_vocab_and_special_tokens(kind, hf, edge_tok):
    tok, ref = edge_tok[kind], hf[kind]
    assert tok.vocab_size == len(ref)
    assert (tok.bos_token, tok.eos_token) == (ref.bos_token, ref.eos_token)
    assert tok.bos_token_id == ref.bos_token_id
    assert set(ref.all_special_ids) <= tok.special_token_ids
    assert tok.special_token_ids == {i for i, t in ref.added_tokens_decoder.items() if t.special}


def test_eos_token_ids_union_of_configs(edge_tok, hf):
    # generation_config [1, 4], config.json 1, tokenizer eos <|end_of_text|>
    assert edge_tok["byte"].eos_token_ids == sorted({1, 4, hf["byte"].eos_token_id})
    assert edge_tok["sp"].eos_token_ids == [2]


def test_cleanup_rule_matches_transformers():
    text = "Hello , world . Isn 't it ? they 're ' quoted ' ! I 've , you 'm he 's"
    assert clean_up_tokenization(text) == transformers.PreTrainedTokenizerBase.clean_up_tokenization(text)


def test_decode_with_cleanup_enabled(raw_tokenizers, tmp_path):
    path = save(raw_tokenizers["byte"], tmp_path, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                clean_up_tokenization_spaces=True)
    ref, tok = transformers.AutoTokenizer.from_pretrained(path), Tokenizer.from_dir(path)
    for text in TEXTS:
        ids = ref(text)["input_ids"]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
            assert_stream_invariant(tok, ids, chunk=1, skip=skip)


def test_llama_class_rebuilds_post_processor(raw_tokenizers, tmp_path):
    """A LlamaTokenizerFast checkpoint with add_eos_token=True appends </s>, whatever tokenizer.json says."""
    ref = transformers.LlamaTokenizerFast(tokenizer_object=raw_tokenizers["sp"], bos_token="<s>", eos_token="</s>",
                                          unk_token="<unk>", add_eos_token=True, legacy=True)
    ref.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "LlamaTokenizerFast"
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok = Tokenizer.from_dir(tmp_path)
    for text in TEXTS:
        assert tok.encode(text) == ref(text)["input_ids"]
    assert tok.encode("hi")[-1] == tok.token_to_id("</s>")


def test_add_prefix_space_follows_config(raw_tokenizers, tmp_path):
    """transformers forces the pre-tokenizer's add_prefix_space to the config's value (default False)."""
    raw = RawTokenizer.from_str(raw_tokenizers["byte"].to_str())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    raw.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
              "eos_token": "<|end_of_text|>", "clean_up_tokenization_spaces": False}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ref, tok = transformers.AutoTokenizer.from_pretrained(tmp_path), Tokenizer.from_dir(tmp_path)
    for text in ["hello world", "Café"]:
        assert tok.encode(text) == ref(text)["input_ids"]


def test_special_tokens_map_is_a_fallback(raw_tokenizers, tmp_path):
    raw_tokenizers["byte"].save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": {"content": "<|begin_of_text|>", "lstrip": False}, "eos_token": "<|eot_id|>"}))
    tok = Tokenizer.from_dir(tmp_path)
    assert (tok.bos_token, tok.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    assert tok.eos_token_ids == [tok.token_to_id("<|eot_id|>")]
    assert tok.chat_template is None


# ---------------------------------------------------------------------------------------------------------------
# chat templates through the Tokenizer
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_apply_chat_template_matches_transformers(kind, add_generation_prompt, hf, edge_tok):
    for chat in (CHAT, CHAT[1:2], CHAT[1:3]):
        expected = hf[kind].apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert edge_tok[kind].apply_chat_template(chat, add_generation_prompt=add_generation_prompt) == expected
        expected_ids = hf[kind].apply_chat_template(chat, tokenize=True, add_generation_prompt=add_generation_prompt)
        assert edge_tok[kind].encode_chat(chat, add_generation_prompt=add_generation_prompt) == expected_ids


def test_chat_template_jinja_file_wins_over_config(raw_tokenizers, tmp_path, hf):
    save(raw_tokenizers["byte"], tmp_path, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
         chat_template=LLAMA3_TEMPLATE)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "config template {{ messages[0]['content'] }}"
    config_path.write_text(json.dumps(config))
    assert (tmp_path / "chat_template.jinja").is_file()
    ref, tok = transformers.AutoTokenizer.from_pretrained(tmp_path), Tokenizer.from_dir(tmp_path)
    assert tok.chat_template.source == LLAMA3_TEMPLATE
    assert tok.apply_chat_template(CHAT) == ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


def test_chat_template_list_in_config_picks_default_and_tool_use(raw_tokenizers, tmp_path):
    raw_tokenizers["sp"].save(str(tmp_path / "tokenizer.json"))
    templates = [{"name": "default", "template": ZEPHYR_TEMPLATE},
                 {"name": "tool_use", "template": "tools: {{ tools | length }}"}]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "chat_template": templates}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ref, tok = transformers.AutoTokenizer.from_pretrained(tmp_path), Tokenizer.from_dir(tmp_path)
    assert tok.chat_template.source == ZEPHYR_TEMPLATE
    assert tok.chat_template_names == ["default", "tool_use"]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for kwargs in ({}, {"tools": tools}):
        assert tok.apply_chat_template(CHAT, **kwargs) == ref.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=True, **kwargs)


def test_custom_template_argument(edge_tok, hf):
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}"
    assert edge_tok["sp"].apply_chat_template(CHAT, chat_template=template) == hf["sp"].apply_chat_template(
        CHAT, chat_template=template, tokenize=False, add_generation_prompt=True)


# ---------------------------------------------------------------------------------------------------------------
# StreamDecoder
# ---------------------------------------------------------------------------------------------------------------


def stream(tok: Tokenizer, ids: list[int], chunk: int, skip: bool = True) -> tuple[list[str], str]:
    """Push `ids` `chunk` at a time; return the deltas and the flush."""
    decoder = StreamDecoder(tok, skip_special_tokens=skip)
    deltas = [decoder.push(ids[start:start + chunk]) for start in range(0, len(ids), chunk)]
    return deltas, decoder.flush()


def assert_stream_invariant(tok: Tokenizer, ids: list[int], chunk: int, skip: bool = True) -> list[str]:
    deltas, rest = stream(tok, ids, chunk, skip)
    assert "".join(deltas) + rest == tok.decode(ids, skip_special_tokens=skip), (ids, deltas, rest)
    return deltas


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
@pytest.mark.parametrize("skip", [True, False])
def test_stream_matches_full_decode_without_broken_characters(kind, chunk, skip, edge_tok):
    tok = edge_tok[kind]
    for text in TEXTS + CORPUS[:10] + [" ".join(TEXTS)]:
        ids = tok.encode(text) + [tok.token_to_id(tok.eos_token)]
        deltas = assert_stream_invariant(tok, ids, chunk, skip)
        assert not any("\ufffd" in delta for delta in deltas), (text, deltas)


@pytest.mark.parametrize("kind", KINDS)
def test_stream_handles_chat_and_special_tokens(kind, edge_tok):
    tok = edge_tok[kind]
    ids = tok.encode_chat(CHAT) + tok.encode("Sure 😀 — 日本", add_special_tokens=False)
    for skip in (True, False):
        deltas = assert_stream_invariant(tok, ids, 1, skip)
        assert not any("\ufffd" in delta for delta in deltas)


def test_stream_invariant_on_random_byte_level_ids(edge_tok):
    """Even for garbage ids (broken UTF-8 everywhere) no text is lost or duplicated."""
    tok, rng = edge_tok["byte"], random.Random(0)
    for _ in range(100):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 25))]
        assert_stream_invariant(tok, ids, rng.choice([1, 2, 4]), skip=rng.random() < 0.5)


def test_stream_invariant_on_random_sentencepiece_ids(edge_tok):
    """Random non-byte tokens mixed with valid byte-fallback groups (an invalid group would turn already shown
    characters into U+FFFD in a full decode, which a stream cannot take back)."""
    tok, rng = edge_tok["sp"], random.Random(0)
    plain = [i for i in range(tok.vocab_size) if not tok.id_to_token(i).startswith("<0x")]
    groups = [tok.encode(text, add_special_tokens=False) for text in ("🦜", "日本", "👨‍👩‍👧", " ẞ")]
    for _ in range(100):
        ids: list[int] = []
        for _ in range(rng.randrange(1, 20)):
            ids += rng.choice(groups) if rng.random() < 0.25 else [rng.choice(plain)]
        assert_stream_invariant(tok, ids, rng.choice([1, 2, 4]), skip=rng.random() < 0.5)


def test_stream_holds_incomplete_utf8_until_complete(edge_tok):
    tok = edge_tok["sp"]
    ids = tok.encode("🦜", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in ids] == ["▁", "<0xF0>", "<0x9F>", "<0xA6>", "<0x9C>"]
    decoder = StreamDecoder(tok)
    assert [decoder.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.push(ids[-1:]) == "🦜"
    assert decoder.push(ids[:3]) == ""  # "▁" + 2 of 4 bytes: the space is held with the broken character
    assert decoder.flush() == " \ufffd\ufffd"  # ... and not dropped at the end
    assert decoder.flush() == ""


def test_stream_window_stays_short(edge_tok):
    tok = edge_tok["byte"]
    decoder = StreamDecoder(tok)
    for token_id in tok.encode(" ".join(CORPUS)):
        decoder.push([token_id])
        assert len(decoder._window) <= 8


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


def assert_one_line(error: Exception, *words: str) -> None:
    message = str(error.value if hasattr(error, "value") else error)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError) as error:
        Tokenizer.from_dir(tmp_path)
    assert_one_line(error, "tokenizer.json not found", "save_pretrained")


def test_missing_directory(tmp_path):
    with pytest.raises(TokenizerError) as error:
        Tokenizer.from_dir(tmp_path / "nope")
    assert_one_line(error, "not found")


def test_corrupt_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    with pytest.raises(TokenizerError) as error:
        Tokenizer.from_dir(tmp_path)
    assert_one_line(error, "tokenizer.json", "could not be parsed")


def test_corrupt_tokenizer_config(raw_tokenizers, tmp_path):
    raw_tokenizers["byte"].save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError) as error:
        Tokenizer.from_dir(tmp_path)
    assert_one_line(error, "tokenizer_config.json", "not valid JSON")


def test_no_chat_template(raw_tokenizers, tmp_path):
    save(raw_tokenizers["byte"], tmp_path, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.chat_template is None
    with pytest.raises(TokenizerError) as error:
        tok.apply_chat_template(CHAT)
    assert_one_line(error, "no chat template", "generate()")


def test_empty_messages(edge_tok):
    with pytest.raises(PromptError) as error:
        edge_tok["byte"].apply_chat_template([])
    assert_one_line(error, "empty")


def test_bad_ids_to_decode(edge_tok):
    with pytest.raises(TokenizerError):
        edge_tok["byte"].decode(["a"])
