"""Train the byte-level BPE tokenizer of edge's built-in model on the corpus from `train.corpus`.

    python -m train.tokenizer --corpus data/corpus --out data/tokenizer [--vocab-size 4096]

The tokenizer is trained on the train split only (chats rendered with the chat template, code as is) and saved as a
Hugging Face fast tokenizer (tokenizer.json, tokenizer_config.json with the ChatML `chat_template`,
special_tokens_map.json). Special tokens: `<|endoftext|>` (0, padding and end of a code text), `<|im_start|>` (1)
and `<|im_end|>` (2, end of a turn and the eos token).

For the model trainer: `load_tokenizer(dir)` gives the `tokenizers.Tokenizer` and `encode_example(example, tok)`
the ids of one corpus example.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from train.corpus import iter_texts, load_split

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
DEFAULT_SYSTEM = "You are edge, a small assistant that helps with Python."
MODEL_MAX_LENGTH = 2048
MIN_FREQUENCY = 2

# ChatML. Without a leading system message the default one is added. Whitespace control (`-`) everywhere, so the
# text does not depend on trim_blocks/lstrip_blocks.
CHAT_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

_SPECIAL_RE = re.compile("|".join(re.escape(token) for token in SPECIAL_TOKENS))


# ---------------------------------------------------------------------------------------------------------------
# Chat rendering and encoding
# ---------------------------------------------------------------------------------------------------------------


def render_chat(messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    """The text CHAT_TEMPLATE renders for the messages (what `apply_chat_template(tokenize=False)` returns)."""
    parts = []
    if not messages or messages[0]["role"] != "system":
        parts.append(f"{IM_START}system\n{DEFAULT_SYSTEM}{IM_END}\n")
    parts += [f"{IM_START}{message['role']}\n{message['content']}{IM_END}\n" for message in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def example_text(example: dict) -> str:
    """The text of a corpus example as the model sees it: a rendered chat, or code followed by `<|endoftext|>`."""
    if "messages" in example:
        return render_chat(example["messages"])
    return example["text"] + ENDOFTEXT


def encode_example(example: dict, tokenizer: "Tokenizer | TargetTokenizer") -> list[int]:
    """Token ids of a corpus example: the rendered chat (it ends with `<|im_end|>\\n`; a TargetTokenizer renders
    with its model's own template), or the code text followed by the `<|endoftext|>` id."""
    if "messages" in example:
        render = getattr(tokenizer, "render_chat", render_chat)
        return tokenizer.encode(render(example["messages"]), add_special_tokens=False).ids
    return tokenizer.encode(example["text"], add_special_tokens=False).ids + [tokenizer.token_to_id(ENDOFTEXT)]


class TargetTokenizer:
    """A real model's tokenizer and chat template, in the shape encode_example reads: training data for a drafter of
    that model (train.feature_drafter --target-tokenizer) is encoded as the model sees it at run time."""

    def __init__(self, folder: str | os.PathLike) -> None:
        from edge.text.tokenizer import Tokenizer as ModelTokenizer

        self.model_tokenizer = ModelTokenizer.from_dir(folder)
        self.backend = self.model_tokenizer.backend

    def render_chat(self, messages: Sequence[dict]) -> str:
        return self.model_tokenizer.apply_chat_template(list(messages), add_generation_prompt=False)

    def encode(self, text: str, add_special_tokens: bool = False):
        return self.backend.encode(text, add_special_tokens=add_special_tokens)

    def token_to_id(self, token: str) -> int:
        """The token's id; a vocabulary without `<|endoftext|>` ends code texts with its end-of-sequence token."""
        found = self.backend.token_to_id(token)
        if found is None and token == ENDOFTEXT:
            found = self.model_tokenizer.eos_token_ids[0]
        return found


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """The `tokenizers.Tokenizer` saved in a directory (its tokenizer.json)."""
    return Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))


# ---------------------------------------------------------------------------------------------------------------
# Training and saving
# ---------------------------------------------------------------------------------------------------------------


def training_texts(examples: Iterable[dict]) -> Iterator[str]:
    """The texts BPE learns from: each example's text cut at the special tokens, which are never merged into words."""
    for text in iter_texts(examples, render=render_chat):
        for piece in _SPECIAL_RE.split(text):
            if piece:
                yield piece


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE: ByteLevel pre-tokenizer (no prefix space), decoder and post-processor."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def train_tokenizer(examples: Sequence[dict], vocab_size: int = 4096) -> Tokenizer:
    """Train the BPE on the examples (pass the train split); the special tokens get ids 0, 1, 2."""
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_texts(examples), trainer=trainer, length=len(examples))
    for index, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == index, f"{token} should have id {index}"
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | os.PathLike) -> Path:
    """Save as a Hugging Face fast tokenizer whose tokenizer_config.json holds the chat template; the directory."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=MODEL_MAX_LENGTH,
        chat_template=CHAT_TEMPLATE,
    )
    # transformers 4.57 writes the template to chat_template.jinja unless told not to; edge and older readers
    # look for it in tokenizer_config.json.
    hf_tokenizer.save_pretrained(str(out), save_jinja_files=False)
    _ensure_template_in_config(out)
    return out


def _ensure_template_in_config(out: Path) -> None:
    """Make tokenizer_config.json hold CHAT_TEMPLATE and drop a chat_template.jinja that would take precedence."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("chat_template") != CHAT_TEMPLATE:
        config["chat_template"] = CHAT_TEMPLATE
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def compression(examples: Sequence[dict], tokenizer: Tokenizer) -> tuple[int, int]:
    """(characters, tokens) of the examples as the model sees them (example_text vs encode_example)."""
    chars = sum(len(example_text(example)) for example in examples)
    tokens = sum(len(encode_example(example, tokenizer)) for example in examples)
    return chars, tokens


def build_tokenizer(corpus_dir: str | os.PathLike, out_dir: str | os.PathLike,
                    vocab_size: int = 4096) -> tuple[Tokenizer, dict]:
    """Train on the corpus's train split, save to out_dir, and measure the heldout split: (tokenizer, report)."""
    train = load_split(corpus_dir, "train")
    tokenizer = train_tokenizer(train, vocab_size)
    save_tokenizer(tokenizer, out_dir)
    chars, tokens = compression(load_split(corpus_dir, "heldout"), tokenizer)
    report = {
        "vocab_size": tokenizer.get_vocab_size(),
        "heldout_chars": chars,
        "heldout_tokens": tokens,
        "heldout_chars_per_token": chars / tokens if tokens else 0.0,
    }
    return tokenizer, report


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: train, save, and print the vocabulary size and heldout compression."""
    parser = argparse.ArgumentParser(prog="python -m train.tokenizer", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="data/corpus", help="corpus directory (default: data/corpus)")
    parser.add_argument("--out", default="data/tokenizer", help="output directory (default: data/tokenizer)")
    parser.add_argument("--vocab-size", type=int, default=4096, help="vocabulary size (default: 4096)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    _, report = build_tokenizer(args.corpus, args.out, args.vocab_size)
    print(f"tokenizer: vocab {report['vocab_size']}, heldout {report['heldout_chars']:,} chars / "
          f"{report['heldout_tokens']:,} tokens = {report['heldout_chars_per_token']:.2f} chars/token "
          f"-> {args.out} [{time.perf_counter() - started:.1f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
