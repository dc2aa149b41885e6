"""What the encoder parity tests share: each architecture's reference (transformers' model; NeoBERT's a torch port
of tests/data/neobert-tiny/README.md), a padded batch, the comparisons, and the one way they reach kbert's encoders."""

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from kbert.models.architecture import architecture
from kbert.models.encoders import build_encoder
from kbert.models.masked_lm import build_masked_lm, load_masked_lm_weights
from kbert.models.weights import load_state_strict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)  # tiny tensors: on two shared cores torch's thread pool made each call 50 times slower

FIELDS = ("last_hidden_state", "pooler_output", "hidden_states", "attentions")
LENGTHS = (16, 11, 3, -9)  # real tokens per row of the batch; negative: left-padded
TOL = 1e-4


# kbert's side: the tests call and load kbert's encoders through these three only.

def outputs(result) -> SimpleNamespace:
    """The four outputs of an ``EncoderOutput``; what it lacks is None."""
    return SimpleNamespace(**{name: getattr(result, name, None) for name in FIELDS})


def encode(model, ids=None, mask=None, types=None, *, embeds=None, record: bool = False) -> SimpleNamespace:
    """Run a kbert encoder on numpy or MLX inputs; ``record``: with every hidden state and attention."""
    asked = {"output_hidden_states": True, "output_attentions": True} if record else {}
    ids, mask, types = (None if a is None else mx.array(a) for a in (ids, mask, types))
    return outputs(model(input_ids=ids, attention_mask=mask, token_type_ids=types, inputs_embeds=embeds, **asked))


def load_ours(values: dict, weights: dict, *, masked_lm: bool = False):
    """kbert's encoder (or masked-LM model) for config.json ``values``, ``weights`` loaded as the product does."""
    weights = {k: mx.array(v.detach().numpy() if hasattr(v, "detach") else v) for k, v in weights.items()}
    if masked_lm:
        model, _ = build_masked_lm(values)
        load_masked_lm_weights(model, weights, "checkpoint")
    else:
        arch = architecture(values["model_type"])
        weights = arch.sanitize(weights)
        model, _ = build_encoder({"add_pooling_layer": bool(arch.pooler) and arch.pooler in weights, **values})
        load_state_strict(model, weights, "checkpoint")
    model.eval()
    return model


@dataclass(frozen=True)
class Arch:
    hf: str  # the reference classes' prefix: {hf}Config, {hf}Model, {hf}ForMaskedLM, {hf}{task}
    values: dict  # the tiny config.json
    eps: str  # the config key of the layer-norm epsilon
    qk: tuple  # (query, key) weight name parts, or (fused q|k|v weight, groups of [q | k | v] rows)
    legacy: tuple  # names older checkpoints stored (buffers, pretraining heads), which sanitize drops
    task: str = "ForSequenceClassification"  # a task model whose checkpoint loads into the bare encoder
    masked_lm: dict = field(default_factory=lambda: UNTIED)  # masked-LM variants: config overrides
    mistakes: tuple = ()  # planted mistakes of this architecture only
    gaps: dict = field(default_factory=dict)  # what differs from the reference (a product bug) -> how


COMMON = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              initializer_range=0.2, attn_implementation="eager")  # eager: transformers returns attentions
BERTISH = dict(COMMON, max_position_embeddings=40, hidden_act="gelu", hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, type_vocab_size=2)
ROBERTA = dict(BERTISH, model_type="roberta", type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
SELF_QK = ("attention.self.query.", "attention.self.key.")
UNTIED = {"tied": {}, "untied": {"tie_word_embeddings": False}}
PAD_ROW = "the padding token's row of the token table is trained (torch's padding_idx keeps it)"
# DeBERTa-v3: log-bucketed relative positions (8 buckets, sequences of 16), shared Q/K projections, LayerNorm on
# the relative embeddings, no absolute positions or token types. v2: separate position projections, relative
# positions clipped at 6, absolute positions and token types, a factorised embedding (24 -> 32), the convolution.
V3 = dict(BERTISH, model_type="deberta-v2", max_position_embeddings=64, relative_attention=True, position_buckets=8,
          norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type="p2c|c2p", position_biased_input=False,
          type_vocab_size=0, max_relative_positions=-1)
V2 = dict(BERTISH, model_type="deberta-v2", relative_attention=True, position_buckets=-1, max_relative_positions=6,
          norm_rel_ebd="none", share_att_key=False, pos_att_type=["c2p", "p2c"], position_biased_input=True,
          embedding_size=24, conv_kernel_size=3, conv_act="tanh")
DEBERTA = dict(eps="layer_norm_eps", qk=("attention.self.query_proj.", "attention.self.key_proj."), legacy=(
    "deberta.embeddings.position_ids", "mask_predictions.classifier.weight", "lm_predictions.lm_head.bias"))
ARCHS = {
    "bert": Arch("Bert", dict(BERTISH, model_type="bert"), "layer_norm_eps", SELF_QK, ("bert.embeddings.position_ids",),
                 task="ForPreTraining", gaps={"embeddings.word_embeddings.weight": PAD_ROW}),
    "roberta": Arch("Roberta", ROBERTA, "layer_norm_eps", SELF_QK, ("roberta.embeddings.position_ids",),
                    mistakes=("BERT's positions", "positions count padding")),
    "xlm-roberta": Arch("XLMRoberta", dict(ROBERTA, model_type="xlm-roberta"), "layer_norm_eps", SELF_QK,
                        ("roberta.embeddings.position_ids",), mistakes=("BERT's positions",)),
    "electra": Arch("Electra", dict(BERTISH, model_type="electra", embedding_size=16), "layer_norm_eps", SELF_QK,
                    ("electra.embeddings.position_ids",), task="ForPreTraining",
                    masked_lm={**UNTIED, "unprojected": {"embedding_size": 32}}),
    "deberta-v3": Arch("DebertaV2", V3, **DEBERTA, masked_lm={**UNTIED, "lm_predictions": {"legacy": False}},
                       mistakes=("relative bucket", "no c2p", "no p2c", "scale without the relative terms",
                                 "key-only padding mask")),
    "deberta-v2": Arch("DebertaV2", V2, **DEBERTA, mistakes=("relative bucket",)),
    # c2p alone, with its own key projection; no relative attention at all (only absolute positions)
    "deberta-c2p": Arch("DebertaV2", dict(V3, share_att_key=False, pos_att_type=["c2p"], max_relative_positions=20),
                        **DEBERTA),
    "deberta-absolute": Arch("DebertaV2", dict(V2, relative_attention=False, pos_att_type="c2p", conv_kernel_size=0,
                                               norm_rel_ebd="layer_norm"), **DEBERTA),
    "mpnet": Arch("MPNet", dict(COMMON, model_type="mpnet", max_position_embeddings=40, hidden_act="gelu",
                                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=1,
                                layer_norm_eps=1e-5), "layer_norm_eps", ("attention.attn.q.", "attention.attn.k."),
                  ("mpnet.embeddings.position_ids",),
                  mistakes=("one relative bucket", "BERT's positions", "positions count padding")),
    "modernbert": Arch("ModernBert", dict(COMMON, model_type="modernbert", max_position_embeddings=64,
                                          global_attn_every_n_layers=2, local_attention=8, global_rope_theta=500.0,
                                          local_rope_theta=30.0, attention_dropout=0.1, mlp_dropout=0.1,
                                          embedding_dropout=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                          cls_token_id=1, sep_token_id=2), "norm_eps", ("attn.Wqkv.weight", 1),
                       ("model.layers.0.attn.rotary_emb.inv_freq",), mistakes=("RoPE left out",),
                       masked_lm={**UNTIED, "sdpa": {"attn_implementation": "sdpa"}},
                       gaps={"embeddings.tok_embeddings.weight": PAD_ROW}),
    "neobert": Arch("NeoBertPort", dict(COMMON, model_type="neobert", max_length=32, norm_eps=1e-6), "norm_eps",
                    ("qkv.weight", 4), ("model.freqs_cis",), task="ForMaskedLM", mistakes=("RoPE left out",),
                    gaps={"encoder.weight": PAD_ROW}),
}


class NeoBertPortConfig(SimpleNamespace):
    def to_dict(self) -> dict:
        return {**vars(self), "model_type": "neobert"}


class NeoBertPortModel(torch.nn.Module):
    """The README's "Semantics" under the reference's parameter names (checked on the fixture's own vectors)."""

    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__()
        nn, h, inner = torch.nn, config.hidden_size, 8 * ((2 * config.intermediate_size // 3 + 7) // 8)
        norm, linear = functools.partial(nn.RMSNorm, h, config.norm_eps), functools.partial(nn.Linear, bias=False)
        pad = getattr(config, "pad_token_id", 0)
        self.config, self.encoder = config, nn.Embedding(config.vocab_size, h, padding_idx=pad)
        self.transformer_encoder = nn.ModuleList(nn.ModuleDict(dict(
            attention_norm=norm(), qkv=linear(h, 3 * h), wo=linear(h, h), ffn_norm=norm(), ffn=nn.ModuleDict(dict(
                w12=linear(h, 2 * inner), w3=linear(inner, h))))) for _ in range(config.num_hidden_layers))
        self.layer_norm = norm()

    def get_input_embeddings(self):
        return self.encoder

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, **_):
        x = self.encoder(input_ids) if inputs_embeds is None else inputs_embeds
        (b, n, h), d = x.shape, x.shape[-1] // self.config.num_attention_heads
        angle = torch.outer(torch.arange(n, dtype=torch.float32), 10000.0 ** -(torch.arange(0, d, 2) / d))
        turn = torch.polar(torch.ones_like(angle), angle)  # adjacent pairs rotate (Llama's complex form)
        rope = lambda t: torch.view_as_real(torch.view_as_complex(t.unflatten(-1, (-1, 2))) * turn).flatten(-2)  # noqa
        blocked = 0 if attention_mask is None else (attention_mask[:, None, None, :] == 0) * torch.finfo(x.dtype).min
        states, attentions = [x], []
        for block in self.transformer_encoder:
            q, k, v = block.qkv(block.attention_norm(x)).view(b, n, h // d, -1).transpose(1, 2).chunk(3, -1)
            attentions.append(torch.softmax(rope(q) @ rope(k).transpose(-1, -2) / d ** 0.5 + blocked, -1))
            x = x + block.wo((attentions[-1] @ v).transpose(1, 2).reshape(b, n, h))
            gate, up = block.ffn.w12(block.ffn_norm(x)).chunk(2, -1)
            states.append(x := x + block.ffn.w3(torch.nn.functional.silu(gate) * up))
        x = self.layer_norm(x)
        return transformers.modeling_outputs.BaseModelOutput(x, (*states[:-1], x), tuple(attentions))


class NeoBertPortForMaskedLM(torch.nn.Module):
    """The reference's ``NeoBERTLMHead``: a decoder on the encoder's last hidden state."""

    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__()
        self.config, self.model = config, NeoBertPortModel(config)
        self.decoder = torch.nn.Linear(config.hidden_size, config.vocab_size)
        if getattr(config, "tie_word_embeddings", False):
            self.decoder.weight = self.model.encoder.weight

    def forward(self, input_ids=None, attention_mask=None, **_):
        hidden = self.model(input_ids, attention_mask).last_hidden_state
        return transformers.modeling_outputs.MaskedLMOutput(logits=self.decoder(hidden))


def reference_class(arch: Arch, suffix: str, values: dict):
    """The reference class ``{arch.hf}{suffix}`` and its config for config.json ``values``."""
    config = getattr(transformers, f"{arch.hf}Config", NeoBertPortConfig)(
        **{k: v for k, v in values.items() if k != "model_type"})
    return getattr(transformers, arch.hf + suffix, None) or globals()[arch.hf + suffix], config


def reference_model(arch: Arch, suffix: str = "Model", overrides=None, seed=0):
    """The seeded reference ``{arch.hf}{suffix}`` for the tiny config (with ``overrides``), in eval mode: weights large
    enough for peaked attention (``initializer_range`` 0.2), norm weights and biases off their ones and zeros, and
    small embedding tables, under whose layer norms a wrong epsilon shows."""
    cls, config = reference_class(arch, suffix, {**arch.values, **(overrides or {})})
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
            elif ".embeddings." in f".{name}" or name.endswith("encoder.weight"):
                p.copy_(0.02 * torch.randn_like(p))
    return model


def batch(arch: Arch):
    """Token ids (never the padding id on real tokens), the padding mask, and token types where the model has them."""
    rng, pad, seq = np.random.default_rng(1), arch.values.get("pad_token_id", 0), max(LENGTHS)
    ids, mask = np.full((len(LENGTHS), seq), pad), np.zeros((len(LENGTHS), seq), dtype=np.int64)
    for row, n in enumerate(LENGTHS):
        span = slice(0, n) if n > 0 else slice(seq + n, None)
        ids[row, span], mask[row, span] = rng.integers(pad + 1, arch.values["vocab_size"], abs(n)), 1
    types = (np.arange(seq) >= 6) * mask if arch.values.get("type_vocab_size", 0) > 1 else None
    return ids, mask, types


def torch_inputs(ids, mask, types=None):
    given = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
    return {k: torch.tensor(v) for k, v in given.items() if v is not None}


def differences(ours, expected) -> dict[str, float]:
    """Max |ours - expected| per output ours gives (hidden states, attentions: the worst layer) at every position,
    padded ones too (every reference here defines them); one the reference does not give counts as infinite."""
    return {name: float("inf") if getattr(expected, name, None) is None else max(
        float(np.abs(np.array(a) - b.detach().numpy()).max()) for a, b in (
            zip(mine, expected[name], strict=True) if isinstance(mine, tuple) else [(mine, expected[name])]))
        for name in FIELDS if (mine := getattr(ours, name)) is not None}


def relative_errors(got: dict, expected: dict) -> dict[str, float]:
    """Per weight: max |difference| divided by that weight's largest |expected gradient| where that exceeds 1
    (absolute below 1; float32 summation order alone moves gradients in the hundreds by ~1e-4)."""
    return {k: float(np.abs(np.array(got[k]) - expected[k]).max() / max(1.0, np.abs(expected[k]).max()))
            for k in expected}
