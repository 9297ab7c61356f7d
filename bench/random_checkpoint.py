"""Build a random-weight checkpoint with the shape of a real model, for speed and memory benchmarks.

    python -m bench.random_checkpoint OUT [--shape smollm-135m] [--seed 0] [--dtype float32|float16|bfloat16]

Nothing can be downloaded here, but decoding speed depends on a model's shape, not on its weights. This writes an
ordinary Hugging Face checkpoint (config.json, model.safetensors) with transformers' own random initialisation,
plus a byte-level BPE tokenizer trained on the Python standard library's source. A Gemma 3 shape's tokenizer is
padded with filler tokens to the whole vocabulary, since llama.cpp's converter cuts Gemma's embedding to the
tokenizer's size (the head is much of what a small Gemma reads per token); a Phi-3 shape's is named a GPT-2
tokenizer, the one kind of BPE tokenizer llama.cpp's converter takes for Phi models. Needs the `test` extra
(transformers).
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from bench.arguments import bench_parser

SHAPES = {
    # SmolLM/SmolLM2-135M: 30 layers, GQA 9:3, tied embeddings
    "smollm-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=10000.0,
                        max_position_embeddings=2048),
    # TinyLlama-1.1B: 22 layers, GQA 32:4
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
                           max_position_embeddings=2048),
    # Gemma 3 270M and 1B: local layers (a window of 512) with a global one every sixth, MQA with 256-wide heads,
    # a 262,144-token tied embedding
    "gemma3-270m": dict(model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                        sliding_window=512, query_pre_attn_scalar=256, max_position_embeddings=32768),
    "gemma3-1b": dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                      sliding_window=512, query_pre_attn_scalar=256, max_position_embeddings=32768),
    # Phi-3-mini (3.8B): 32 layers, 32 heads of 96 without GQA, fused q/k/v and gate/up in its files, untied head
    "phi3-mini": dict(model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, tie_word_embeddings=False,
                      rope_theta=10000.0, max_position_embeddings=4096, rms_norm_eps=1e-5, pad_token_id=0),
}


def stdlib_texts(limit_bytes: int = 8_000_000):
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        total += len(text)
        yield text
        if total > limit_bytes:
            return


def build_tokenizer(out: Path, vocab_size: int, extra_special: tuple[str, ...] = ()) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *extra_special]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(stdlib_texts(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    fast.save_pretrained(out)


def pad_tokenizer(out: Path, vocab_size: int) -> None:
    """Filler tokens in tokenizer.json's vocabulary up to `vocab_size` ids (its special tokens are in it already)."""
    path = out / "tokenizer.json"
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    for filler in range(vocab_size - len(vocab)):
        vocab[f"<filler{filler}>"] = len(vocab)
    path.write_text(json.dumps(tokenizer), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.random_checkpoint", __doc__, seed=0,
        dtype={"choices": ["float32", "float16", "bfloat16"], "default": "float32",
               "help": "the dtype the weights are saved in (default float32; real checkpoints are mostly 16-bit)"})
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm-135m")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(args.seed)
    shape = dict(SHAPES[args.shape])
    config = AutoConfig.for_model(shape.pop("model_type", "llama"), **shape, bos_token_id=0, eos_token_id=2)
    # initialised in the saved dtype: a float32 copy of a 3.8B model would not fit beside it in 24 GiB
    AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype)).save_pretrained(args.out)
    # llama.cpp's loader looks up a Phi-3 vocabulary's SentencePiece-era tokens by name
    build_tokenizer(args.out, vocab_size=min(8192, config.vocab_size),
                    extra_special=("<unk>", "<s>", "</s>") if config.model_type == "phi3" else ())
    if config.model_type == "gemma3_text":
        pad_tokenizer(args.out, config.vocab_size)
    if config.model_type == "phi3":  # llama.cpp's converter takes a Phi model's BPE tokenizer by this class name
        settings = json.loads((args.out / "tokenizer_config.json").read_text())
        (args.out / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": "GPT2Tokenizer"}))
    print(f"wrote a random {args.shape} checkpoint ({args.dtype}) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
