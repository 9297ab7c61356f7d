"""What decoding with speculation holds in memory, counted from shapes before anything is loaded.

Every figure is bytes. A `ModelShape` describes a decoder-only transformer with plain numbers (this package imports
nothing from edge; `edge` builds shapes from its configs, ModelConfig.shape()), and is also the shape record edge's
CPU kernel reads a model's sizes from (edge/kernels/runner.py, by field name). `footprint()` adds up the parts
SpecMemo counts:

    target weights     parameters x bytes per weight (float32/bfloat16/float16, or int8/int4 with group scales)
    target KV          2 (keys, values) x layers x kv_heads x context x head_dim x bytes per KV element
    drafter weights    a separate draft model's parameters; 0 for self-drafts (shared weights) and n-gram
    draft KV           a separate draft model's own cache; 0 for self-drafts (they write the target's cache)
    draft buffers      what one verify pass of k + 1 tokens allocates: hidden states, the widest projection
                       output, attention scores, and logits over the (possibly trimmed) vocabulary
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WEIGHT_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.5}
# KV formats: plain dtypes, and the quantized layouts of edge/model/quantized_kv_cache.py (one float16 scale per
# vector of head_dim values; hierarchical adds a float16 minimum); "int8-int4" is int8 keys with int4 values
KV_FORMATS = ("float32", "bfloat16", "float16", "int8", "int4", "hierarchical", "int8-int4")


def kv_vector_bytes(kind: str, head_dim: int) -> int:
    """Stored bytes of one cached vector (one token, one KV head)."""
    plain = {"float32": 4, "bfloat16": 2, "float16": 2}
    if kind in plain:
        return plain[kind] * head_dim
    return {"int8": head_dim + 2, "int4": head_dim // 2 + 2, "hierarchical": head_dim + 4}[kind]
ACTIVATION_BYTES = 4  # activations, scores and logits are float32 on the CPU paths


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False  # two more norms per layer, on the attention's and feed-forward's outputs (Gemma)
    rms_norm_eps: float = 1e-6  # the RMSNorms' epsilon (what the kernel's fused calls normalize with)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_parameters(self) -> int:
        """The parameters of one decoder layer (attention, MLP, norms, biases)."""
        d, i, q, kv = self.hidden_size, self.intermediate_size, self.q_size, self.kv_size
        attention = d * (q + 2 * kv) + q * d + (q + 2 * kv if self.qkv_bias else 0) + (d if self.o_bias else 0)
        mlp = 3 * d * i + (2 * i + d if self.mlp_bias else 0)
        norms = (4 if self.sandwich_norms else 2) * d + (2 * self.head_dim if self.qk_norm else 0)
        return attention + mlp + norms

    def parameters(self) -> int:
        """Every parameter, norms and biases included (what the checkpoint holds)."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_parameters() + embeddings + self.hidden_size  # + the final norm

    def quantized_projection_bytes(self, bits: int, group_size: int = 32) -> int:
        """Every layer's projection matrices quantized to `bits` with a float16 scale per `group_size` weights, and
        at 4 bits a float16 minimum too (what a QuantSpec draft holds beside the target: edge's int4 on the CPU)."""
        d, i, q, kv = self.hidden_size, self.intermediate_size, self.q_size, self.kv_size
        matrices = [(q + 2 * kv, d), (d, q), (2 * i, d), (d, i)]  # (N, K): qkv, o, gate+up, down
        per_group = 4 if bits == 4 else 2
        per_layer = sum(n * k * bits // 8 + n * (k // group_size) * per_group for n, k in matrices)
        return self.num_layers * per_layer

    def block_head_bytes(self) -> int:
        """The output head in 8-bit blocks of 32 with a float16 scale each (llama.cpp's Q8_0: 34 bytes a block)."""
        return self.vocab_size * -(-self.hidden_size // 32) * 34

    def layer_bytes(self, dtype: str = "float32") -> int:
        """One layer's weights in a float dtype (what offloading one layer moves off the device)."""
        return int(self.layer_parameters() * WEIGHT_BYTES[dtype])

    def weight_bytes(self, dtype: str = "float32", group_size: int = 128) -> int:
        """Weights in `dtype`. int8 stores the projection matrices quantized with one float16 scale per group of
        `group_size` weights, and keeps embeddings and norms in float16. int4 (edge's, edge/model/packed_weights.py)
        stores them in 4-bit blocks of 32 with a float16 scale and minimum (5 bits a weight), keeps embeddings and norms
        in float16, and adds a copy of the head in 8-bit blocks of 32 with a float16 scale (8.5 bits)."""
        if dtype not in WEIGHT_BYTES:
            raise ValueError(f"unknown weight dtype {dtype!r}; expected one of {', '.join(WEIGHT_BYTES)}")
        if dtype not in ("int8", "int4"):
            return int(self.parameters() * WEIGHT_BYTES[dtype])
        matrices = self.num_layers * (self.hidden_size * (2 * self.q_size + 2 * self.kv_size)
                                      + 3 * self.hidden_size * self.intermediate_size)
        rest = self.parameters() - matrices
        if dtype == "int4":
            return int(matrices * 5 / 8 + rest * 2 + self.vocab_size * self.hidden_size * 8.5 / 8)
        return int(matrices * WEIGHT_BYTES[dtype] + matrices / group_size * 2 + rest * 2)

    def kv_bytes(self, context: int, dtype: str = "float32") -> int:
        """Keys and values of every layer for `context` positions, stored as `dtype` (any of KV_FORMATS)."""
        if dtype not in KV_FORMATS:
            raise ValueError(f"unknown KV dtype {dtype!r}; expected one of {', '.join(KV_FORMATS)}")
        keys, values = ("int8", "int4") if dtype == "int8-int4" else (dtype, dtype)
        vectors = self.num_layers * self.num_kv_heads * context
        return vectors * (kv_vector_bytes(keys, self.head_dim) + kv_vector_bytes(values, self.head_dim))

    def verify_buffer_bytes(self, tokens: int, context: int, vocab: int | None = None) -> int:
        """Peak transient bytes of one pass over `tokens` tokens: the residual stream and a normed copy, the widest
        projection output (gate and up together), the attention scores of every head, and the logits."""
        widest = max(self.q_size + 2 * self.kv_size, 2 * self.intermediate_size)
        per_token = 2 * self.hidden_size + widest + self.num_heads * context + (vocab or self.vocab_size)
        return tokens * per_token * ACTIVATION_BYTES


@dataclass(frozen=True)
class Footprint:
    target_weights: int
    target_kv: int
    drafter_weights: int
    draft_kv: int
    draft_buffers: int
    host_weights: int = 0  # offloaded layers, in host memory (not counted against the device budget)

    @property
    def total(self) -> int:
        return self.target_weights + self.target_kv + self.drafter_weights + self.draft_kv + self.draft_buffers

    @property
    def speculation(self) -> int:
        """What speculation adds beyond the target's weights and its own KV (SpecMemo's 'generation memory')."""
        return self.drafter_weights + self.draft_kv + self.draft_buffers

    def to_dict(self) -> dict:
        return {**asdict(self), "speculation": self.speculation, "total": self.total}


def footprint(target: ModelShape, context: int, *, weight_dtype: str = "float32", kv_dtype: str = "float32",
              drafter: ModelShape | None = None, drafter_weight_dtype: str | None = None,
              draft_kv_dtype: str | None = None, draft_context: int | None = None, draft_length: int = 0,
              drafter_vocab: int | None = None, offloaded_layers: int = 0,
              quantized_self_draft: int | None = None, target_weight_bytes: int | None = None) -> Footprint:
    """The bytes of target, its KV at `context`, and speculation with `draft_length` tokens per step.

    `drafter` is a separate draft model (None for self-drafts and n-gram, which hold no weights or cache of their
    own); `drafter_vocab` is the size of a trimmed drafter head (VocabTrim). `offloaded_layers` of the target's
    layers live in host memory; the device holds the rest and two staging layers they stream through.
    `quantized_self_draft` (bits) is a QuantSpec draft: the target's projections quantized, and at 4 bits an 8-bit
    copy of a float head (a quantized head is shared).
    `target_weight_bytes` is the target's weights counted exactly where they are stored in a format the shape cannot
    size (a GGUF file's blocks: weight_dtype is then its name only)."""
    draft_weights = draft_kv = 0
    if quantized_self_draft:
        draft_weights = target.quantized_projection_bytes(quantized_self_draft)
        if quantized_self_draft == 4 and weight_dtype in ("float32", "bfloat16", "float16"):
            draft_weights += target.block_head_bytes()  # an 8-bit copy of a float head, read once a drafted token
    if drafter is not None:
        draft_weights = drafter.weight_bytes(drafter_weight_dtype or weight_dtype)
        draft_kv = drafter.kv_bytes(draft_context or context, draft_kv_dtype or kv_dtype)
    buffers = 0
    if draft_length > 0:
        buffers = target.verify_buffer_bytes(draft_length + 1, context)
        if drafter is not None:  # the drafter's own 1-token passes, logits over its (trimmed) vocabulary
            buffers += drafter.verify_buffer_bytes(1, draft_context or context, drafter_vocab)
    host = offloaded_layers * target.layer_bytes(weight_dtype) if offloaded_layers else 0
    staging = min(2, offloaded_layers) * target.layer_bytes(weight_dtype) if offloaded_layers else 0
    weights = target_weight_bytes if target_weight_bytes is not None else target.weight_bytes(weight_dtype)
    return Footprint(weights - host + staging, target.kv_bytes(context, kv_dtype),
                     draft_weights, draft_kv, buffers, host)
