"""Gemma 3 and Phi-3 from GGUF files written as llama.cpp's converter writes them (tests/gguf_files.py): Gemma's norms
stored as 1 + w under its own tensor names, its local layers known from the architecture; Phi-3's fused q/k/v and
gate/up tensors, rotary dims and LongRoPE factors. Each file's logits equal transformers' on the checkpoint it was
written from, and greedy decoding, plain and speculative, equals the checkpoint folder's."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
import transformers

from edge.model.block_weights import BlockLinear
from edge.model.kv_cache import KVCache
from edge.sources import gguf_checkpoint
from edge.sources.gguf_checkpoint import checkpoint_from_gguf
from edge.sources.loading import load_model
from tests.gguf_files import reference_folder, write_gguf
from tests.helpers import greedy

FAMILIES = ["gemma3", "phi3", "phi3_longrope"]
greedy_24 = partial(greedy, prompt="Speculative decoding drafts several tokens", max_new_tokens=24, max_context=128)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")


def transformers_logits(folder, ids: torch.Tensor) -> torch.Tensor:
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return reference(ids).logits  # (1, T, V)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_float_file_computes_the_logits_of_its_checkpoint(checkpoint_factory, tmp_path, family):
    """Prefill, a decode step and a verify pass past the sliding window, from the file as from the folder."""
    folder = checkpoint_factory(family)
    converted = checkpoint_from_gguf(write_gguf(folder, tmp_path / f"{family}.f32.gguf", "f32"))
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(3))  # (1, 40)
    expected = transformers_logits(folder, ids)
    for model in (load_model(converted), load_model(folder)):
        cache = KVCache.for_model(model.config, 64)
        with torch.no_grad():
            for start, end in ((0, 20), (20, 21), (21, 40)):
                logits = model.logits(model(ids[:, start:end], start, cache))
                assert (logits - expected[:, start:end]).abs().max().item() < 1e-4, (start, end)


def test_gemma3s_settings_come_from_the_architecture_where_the_file_is_silent(checkpoint_factory, tmp_path):
    folder = checkpoint_factory("gemma3")
    converted = checkpoint_from_gguf(write_gguf(folder, tmp_path / "gemma3.gguf", "f32"))
    config = json.loads((converted / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (config["sliding_window"], config["rope_local_base_freq"], config["rope_theta"]) == (8, 10000.0, 1e6)
    assert config["query_pre_attn_scalar"] == 16 and config["tie_word_embeddings"]
    model = load_model(converted)  # the file's norms are 1 + w, held as stored
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.testing.assert_close(model.layers[0].post_ffn_norm.weight,
                               1 + hf.model.layers[0].post_feedforward_layernorm.weight, rtol=0, atol=0)


def test_gemma3_27bs_scores_are_scaled_as_llama_cpp_scales_them():
    """llama.cpp scales the 27B model's scores by (hidden / heads) ** -0.5 = 168 ** -0.5, its heads being 128 wide."""
    shape = {"layers": 62, "hidden": 5376, "heads": 32, "head_dim": 128}
    config = gguf_checkpoint._gemma3_config({"gemma3.attention.sliding_window": 1024}, "gemma3", shape, {}, "27b")
    assert config["query_pre_attn_scalar"] == 168 and config["layer_types"][5] == "full_attention"
    assert gguf_checkpoint._gemma3_config({"gemma3.attention.sliding_window": 512}, "gemma3", {**shape, "layers": 26},
                                          {}, "1b")["query_pre_attn_scalar"] == 128


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_of_a_file_equals_its_checkpoint_plain_and_speculative(checkpoint_factory, tmp_path, family):
    folder = checkpoint_factory(family)
    gguf = write_gguf(folder, tmp_path / f"{family}.f32.gguf", "f32")
    plain = greedy_24(folder)
    assert greedy_24(gguf) == plain
    for drafter in ("ngram", "early-exit:1"):
        assert greedy_24(gguf, drafter=drafter) == plain, drafter
        assert greedy_24(folder, drafter=drafter) == plain, drafter
    hierarchical = greedy_24(gguf, kv_cache="hierarchical")  # QuantSpec's cache, and its draft sharing the tensors
    assert greedy_24(gguf, kv_cache="hierarchical", drafter="quantspec") == hierarchical


@pytest.mark.parametrize("family", ["gemma3", "phi3"])
def test_a_quantized_file_runs_in_its_blocks_and_speculation_stays_exact(checkpoint_factory, tmp_path, family):
    """Q8_0 matrices on edge's kernel, the layers in the fused calls: close to the float checkpoint holding the same
    values (the kernel quantizes each matmul's input to 8 bits, as llama.cpp does), and speculative decoding equals
    plain decoding."""
    folder = checkpoint_factory(family)
    gguf = write_gguf(folder, tmp_path / f"{family}.q8_0.gguf", "q8_0")
    model = load_model(checkpoint_from_gguf(gguf))
    reference = load_model(reference_folder(folder, tmp_path / "reference", "q8_0", torch.float32))
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = model.logits(model(ids, 0, KVCache.for_model(model.config, 32)))
        expected = reference.logits(reference(ids, 0, KVCache.for_model(reference.config, 32)))
    assert (got - expected).abs().max().item() < 0.15
    if model.runner.matmul is not None:  # edge's kernel is built here: the matrices stay in their blocks
        assert isinstance(model.layers[0].attn.wqkv, BlockLinear) and model.runner.fused_format == "blocks"
    plain = greedy_24(gguf)
    assert greedy_24(gguf, drafter="ngram") == plain
    assert greedy_24(gguf, drafter="early-exit:2") == plain


def test_gemma3s_chat_template_from_the_file_renders_as_transformers_does(checkpoint_factory, tmp_path):
    """The template a GGUF carries (tokenizer.chat_template), with its bos_token and raise_exception; a chat on it."""
    import shutil

    from edge.errors import TokenizerError
    from edge.text.tokenizer import Tokenizer
    from tests.text.test_chat_template import GEMMA3

    folder = tmp_path / "gemma3"
    shutil.copytree(checkpoint_factory("gemma3"), folder)
    (folder / "chat_template.jinja").write_text(GEMMA3)
    gguf = write_gguf(folder, tmp_path / "gemma3-chat.gguf", "f32")
    tokenizer = Tokenizer.from_dir(checkpoint_from_gguf(gguf))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    original = transformers.AutoTokenizer.from_pretrained(folder)
    original.bos_token = tokenizer.bos_token  # the file's: the checkpoint's bos_token_id (its tokenizer names none)
    expected = original.apply_chat_template(messages, chat_template=GEMMA3, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == expected
    assert expected.startswith(tokenizer.bos_token) and expected.endswith("<start_of_turn>model\n")
    with pytest.raises(TokenizerError, match="roles must alternate"):
        tokenizer.apply_chat_template(messages + [{"role": "user", "content": "again"}])
    assert len(greedy(gguf, messages, 8, max_context=128)) == 8


def test_a_gemma_sentencepiece_vocabulary_encodes_as_transformers_converts_it(tmp_path):
    """Gemma's tokenizer as a GGUF stores it ('llama' pieces and scores, add_space_prefix false) encodes and decodes as
    the tokenizer.json transformers' GemmaConverter builds from the same SentencePiece model. The model is made here
    (a BPE vocabulary in merge order, scored by rank) and read without the sentencepiece package."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import GemmaConverter, GemmaSentencePieceExtractor, import_protobuf

    from edge.sources.gguf_tokenizer import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TokenizerFiles
    from edge.text.tokenizer import Tokenizer
    from tests.conftest import TRAINING_TEXT

    learner = RawTokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    learner.train_from_iterator(TRAINING_TEXT, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    learned = sorted(learner.get_vocab().items(), key=lambda item: item[1])  # merge order: single characters first
    pieces = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<start_of_turn>", 3), ("<end_of_turn>", 3)]
    pieces += [(f"<0x{byte:02X}>", 6) for byte in range(256)] + [(piece, 1) for piece, _ in learned]
    proto = import_protobuf().ModelProto()
    for index, (piece, kind) in enumerate(pieces):
        proto.pieces.add(piece=piece, score=0.0 if kind != 1 else -float(index), type=kind)
    proto.trainer_spec.model_type, proto.trainer_spec.byte_fallback, proto.trainer_spec.unk_piece = 2, True, "<unk>"
    (tmp_path / "tokenizer.model").write_bytes(proto.SerializeToString())

    class Pieces:  # what the converter reads of sentencepiece's processor
        def __init__(self, model: str) -> None:
            self.sp = self

        def GetPieceSize(self) -> int:  # noqa: N802 - sentencepiece's name
            return len(pieces)

        def id_to_piece(self, index: int) -> str:
            return pieces[index][0]

    class Original:
        vocab_file, pad_token, eos_token, bos_token = str(tmp_path / "tokenizer.model"), "<pad>", "<eos>", "<bos>"

    extractor = type("Extractor", (GemmaSentencePieceExtractor,), {"__init__": Pieces.__init__, **{
        name: getattr(Pieces, name) for name in ("GetPieceSize", "id_to_piece")}})
    converter = GemmaConverter(Original())
    converter.SpmExtractor = extractor
    original = converter.converted()
    kinds = {3: TOKEN_CONTROL, 2: TOKEN_UNKNOWN, 6: TOKEN_BYTE, 1: TOKEN_NORMAL}
    files = TokenizerFiles.from_metadata({  # what convert_hf_to_gguf.py's Gemma3Model writes
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [piece for piece, _ in pieces],
        "tokenizer.ggml.scores": [p.score for p in proto.pieces],
        "tokenizer.ggml.token_type": [kinds[kind] for _, kind in pieces], "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": False})
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "tokenizer.json").write_text(json.dumps(files.tokenizer_json))
    (tmp_path / "ours" / "tokenizer_config.json").write_text(json.dumps(files.tokenizer_config))
    ours = Tokenizer.from_dir(tmp_path / "ours")
    assert files.eos_token_ids == [1, 5]  # <eos>, then <end_of_turn> ends a reply
    for text in ["The quick brown fox jumps over the lazy dog.", "def main():\n\treturn sum(range(10))  # 12345",
                 "  leading spaces, trailing  ", "Les modèles tournent. 日本語 🙂",
                 "<start_of_turn>user\nhi<end_of_turn>"]:
        ids = original.encode(text).ids
        assert len(ids) < len(text.encode()) or not text.isascii()  # pieces longer than a byte were used
        assert ours.encode(text) == [2] + ids, text  # the bos the file asks for, then the same pieces
        assert ours.decode(ids) == original.decode(ids), text
