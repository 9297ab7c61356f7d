"""EAGLE-3 heads (edge/decoding/drafters/eagle3.py): a head written here in the Hugging Face Hub's layout loads from a
folder or from the Hub's cache, greedy speculation with it equals plain greedy decoding on the torch path, in the
fused C step (chains and token trees) and on a GGUF target, sampling with it keeps the target's distribution, and a
head for another target is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from edge import EdgeError, Engine
from edge.decoding.drafters.base import DraftSampler
from edge.decoding.drafters.eagle3 import TREE_WIDTH, Eagle3Drafter
from edge.decoding.sampling import SamplingParams, distribution, history_tensor
from edge.decoding.speculative import DraftLength, SpeculativeDecoding
from edge.kernels.block_formats import BlockMatrix
from edge.sources.loading import load_model
from tests.decoding.test_token_trees import _forced_trees
from tests.gguf_files import write_gguf
from tests.helpers import greedy

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "import os\nfor name in"]


def write_head(folder: Path, target_dir: Path, seed: int = 0, *, hidden: int | None = None, vocab: int | None = None,
               layer_ids: list[int] | None = (2, 3, 3), pickle: bool = False,
               dtype: torch.dtype = torch.float32) -> Path:
    """A random EAGLE-3 head for the target in `target_dir`, as the Hub holds one: config.json and model.safetensors
    (fc, midlayer.*, norm, lm_head, d2t, t2d) over a draft vocabulary of half the target's tokens. The default layer
    ids (vLLM's reading: the streams entering layers 2, 3 and 3) take the last two layers' outputs."""
    target = json.loads((target_dir / "config.json").read_text())
    d, heads, kv_heads = hidden or target["hidden_size"], target["num_attention_heads"], target["num_key_value_heads"]
    head_dim, inner, v = d // heads, 2 * d, vocab or target["vocab_size"]
    generator = torch.Generator().manual_seed(seed)
    kept = torch.randperm(v, generator=generator)[: v // 2].sort().values  # (Vd,) the draft vocabulary's tokens
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[kept] = True

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.2

    layer = {"self_attn.q_proj": random(heads * head_dim, 2 * d), "self_attn.k_proj": random(kv_heads * head_dim, 2 * d),
             "self_attn.v_proj": random(kv_heads * head_dim, 2 * d), "self_attn.o_proj": random(d, heads * head_dim),
             "mlp.gate_proj": random(inner, d), "mlp.up_proj": random(inner, d), "mlp.down_proj": random(d, inner),
             "input_layernorm": 1 + random(d), "hidden_norm": 1 + random(d), "post_attention_layernorm": 1 + random(d)}
    tensors = {f"midlayer.{name}.weight": t for name, t in layer.items()}
    tensors.update({"fc.weight": random(d, 3 * d), "norm.weight": 1 + random(d), "lm_head.weight": random(len(kept), d),
                    "d2t": kept - torch.arange(len(kept)), "t2d": t2d})
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": d,
              "intermediate_size": inner, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "max_position_embeddings": 2048, "vocab_size": v, "draft_vocab_size": len(kept),
              "torch_dtype": "float32"}
    if layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
    if pickle:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def head(llama_dir, tmp_path_factory) -> Path:
    return write_head(tmp_path_factory.mktemp("eagle3") / "head", llama_dir)


@pytest.fixture(scope="module")
def expected(llama_dir) -> list[list[int]]:
    plain = Engine.load(llama_dir, max_context=256)
    return [greedy(plain, prompt, 40) for prompt in PROMPTS]


@pytest.mark.parametrize("path", ["fused", "torch"])
def test_greedy_speculation_with_an_eagle3_head_equals_plain_decoding(llama_dir, head, expected, path, monkeypatch):
    if path == "torch":
        monkeypatch.setenv("EDGE_ROWWISE_MATMUL", "0")
    engine = Engine.load(llama_dir, max_context=256, drafter=f"eagle3:{head}", draft_length=3)
    model = engine.model
    assert (model.runner.matmul is None) == (path == "torch")
    assert [greedy(engine, prompt, 40) for prompt in PROMPTS] == expected
    assert model.layer_features.layers == (1, 2, 2)


def test_a_16_bit_head_stays_16_bit_and_keeps_the_output(llama_dir, expected, tmp_path):
    head = write_head(tmp_path / "half", llama_dir, dtype=torch.bfloat16)
    engine = Engine.load(llama_dir, max_context=256, drafter=f"eagle3:{head}", draft_length=3)
    assert greedy(engine, PROMPTS[0], 40) == expected[0]
    assert engine.drafter.layer.weights["lm_head.weight"].dtype == torch.bfloat16


def test_token_trees_from_an_eagle3_head_keep_the_output(llama_dir, head, expected, monkeypatch):
    made = _forced_trees(monkeypatch)
    engine = Engine.load(llama_dir, max_context=256, drafter=f"eagle3:{head}")
    assert [greedy(engine, prompt, 40) for prompt in PROMPTS] == expected
    assert made[-1].sampler.trees and sum(s.tree_rows for s in made) > 0


def test_a_tree_draft_grows_each_path_as_a_chain_would(llama_dir, head):
    """Every node of an EAGLE-2 tree is among its parent's TREE_WIDTH likeliest children, and its reach is the
    product of the probabilities the head gives its path drafted as a chain: in the tree's batched passes each node
    sees the context and its own ancestors, at its depth's position, and nothing else."""
    model = load_model(llama_dir)
    drafter = Eagle3Drafter.load(head, model, 64)
    cache = model.new_cache(64)
    prompt = list(range(5, 17))
    with torch.inference_mode():
        model.forward_logits(torch.tensor([prompt[:-1]]), 0, cache)
    sampler = DraftSampler(SamplingParams(temperature=0.0), torch.Generator(), vocab_size=model.config.vocab_size,
                           trees=True)
    tree = drafter.propose(prompt, 4, sampler)
    n, branches = len(tree.tokens), tree.branches
    assert n == 4 and any(branch.parent >= n for branch in branches)  # subtrees, not only leaves beside the chain
    assert all(-1 <= branch.parent < n + i for i, branch in enumerate(branches))  # each after its parent
    assert [b.reach for b in branches] == sorted((b.reach for b in branches), reverse=True)
    nodes = [(token, j - 1) for j, token in enumerate(tree.tokens)] + [(b.token, b.parent) for b in branches]
    reaches = [None] * n + [b.reach for b in branches]
    row_of = {int(token): row for row, token in enumerate(drafter.token_ids.tolist())}
    last = len(prompt) - 1
    with torch.inference_mode():
        root = drafter._rows(drafter.layer.fuse(drafter.kept.rows[:last]), prompt[1:], 0)[-1:]  # (1, D)
        for index in range(len(nodes)):
            path, node = [], index
            while node >= 0:
                path.insert(0, nodes[node][0])
                node = nodes[node][1]
            out, reach = root, 1.0
            for depth, token in enumerate(path):
                probs = drafter.layer.logits(out)[0].float().softmax(-1)  # (Vd,)
                assert row_of[token] in probs.topk(TREE_WIDTH).indices.tolist(), (index, depth)
                reach *= float(probs[row_of[token]])
                out = drafter._rows(out, [token], last + depth)  # (1, D)
            if index < n:
                assert path == tree.tokens[:index + 1]  # the chain: first choices
                assert tree.confidences[index] == pytest.approx(float(probs[row_of[path[-1]]]), rel=1e-4)
            else:
                assert reaches[index] == pytest.approx(reach, rel=1e-4), index


def test_an_eagle3_head_on_a_gguf_target_keeps_its_output(llama_dir, head, tmp_path):
    gguf = write_gguf(llama_dir, tmp_path / "target.Q8_0.gguf", "q8_0")
    plain = Engine.load(gguf, max_context=256)
    fast = Engine.load(gguf, max_context=256, drafter=f"eagle3:{head}", draft_length=3)
    assert greedy(fast, PROMPTS[0], 30) == greedy(plain, PROMPTS[0], 30)
    weights = fast.drafter.layer.weights
    assert all(isinstance(weights[name], BlockMatrix) and weights[name].formats == ["q8_0"]
               for name in ("fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight",
                            "lm_head.weight"))  # a drafted token reads 8-bit blocks, not float32 matrices


def test_a_head_in_8_bit_blocks_computes_what_its_float_weights_do(llama_dir, head):
    from edge.decoding.drafters.eagle3_head import Eagle3Config, Eagle3Layer, read_tensors

    target = Engine.load(llama_dir, max_context=256).model
    config, tensors = Eagle3Config.read(head), read_tensors(head)
    exact, blocks = (Eagle3Layer(config, tensors, 64, torch.float32, torch.device("cpu"), target.runner, quantized)
                     for quantized in (False, True))
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(5, 3 * config.hidden_size, generator=generator)  # (T, 3D)
    embeds = torch.randn(5, config.hidden_size, generator=generator)  # (T, D)
    wanted, got = (layer.logits(layer.forward(layer.fuse(features), embeds, 0)) for layer in (exact, blocks))
    assert got.shape == wanted.shape  # (T, Vd)
    assert float((got - wanted).norm() / wanted.norm()) < 0.02  # 8-bit codes, a scale per 32 weights
    assert float((got.argmax(-1) == wanted.argmax(-1)).float().mean()) >= 0.8
    assert blocks.nbytes < exact.nbytes / 3


def test_sampled_drafts_report_the_distribution_they_were_drawn_from(llama_dir, head):
    """Drawn many times from one state, the drafted first token follows the q the drafter reports, which is the
    temperature-warped softmax of the head over the draft vocabulary and zero elsewhere."""
    model = load_model(llama_dir)
    drafter = Eagle3Drafter.load(head, model, 64)
    cache = model.new_cache(64)  # the target's pass over the prompt keeps its streams
    prompt = list(range(5, 17))
    with torch.inference_mode():
        model.forward_logits(torch.tensor([prompt[:-1]]), 0, cache)
    params = SamplingParams(temperature=1.5)
    sampler = DraftSampler(params, torch.Generator().manual_seed(0), vocab_size=model.config.vocab_size)
    draws, q = [], None
    for _ in range(3000):
        draft = drafter.propose(prompt, 1, sampler)
        draws.append(draft.tokens[0])
        q = draft.probs[0] if q is None else q
        assert torch.allclose(draft.probs[0], q, atol=1e-6)  # the same state: the same distribution (to rounding)
    outside = torch.ones_like(q, dtype=torch.bool)
    outside[drafter.token_ids] = False
    assert float(q[outside].abs().sum()) == 0.0 and abs(float(q.sum()) - 1.0) < 1e-5
    counts = torch.bincount(torch.tensor(draws), minlength=q.numel()).float()
    likely = q > 0.02  # a chi-square over the tokens drawn often enough, the rest pooled
    observed = torch.cat([counts[likely], counts[~likely].sum()[None]])
    wanted = torch.cat([q[likely], q[~likely].sum()[None]]) * len(draws)
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    degrees = torch.tensor((observed.numel() - 1) / 2, dtype=torch.float64)
    assert float(torch.special.gammaincc(degrees, torch.tensor(statistic / 2, dtype=torch.float64))) > 1e-3


def test_seeded_sampling_with_an_eagle3_head_is_reproducible(llama_dir, head):
    engine = Engine.load(llama_dir, max_context=256, drafter=f"eagle3:{head}", draft_length=3)
    runs = [greedy(engine, PROMPTS[0], 30, temperature=0.9, seed=11) for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_head_loads_from_the_hub_cache(llama_dir, head, expected, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / "models--someone--tiny-eagle3"
    commit = "0" * 40
    shutil.copytree(head, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine = Engine.load(llama_dir, max_context=256, drafter="eagle3:someone/tiny-eagle3", draft_length=3)
    assert greedy(engine, PROMPTS[0], 40) == expected[0]


@pytest.mark.parametrize("change, needle", [
    (dict(hidden=32), "belongs to another target (hidden size 32"),
    (dict(vocab=100), "vocabulary 100"),
    (dict(layer_ids=[2, 9, 10]), "reads target layers [1, 8, 9], beyond this model's 3"),
    (dict(pickle=True), "is a pickle, which edge never loads"),
])
def test_a_head_for_another_target_is_refused_in_one_line(llama_dir, tmp_path, change, needle):
    folder = write_head(tmp_path / "other", llama_dir, **change)
    with pytest.raises(EdgeError) as error:
        Engine.load(llama_dir, max_context=64, drafter=f"eagle3:{folder}")
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_a_folder_that_is_not_an_eagle3_head_is_refused(llama_dir, tmp_path):
    with pytest.raises(EdgeError, match="is not an EAGLE-3 head"):
        Engine.load(llama_dir, max_context=64, drafter=f"eagle3:{llama_dir}")
    with pytest.raises(EdgeError, match="neither a folder nor a Hub id"):
        Engine.load(llama_dir, max_context=64, drafter=f"eagle3:{tmp_path / 'missing'}")


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0),  # plain sampling
    SamplingParams(),  # the defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, penalty 1.1 over 64 tokens
], ids=["plain", "defaults"])
def test_speculative_sampling_with_an_eagle3_head_keeps_the_targets_distribution(llama_dir, head, params):
    """The first token of many speculative steps from one state (2 drafted tokens verified, accepted or corrected)
    follows the target's own distribution there (the prompt's tokens penalized as plain decoding penalizes them): a
    chi-square over the tokens likely enough, the rest pooled."""
    model = load_model(llama_dir)
    drafter = Eagle3Drafter.load(head, model, 64)
    prompt = list(range(20, 36))
    cache = model.new_cache(64)
    with torch.inference_mode():
        model.forward_logits(torch.tensor([prompt[:-1]]), 0, cache)  # the cache holds all but the last token
        logits = model.forward_logits(torch.tensor([prompt[-1:]]), len(prompt) - 1, cache)[0, -1]
    p = distribution(logits.float(), params, history_tensor(prompt, params, "cpu"))  # (V,): plain decoding's
    decoding = SpeculativeDecoding(model, cache, params, torch.Generator().manual_seed(0), drafter,
                                   DraftLength.fixed(2))
    runs, accepted = 1500, 0
    counts = torch.zeros_like(p)
    with torch.inference_mode():
        for _ in range(runs):
            cache.rollback(len(prompt) - 1)
            step = decoding.step(prompt, 8)
            counts[step.tokens[0]] += 1
            accepted += sum(step.drafted)
    likely = p * runs > 10
    observed = torch.cat([counts[likely], counts[~likely].sum()[None]])
    wanted = torch.cat([p[likely], p[~likely].sum()[None]]) * runs
    assert float(counts[p == 0].sum()) == 0  # nothing the target's sampling removes (top-k, top-p, min-p) is drawn
    observed, wanted = observed[wanted > 0], wanted[wanted > 0]  # no pool where top-k left none outside it
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    degrees = torch.tensor((observed.numel() - 1) / 2, dtype=torch.float64)
    assert float(torch.special.gammaincc(degrees, torch.tensor(statistic / 2, dtype=torch.float64))) > 1e-3
    assert accepted > 0  # some drafts were accepted: both branches of the verification ran
