"""A GGUF file's tokenizer (llama.cpp's `tokenizer.ggml.*` keys) as Hugging Face tokenizer files.

    files = TokenizerFiles.from_metadata(metadata)      # metadata: the file's key -> value mapping
    files.tokenizer_json, files.tokenizer_config         # what edge.text.tokenizer.Tokenizer.from_dir reads

llama.cpp stores a tokenizer as its vocabulary, the token types, and either BPE merges ("gpt2": byte-level BPE, as
Llama 3, Qwen2, SmolLM and Phi-4-mini use) or SentencePiece scores ("llama": Llama 2, TinyLlama, Mistral, Phi-3, and
Gemma 3's 262k vocabulary, which llama.cpp marks add_space_prefix false: no "▁" before the first word, as
transformers' GemmaConverter builds it). Both are rebuilt
here as transformers' own converters build them from the original files, so the ids match the checkpoint the GGUF
was made from:

- gpt2: the vocabulary and merges as they are; the pre-tokenizer (how text is split before the merges) is the one
  `tokenizer.ggml.pre` names, from llama.cpp's table (src/llama-vocab.cpp) written in `tokenizers`' terms.
- llama: merges regenerated from the scores the way transformers' `LlamaConverter` does (every split of a piece
  into two pieces, the higher-scored merged piece first), with byte fallback and the "▁" space marker.

Control tokens become special added tokens, user-defined ones plain added tokens. A GGUF's replies end at its eos
token and at the other end-of-generation tokens llama.cpp recognises by their text (<|im_end|>, <|eot_id|>, ...),
so they are all listed as eos ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from edge.errors import TokenizerError

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's end-of-generation tokens besides eos, recognised by their text (src/llama-vocab.cpp)
END_OF_GENERATION = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                     "<|end_of_text|>", "<EOT>")

_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-4o's o200k split (Phi-4-mini): case-aware words with their contraction as a suffix, as tokenizer.json spells it
_GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
                r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split_then_bytes(regex: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}, _byte_level(False)]}


@dataclass(frozen=True)
class _PreTokenizer:
    """How a byte-level BPE splits text before merging, as the original tokenizer.json spells it."""

    pre_tokenizer: dict
    ignore_merges: bool = False  # a word that is itself in the vocabulary is one token (Llama 3)
    normalizer: dict | None = None


_GPT2 = _PreTokenizer(_byte_level(True))
_DIGITS_THEN_GPT2 = _PreTokenizer({"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, _byte_level(True)]})
_LLAMA3 = _PreTokenizer(_split_then_bytes(_LLAMA3_REGEX), ignore_merges=True)
_QWEN2 = _PreTokenizer(_split_then_bytes(_QWEN2_REGEX), normalizer={"type": "NFC"})
_GPT4O = _PreTokenizer(_split_then_bytes(_GPT4O_REGEX))

# tokenizer.ggml.pre -> its pre-tokenizer (llama.cpp's names; the regexes of src/llama-vocab.cpp)
PRE_TOKENIZERS: dict[str, _PreTokenizer] = {
    "gpt-2": _GPT2, "phi-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2,
    "smollm": _DIGITS_THEN_GPT2, "starcoder": _DIGITS_THEN_GPT2, "refact": _DIGITS_THEN_GPT2,
    "codeshell": _DIGITS_THEN_GPT2,
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3, "dbrx": _LLAMA3, "smaug-bpe": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "gpt-4o": _GPT4O,  # Phi-4-mini
}


@dataclass
class TokenizerFiles:
    tokenizer_json: dict
    tokenizer_config: dict
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)  # eos first, then the other end-of-generation tokens
    ignored: list[str] = field(default_factory=list)  # the bos/eos/eot/eom ids the file names outside its vocabulary

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> "TokenizerFiles":
        kind = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if kind is None or not tokens:
            raise TokenizerError("the GGUF file holds no tokenizer (no tokenizer.ggml.model / tokens); convert it "
                                 "again with llama.cpp's convert_hf_to_gguf.py, or load the original checkpoint "
                                 "folder")
        types = list(metadata.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise TokenizerError(f"the GGUF file lists {len(tokens)} tokens but {len(types)} token types; the file "
                                 "is corrupt, download it again")
        if kind == "gpt2":
            model, parts = _byte_level_bpe(metadata, tokens)
            add_bos_default = False
        elif kind == "llama":
            model, parts = _sentencepiece_bpe(metadata, tokens, types)
            add_bos_default = True
        else:
            raise TokenizerError(f"the GGUF tokenizer kind {kind!r} is not supported (edge reads 'gpt2' byte-level "
                                 "BPE and 'llama' SentencePiece); load the original checkpoint folder instead")
        special = _special_ids(metadata, len(tokens))
        add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos_default))
        add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        for name, wanted in (("bos", add_bos), ("eos", add_eos)):
            if wanted and name not in special:
                raise TokenizerError(f"the GGUF file asks to add a {name} token but names none "
                                     f"(tokenizer.ggml.{name}_token_id); the file is incomplete")
        tokenizer_json = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": _added_tokens(tokens, types),
            **parts,
            "post_processor": _post_processor(tokens, special.get("bos") if add_bos else None,
                                              special.get("eos") if add_eos else None),
            "model": model,
        }
        config: dict[str, Any] = {f"{name}_token": tokens[index] for name, index in special.items()}
        config.update(add_bos_token=add_bos, add_eos_token=add_eos, clean_up_tokenization_spaces=False)
        template = metadata.get("tokenizer.chat_template")
        if isinstance(template, str) and template.strip():
            config["chat_template"] = template
        eos = [special["eos"]] if "eos" in special else []
        eos += [index for index, (token, kind_) in enumerate(zip(tokens, types))
                if kind_ == TOKEN_CONTROL and token in END_OF_GENERATION and index not in eos]
        eos += [special[name] for name in ("eot", "eom") if name in special and special[name] not in eos]
        ignored = [f"{WORDS[name]} id {index}" for name, index in _named_ids(metadata).items()
                   if name in WORDS and not 0 <= index < len(tokens)]
        return cls(tokenizer_json, config, special.get("bos"), eos, ignored)


# the special ids whose loss changes a reply (a pad or unknown id past the vocabulary, as real conversions write, does
# not), as a note names them
WORDS = {"bos": "beginning-of-sequence", "eos": "end-of-sequence", "eot": "end-of-turn", "eom": "end-of-message"}


def _named_ids(metadata: Mapping[str, Any]) -> dict[str, int]:
    """bos, eos, unk, pad, eot, eom -> the id the file names, wherever it lies."""
    named = {}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"), ("eot", "eot"),
                      ("eom", "eom")):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(index, int):
            named[name] = index
    return named


def _special_ids(metadata: Mapping[str, Any], size: int) -> dict[str, int]:
    """bos, eos, unk, pad, eot, eom -> id, for the ids the file names inside its vocabulary."""
    return {name: index for name, index in _named_ids(metadata).items() if 0 <= index < size}


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict]:
    """Control tokens as special added tokens, user-defined ones as plain added tokens (transformers' converters
    do the same)."""
    return [{"id": index, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": kind == TOKEN_CONTROL}
            for index, (token, kind) in enumerate(zip(tokens, types))
            if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]


def _post_processor(tokens: list[str], bos: int | None, eos: int | None) -> dict | None:
    """A template that puts the bos (and eos) token around every encoded text, as add_bos_token asks."""
    if bos is None and eos is None:
        return None

    def special(index: int | None, type_id: int) -> list[dict]:
        return [] if index is None else [{"SpecialToken": {"id": tokens[index], "type_id": type_id}}]

    def template(sequence: str, type_id: int) -> list[dict]:
        return special(bos, type_id) + [{"Sequence": {"id": sequence, "type_id": type_id}}] + special(eos, type_id)

    single, pair = template("A", 0), template("A", 0) + template("B", 1)
    named = {tokens[index]: {"id": tokens[index], "ids": [index], "tokens": [tokens[index]]}
             for index in (bos, eos) if index is not None}
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": named}


def _byte_level_bpe(metadata: Mapping[str, Any], tokens: list[str]) -> tuple[dict, dict]:
    pre = metadata.get("tokenizer.ggml.pre", "default")
    form = PRE_TOKENIZERS.get(pre)
    if form is None:
        raise TokenizerError(f"the GGUF tokenizer's pre-tokenizer {pre!r} is not one edge knows (it knows "
                             f"{', '.join(sorted(PRE_TOKENIZERS))}); load the original checkpoint folder instead")
    merges = [merge.split(" ", 1) for merge in metadata.get("tokenizer.ggml.merges") or []]
    if any(len(merge) != 2 for merge in merges):
        raise TokenizerError("a merge in the GGUF tokenizer is not two tokens separated by a space; the file is "
                             "corrupt, download it again")
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": form.ignore_merges, "vocab": _vocabulary(tokens), "merges": merges}
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return model, {"normalizer": form.normalizer, "pre_tokenizer": form.pre_tokenizer, "decoder": decoder}


def _sentencepiece_bpe(metadata: Mapping[str, Any], tokens: list[str], types: list[int]) -> tuple[dict, dict]:
    """Llama 2's tokenizer as transformers' LlamaConverter writes it (legacy: a "▁" prepended, spaces as "▁")."""
    scores = list(metadata.get("tokenizer.ggml.scores") or [])
    if len(scores) != len(tokens):
        raise TokenizerError("the GGUF SentencePiece tokenizer has no score for every token; the file is corrupt, "
                             "download it again")
    unk = metadata.get("tokenizer.ggml.unknown_token_id", 0)
    prefix_space = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    scored = [(token, 0.0 if index < 3 else float(score))  # LlamaConverter scores the first three 0
              for index, (token, score) in enumerate(zip(tokens, scores))]
    model = {"type": "BPE", "dropout": None,
             "unk_token": tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None,
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
             "ignore_merges": False, "vocab": _vocabulary(tokens), "merges": _merges_from_scores(scored)}
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    normalizer = {"type": "Sequence", "normalizers": ([{"type": "Prepend", "prepend": "\u2581"}] if prefix_space
                                                      else []) + [replace]}
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}] + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix_space else [])}
    return model, {"normalizer": normalizer, "pre_tokenizer": None, "decoder": decoder}


def _vocabulary(tokens: list[str]) -> dict[str, int]:
    vocabulary: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocabulary.setdefault(token, index)
    return vocabulary


def _merges_from_scores(scored: list[tuple[str, float]]) -> list[list[str]]:
    """transformers' generate_merges: each piece that splits into two pieces gives a merge, ranked by the merged
    piece's score (then the lengths of its halves), highest first."""
    index_of = {token: index for index, (token, _) in enumerate(scored)}
    merges = []
    for piece, score in dict(scored).items():
        local = [(piece[:cut], piece[cut:], score) for cut in range(1, len(piece))
                 if piece[:cut] in index_of and piece[cut:] in index_of]
        merges += sorted(local, key=lambda merge: (index_of[merge[0]], index_of[merge[1]]))
    merges.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [[left, right] for left, right, _ in merges]
