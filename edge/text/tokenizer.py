"""Tokenizer: text <-> token ids for a checkpoint, matching transformers 4.57.

`Tokenizer.from_dir` reads the Hugging Face fast-tokenizer files of a checkpoint (tokenizer.json plus the optional
tokenizer_config.json, chat_template.jinja, special_tokens_map.json, generation_config.json and config.json) and
applies the same load-time adjustments transformers' `AutoTokenizer` does, so `encode`, `decode` and
`apply_chat_template` give the same ids and text. `encode_chat` (and `render_chat` with `encode_rendered`) encodes
the special-token strings a message's content holds as plain text, unless asked not to (edge/text/message_text.py),
so that a message cannot forge another role's markers. `StreamDecoder` turns generated ids into text deltas that are
safe to print as they arrive.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import tokenizers
from tokenizers import AddedToken, processors

from edge.text.chat_template import ChatTemplate, check_messages
from edge.text.message_text import MaskedMessages, RenderedChat
from edge.errors import TokenizerError

# The special-token names transformers knows, in its order; all but the last hold one token string.
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens",
)

# Tokenizer classes whose transformers implementation rebuilds the post-processor at load time from
# `add_bos_token` / `add_eos_token` (class defaults given here), ignoring the one saved in tokenizer.json.
_BOS_EOS_POST_PROCESSOR_DEFAULTS = {
    "LlamaTokenizer": (True, False),
    "CodeLlamaTokenizer": (True, False),
    "GemmaTokenizer": (True, False),
    "CohereTokenizer": (True, False),
    "GPTNeoXTokenizer": (False, False),
}

_RESAVE_HINT = "re-save the tokenizer with transformers' save_pretrained"


# ---------------------------------------------------------------------------------------------------------------
# Reading the checkpoint files
# ---------------------------------------------------------------------------------------------------------------


def _read_json(path: Path, hint: str = _RESAVE_HINT) -> dict[str, Any] | None:
    """Read an optional JSON object file; None when it does not exist, TokenizerError when it is not valid JSON
    (`hint`: how to get a good copy)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenizerError(
            f"{path} is not valid JSON ({_first_line(error)}): repair the file or {hint}"
        ) from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} does not hold a JSON object: repair the file or {hint}")
    return data


def _first_line(error: BaseException) -> str:
    """The first line of an exception's message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _load_backend(directory: Path) -> tokenizers.Tokenizer:
    """Load tokenizer.json with the `tokenizers` library, raising one-line TokenizerErrors."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(
            f"tokenizer.json not found in {directory}: edge needs a Hugging Face fast tokenizer file; {_RESAVE_HINT}"
        )
    try:
        return tokenizers.Tokenizer.from_str(path.read_text(encoding="utf-8"))
    except Exception as error:  # the Rust parser raises a bare Exception
        raise TokenizerError(
            f"{path} could not be parsed ({_first_line(error)}): the file is corrupt or from a newer tokenizers "
            f"version; download it again or {_RESAVE_HINT}"
        ) from None


def _token_content(value: Any) -> str | None:
    """A special token from a config file: a string, or a serialized AddedToken dict with "content"."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_special_tokens(config: dict[str, Any], special_map: dict[str, Any]) -> dict[str, Any]:
    """The named special tokens: tokenizer_config.json first, special_tokens_map.json where the config has none."""
    tokens: dict[str, Any] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name) or special_map.get(name)
        if name == "additional_special_tokens":
            extra = [_token_content(item) for item in value or []]
            if any(extra):
                tokens[name] = [token for token in extra if token]
        elif _token_content(value):
            tokens[name] = _token_content(value)
    return tokens


def _read_chat_templates(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    """Chat templates by name ("default" for the main one).

    As in transformers 4.57, chat_template.jinja and additional_chat_templates/*.jinja take precedence over the
    `chat_template` entry of tokenizer_config.json, which may be a string or a list of {name, template}.
    """
    templates: dict[str, str] = {}
    main_file = directory / "chat_template.jinja"
    if main_file.is_file():
        templates["default"] = main_file.read_text(encoding="utf-8")
    extra_dir = directory / "additional_chat_templates"
    if extra_dir.is_dir():
        for path in sorted(extra_dir.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if templates:
        return templates
    return _templates_from_config(config.get("chat_template"))


def _templates_from_config(value: Any) -> dict[str, str]:
    """Parse tokenizer_config.json's `chat_template` (None, a string, or a list of {name, template})."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(isinstance(item, dict) and "name" in item and "template" in item
                                       for item in value):
        return {item["name"]: item["template"] for item in value}
    raise TokenizerError(
        "tokenizer_config.json has a malformed chat_template: it must be a string or a list of "
        "{'name': ..., 'template': ...}; fix the entry or save the template to chat_template.jinja"
    )


def _ids(value: Any) -> list[int]:
    """A config's token id entry (int, list of ints or None) as a list."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, int) and not isinstance(item, bool)]
    return []


def _model_config_ids(directory: Path, key: str, model_config: dict[str, Any] | None = None) -> list[int]:
    """Token ids stored under `key` in generation_config.json and config.json (also its `text_config`);
    `model_config` is config.json's object, when it has been read already."""
    found: list[int] = []
    for name in ("generation_config.json", "config.json"):  # the model's files, not the tokenizer's
        if name == "config.json" and model_config is not None:
            data = model_config
        else:
            data = _read_json(directory / name, f"download the checkpoint's {name} again") or {}
        found += _ids(data.get(key))
        if isinstance(data.get("text_config"), dict):
            found += _ids(data["text_config"].get(key))
    return found


# ---------------------------------------------------------------------------------------------------------------
# transformers' load-time adjustments of the backend tokenizer
# ---------------------------------------------------------------------------------------------------------------


def _add_missing_tokens(backend: tokenizers.Tokenizer, config: dict[str, Any], special: dict[str, Any]) -> None:
    """Add the tokens transformers adds when loading: `added_tokens_decoder` entries and named special tokens the
    backend does not know as added tokens yet."""
    known = {token.content for token in backend.get_added_tokens_decoder().values()}
    to_add: list[AddedToken] = []
    entries = config.get("added_tokens_decoder") or {}
    for _, entry in sorted(entries.items(), key=lambda item: int(item[0])):
        if isinstance(entry, dict) and entry.get("content") and entry["content"] not in known:
            fields = ("single_word", "lstrip", "rstrip", "normalized", "special")
            to_add.append(AddedToken(entry["content"], **{key: bool(entry[key]) for key in fields if key in entry}))
            known.add(entry["content"])
    for token in _special_token_strings(special):
        if token not in known:
            to_add.append(AddedToken(token, special=True))
            known.add(token)
    if to_add:
        backend.add_tokens(to_add)


def _special_token_strings(special: dict[str, Any]) -> list[str]:
    """Every special-token string of a name -> token(s) mapping."""
    strings: list[str] = []
    for value in special.values():
        strings += value if isinstance(value, list) else [value]
    return strings


def _apply_add_prefix_space(backend: tokenizers.Tokenizer, config: dict[str, Any]) -> None:
    """Override the pre-tokenizer's `add_prefix_space` with the config's (default False), as transformers does."""
    wanted = bool(config.get("add_prefix_space", False))
    try:
        state = json.loads(backend.pre_tokenizer.__getstate__())
    except Exception:  # no pre-tokenizer, or one that cannot be serialized: nothing to adjust
        return
    if state.get("add_prefix_space", wanted) == wanted:
        return
    pre_tokenizer_class = getattr(tokenizers.pre_tokenizers, state.pop("type"))
    state["add_prefix_space"] = wanted
    backend.pre_tokenizer = pre_tokenizer_class(**state)


def _apply_bos_eos_post_processor(backend: tokenizers.Tokenizer, config: dict[str, Any],
                                  special: dict[str, Any]) -> None:
    """For Llama-like tokenizer classes, rebuild the post-processor from add_bos_token / add_eos_token."""
    class_name = str(config.get("tokenizer_class") or "").removesuffix("Fast")
    if class_name not in _BOS_EOS_POST_PROCESSOR_DEFAULTS:
        return
    default_bos, default_eos = _BOS_EOS_POST_PROCESSOR_DEFAULTS[class_name]
    add_bos = bool(config.get("add_bos_token", default_bos))
    add_eos = bool(config.get("add_eos_token", default_eos))
    bos, eos = special.get("bos_token"), special.get("eos_token")
    if (add_bos and bos is None) or (add_eos and eos is None):
        missing = "bos_token" if add_bos and bos is None else "eos_token"
        raise TokenizerError(
            f"tokenizer_config.json asks to add the {missing} but defines none: set {missing} or turn off "
            f"add_{missing} in tokenizer_config.json"
        )
    single, second, tokens = "$A:0", "$B:1", []
    if add_bos:
        single, second = f"{bos}:0 {single}", f"{bos}:1 {second}"
        tokens.append((bos, backend.token_to_id(bos)))
    if add_eos:
        single, second = f"{single} {eos}:0", f"{second} {eos}:1"
        tokens.append((eos, backend.token_to_id(eos)))
    backend.post_processor = processors.TemplateProcessing(single=single, pair=f"{single} {second}",
                                                           special_tokens=tokens)


# ---------------------------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------------------------


def clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization`: drop the space before punctuation and English contractions."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class Tokenizer:
    """A Hugging Face fast tokenizer plus its special tokens, chat templates and end-of-sequence ids.

    Build one with `Tokenizer.from_dir(checkpoint_dir)`; the constructor takes already-parsed parts.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: dict[str, Any] | None = None,
        chat_templates: dict[str, str] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        fallback_bos_token_id: int | None = None,
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        self._backend = backend
        self.special_tokens = dict(special_tokens or {})
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self._template_sources = {name: source for name, source in (chat_templates or {}).items() if source.strip()}
        self._templates = {name: ChatTemplate(source, self.special_tokens)
                           for name, source in self._template_sources.items()}
        self._extra_eos_ids = set(extra_eos_token_ids)
        self._fallback_bos_id = fallback_bos_token_id

    @classmethod
    def from_dir(cls, path: str | Path, model_config: dict[str, Any] | None = None) -> Tokenizer:
        """Load the tokenizer files of a checkpoint folder (see the module docstring for which files); `model_config`
        is the folder's config.json object, when the caller has read it already (it is not read again)."""
        directory = Path(path)
        if not directory.is_dir():
            raise TokenizerError(
                f"tokenizer folder {directory} not found: pass the checkpoint folder that holds tokenizer.json"
            )
        backend = _load_backend(directory)
        config = _read_json(directory / "tokenizer_config.json") or {}
        special = _read_special_tokens(config, _read_json(directory / "special_tokens_map.json") or {})
        cls._prepare_backend(backend, config, special)
        bos_ids = _model_config_ids(directory, "bos_token_id", model_config)
        return cls(
            backend,
            special_tokens=special,
            chat_templates=_read_chat_templates(directory, config),
            extra_eos_token_ids=_model_config_ids(directory, "eos_token_id", model_config),
            fallback_bos_token_id=bos_ids[0] if bos_ids else None,
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        )

    @staticmethod
    def _prepare_backend(backend: tokenizers.Tokenizer, config: dict[str, Any], special: dict[str, Any]) -> None:
        """Apply the adjustments transformers makes when it loads the same files."""
        backend.no_truncation()
        backend.no_padding()
        _add_missing_tokens(backend, config, special)
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        _apply_add_prefix_space(backend, config)
        _apply_bos_eos_post_processor(backend, config, special)

    # -- vocabulary and special tokens ------------------------------------------------------------------------

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (transformers' `len(tokenizer)`)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        """Id of the bos token; the model config's bos_token_id when the tokenizer names none."""
        if self.bos_token is not None and self._backend.token_to_id(self.bos_token) is not None:
            return self._backend.token_to_id(self.bos_token)
        return self._fallback_bos_id

    @property
    def eos_token_ids(self) -> list[int]:
        """Sorted ids that end generation: generation_config's and config's eos ids plus the eos token's id."""
        ids = set(self._extra_eos_ids)
        if self.eos_token is not None and self._backend.token_to_id(self.eos_token) is not None:
            ids.add(self._backend.token_to_id(self.eos_token))
        return sorted(ids)

    @property
    def special_token_ids(self) -> set[int]:
        """Ids of added tokens marked special (skipped by decode) and of the named special tokens."""
        ids = {index for index, token in self._backend.get_added_tokens_decoder().items() if token.special}
        for token in _special_token_strings(self.special_tokens):
            if self._backend.token_to_id(token) is not None:
                ids.add(self._backend.token_to_id(token))
        return ids

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string, or None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of an id, or None when the id is out of range."""
        return self._backend.id_to_token(token_id)

    # -- encode / decode ----------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with `add_special_tokens` the post-processor adds e.g. the bos token."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() needs a str, got {type(text).__name__}: pass the prompt text")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """Text of `ids`, like transformers' decode; cleanup defaults to the tokenizer config's setting."""
        text = self._backend.decode(_as_id_list(ids), skip_special_tokens=skip_special_tokens)
        cleanup = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None \
            else clean_up_tokenization_spaces
        return clean_up_tokenization(text) if cleanup else text

    def fingerprint(self) -> dict[str, str]:
        """sha256 of the vocabulary (token -> id, added tokens included) and of the chat templates' sources: two
        tokenizers with the same vocabulary hash produce the same ids, which is what a drafter must share."""
        vocab = json.dumps(self._backend.get_vocab(with_added_tokens=True), sort_keys=True)
        templates = json.dumps(self._template_sources, sort_keys=True)
        return {"vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
                "chat_template_sha256": hashlib.sha256(templates.encode()).hexdigest()}

    # -- chat -------------------------------------------------------------------------------------------------

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The checkpoint's default chat template, or None when it has none."""
        return self._templates.get("default")

    def set_chat_template(self, source: str) -> None:
        """Use `source` (a Jinja chat template) as the default template, e.g. one given with --chat-template."""
        self._template_sources["default"] = source
        self._templates["default"] = ChatTemplate(source, self.special_tokens)

    @property
    def chat_template_names(self) -> list[str]:
        """Names of all chat templates of the checkpoint ("default", "tool_use", ...)."""
        return sorted(self._templates)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        """Render a conversation to prompt text, like transformers' `apply_chat_template(tokenize=False)`.

        `chat_template` may name one of the checkpoint's templates or be a template's source; other keywords
        (`tools`, `documents`, `enable_thinking`, ...) go to the template.
        """
        template = self._pick_template(chat_template, kwargs.get("tools"))
        return template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template: str | None = None, *, special_tokens_in_messages: bool = False,
                    **kwargs: Any) -> RenderedChat:
        """The conversation rendered as `apply_chat_template` renders it, with the places of the special-token
        strings inside the messages' content, which `encode_rendered` encodes as plain text. With
        `special_tokens_in_messages` they are left to become control tokens, as transformers encodes them."""
        template = self._pick_template(chat_template, kwargs.get("tools"))
        if special_tokens_in_messages or self._backend.encode_special_tokens:
            return RenderedChat(template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs))
        check_messages(messages)
        masked = MaskedMessages.of(messages, self._special_spans, json.dumps([messages, kwargs], default=str))
        text = template.render(masked.messages, add_generation_prompt=add_generation_prompt, **kwargs)
        return masked.restore(text)

    def encode_rendered(self, chat: RenderedChat, start: int = 0) -> list[int]:
        """Token ids of `chat.text[start:]`: the template's special tokens as control tokens, the special-token
        strings that came from the messages as plain text. `start` must not fall inside one of those."""
        text = chat.text[start:]
        encoding = self._backend.encode(text, add_special_tokens=False)
        spans = [(begin - start, end - start) for begin, end in chat.literal_spans if end > start]
        if not spans:
            return encoding.ids
        if spans[0][0] < 0:
            raise ValueError(f"start {start} falls inside a special-token string from the messages {spans[0]}")
        special, starts, ids = self._special_ids, [begin for begin, _ in spans], []
        for token, (begin, end) in zip(encoding.ids, encoding.offsets):
            inside = bisect.bisect_left(starts, end) - 1  # the last span starting before the token ends
            if token in special and inside >= 0 and spans[inside][1] > begin:
                ids += self._as_text(text[begin:end])
            else:
                ids.append(token)
        return ids

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template: str | None = None, *, special_tokens_in_messages: bool = False,
                    **kwargs: Any) -> list[int]:
        """Token ids of the rendered conversation (special tokens come from the template, none are added; those
        inside the messages' content are text unless `special_tokens_in_messages`)."""
        return self.encode_rendered(self.render_chat(messages, add_generation_prompt, chat_template,
                                                     special_tokens_in_messages=special_tokens_in_messages, **kwargs))

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special: the control tokens a message may not forge."""
        return frozenset(index for index, token in self._backend.get_added_tokens_decoder().items() if token.special)

    @cached_property
    def _special_spans(self) -> Callable[[str], list[tuple[int, int]]]:
        """A function: the spans of a text that the tokenizer would take for special tokens (found by a tokenizer
        that knows only those, matching them as this one does; remembered for the texts of the last few turns)."""
        tokens = [token for token in self._backend.get_added_tokens_decoder().values() if token.special]
        if not tokens:
            return lambda text: []
        other = "\ufdd0"
        matcher = tokenizers.Tokenizer(tokenizers.models.WordLevel({other: 0}, unk_token=other))
        matcher.add_special_tokens([AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip,
                                               rstrip=token.rstrip, normalized=False, special=True)
                                    for token in tokens])
        normalizer = self._backend.normalizer

        @lru_cache(maxsize=256)
        def spans(text: str) -> list[tuple[int, int]]:
            if not text.isascii() and not _is_unicode(text):
                return []  # a lone surrogate: no tokenizer takes the text, which the caller refuses as it is
            if normalizer is not None and any(token.normalized for token in tokens):
                encoding = self._backend.encode(text, add_special_tokens=False)
                return [offsets for token, offsets in zip(encoding.ids, encoding.offsets)
                        if token in self._special_ids]
            encoding = matcher.encode(text, add_special_tokens=False)
            return [offsets for token, offsets in zip(encoding.ids, encoding.offsets) if token]

        return spans

    @cached_property
    def _as_text(self) -> Callable[[str], list[int]]:
        """A function: the ids of a special-token string encoded as plain text, as it reads after other text (a
        tokenizer that marks the start of a text, SentencePiece's "▁", does not mark it)."""
        textual = tokenizers.Tokenizer.from_str(self._backend.to_str())
        textual.encode_special_tokens = True

        @lru_cache(maxsize=256)
        def as_text(text: str) -> list[int]:
            anchor = textual.encode("\n", add_special_tokens=False).ids
            anchored = textual.encode("\n" + text, add_special_tokens=False).ids
            if anchored[:len(anchor)] == anchor:
                return anchored[len(anchor):]
            return textual.encode(text, add_special_tokens=False).ids

        return as_text

    def _pick_template(self, chat_template: str | None, tools: Any) -> ChatTemplate:
        """Choose the template as transformers does: named or given source, else tool_use (with tools) or default."""
        if chat_template is not None:
            if chat_template in self._templates:
                return self._templates[chat_template]
            return ChatTemplate(chat_template, self.special_tokens)
        if tools is not None and "tool_use" in self._templates:
            return self._templates["tool_use"]
        if "default" in self._templates:
            return self._templates["default"]
        if self._templates:
            raise TokenizerError(
                f"the checkpoint has chat templates {self.chat_template_names} but no default one: pass "
                "chat_template=<one of those names>"
            )
        raise TokenizerError(
            "this model has no chat template (a base model): continue text with generate() (edge-chat runs it as a "
            "completion model), or give it a template file (--chat-template FILE, or Engine.load(..., "
            "chat_template=FILE))"
        )

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r})"


def _is_unicode(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone surrogates), as every tokenizer needs."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _as_id_list(ids: Iterable[int]) -> list[int]:
    """Token ids as a list of Python ints (accepts any iterable, e.g. a tensor's tolist())."""
    if isinstance(ids, int):
        return [ids]
    try:
        return [int(token_id) for token_id in ids]
    except (TypeError, ValueError):
        raise TokenizerError(f"token ids must be integers, got {ids!r:.80}: pass a list of ints") from None


# ---------------------------------------------------------------------------------------------------------------
# Streaming decode
# ---------------------------------------------------------------------------------------------------------------

# Every character that occurs in a `clean_up_tokenization` pattern; a cut right after any other character can never
# split an occurrence, so text before such a cut cleans up the same alone as it does in the whole text.
_CLEANUP_CHARS = frozenset(" .?!,'ntmsvre")


class StreamDecoder:
    """Turn generated token ids into printable text deltas.

    Uses the prefix-offset / read-offset technique: keep a short window of recent tokens, decode the already
    printed part of it (the prefix) and the whole window, and print the difference. Each step costs O(window), and
    decoders that treat the first token specially (SentencePiece's leading-space strip) behave as in a full decode.
    A delta is held back while the decoded tail is U+FFFD (an incomplete UTF-8 sequence split across tokens), and
    `flush()` returns whatever is still held. ``"".join(pushes) + flush() == tokenizer.decode(all_ids)`` for any ids
    whose byte tokens form valid UTF-8. (A byte-fallback decoder turns a whole run of `<0xNN>` tokens into U+FFFD
    once an invalid byte joins it, so with invalid byte runs the stream may show characters a full decode replaces.)
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._window: list[int] = []  # tokens from the prefix offset on
        self._read = 0  # window index where the not-yet-printed tokens start
        self._prefix_text = ""  # decode of window[:read]
        self._unclean = ""  # raw text held back until cleanup can no longer change it

    def push(self, token_ids: Iterable[int]) -> str:
        """Add generated ids; return the new text that is safe to show (possibly "")."""
        ids = _as_id_list(token_ids)
        if not ids:
            return ""  # nothing new: the window decodes as last time, whose delta was already returned or held
        self._window += ids
        text = self._decode(self._window)
        if len(text) <= len(self._prefix_text) or text.endswith("\ufffd"):
            return ""
        delta = text[len(self._prefix_text):]
        self._window = self._window[self._read:]
        self._read = len(self._window)
        self._prefix_text = self._decode(self._window)
        return self._clean(delta, final=False)

    def flush(self) -> str:
        """Return all text still held back (e.g. an incomplete byte sequence at the end) and reset."""
        text = self._decode(self._window)
        delta = text[len(self._prefix_text):]
        self._window, self._read, self._prefix_text = [], 0, ""
        return self._clean(delta, final=True)

    def _decode(self, ids: list[int]) -> str:
        """Raw decode of a window (cleanup is applied to the emitted text separately)."""
        return self._tokenizer.decode(ids, self._skip_special_tokens, clean_up_tokenization_spaces=False)

    def _clean(self, delta: str, final: bool) -> str:
        """Apply the tokenizer's cleanup rule, holding back a tail that later text could still change."""
        if not self._tokenizer.clean_up_tokenization_spaces:
            return delta
        pending = self._unclean + delta
        cut = len(pending) if final else _last_safe_cut(pending)
        self._unclean = pending[cut:]
        return clean_up_tokenization(pending[:cut])


def _last_safe_cut(text: str) -> int:
    """Length of the longest prefix of `text` that ends with a character outside every cleanup pattern."""
    for index in range(len(text) - 1, -1, -1):
        if text[index] not in _CLEANUP_CHARS:
            return index + 1
    return 0
