"""Every registered encoder against its reference (tests/parity.py ARCHS) through the same checks, which each
planted mistake must fail; then what one architecture alone has."""

import functools
import json
import re
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models import deberta_v2, mpnet, roberta
from kbert.models.architecture import ARCHITECTURES, architecture
from kbert.models.deberta_v2 import build_relative_position
from kbert.models.encoders import build_encoder
from kbert.models.masked_lm import build_masked_lm
from kbert.models.modernbert import PRESETS, ModernBertConfig
from kbert.models.neobert import NeoBertConfig, NeoBertModel, apply_rope, sanitize
from kbert.models.recompute import set_recompute
from kbert.models.weights import load_state_strict
from tests.parity import (ARCHS, FIELDS, TOL, V2, V3, NeoBertPortConfig, NeoBertPortModel, batch, differences,
                          encode, load_ours, reference_class, reference_model, relative_errors, torch, torch_inputs,
                          transformers)


def test_every_registered_architecture_has_a_reference():
    assert {arch.values["model_type"] for arch in ARCHS.values()} == set(ARCHITECTURES)


@functools.cache  # once per architecture, whichever tests ask in whichever order
def prepared(name: str) -> SimpleNamespace:
    """An architecture's reference, its outputs on the batch, and kbert's encoder loaded from its weights."""
    arch, reference = ARCHS[name], reference_model(ARCHS[name])
    ids, mask, types = batch(arch)
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, types), output_hidden_states=True, output_attentions=True)
    values, weights = reference.config.to_dict(), reference.state_dict()
    return SimpleNamespace(name=name, arch=arch, reference=reference, expected=expected, values=values,
                           weights=weights, ours=load_ours(values, weights), ids=ids, mask=mask, types=types)


@pytest.fixture(params=list(ARCHS))
def case(request):
    return prepared(request.param)


def test_every_output_matches_the_reference(case):
    diffs = differences(encode(case.ours, case.ids, case.mask, case.types, record=True), case.expected)
    assert set(diffs) == set(case.expected.keys()) & set(FIELDS) and max(diffs.values()) <= TOL, diffs
    plain = encode(case.ours, case.ids, case.mask, case.types)  # nothing recorded: the fast path
    assert max(differences(plain, case.expected).values()) <= TOL
    assert np.isfinite(np.array(encode(case.ours, case.ids, 0 * case.mask, case.types).last_hidden_state)).all()
    if "type_vocab_size" not in case.values:  # token types are accepted, and ignored
        ones = encode(case.ours, case.ids, case.mask, np.ones_like(case.ids)).last_hidden_state
        assert np.array_equal(np.array(ones), np.array(plain.last_hidden_state))


def test_inputs_embeds_and_a_missing_mask_match_the_reference(case):
    """Embeddings given instead of looked up (forward, and the gradient on real tokens); one row without a mask."""
    rng, width = np.random.default_rng(3), case.reference.get_input_embeddings().embedding_dim
    given = torch.tensor(rng.normal(size=(*case.ids.shape, width)), dtype=torch.float32, requires_grad=True)
    probe = rng.normal(size=(*case.ids.shape, 32)) * case.mask[..., None]
    expected = case.reference(**torch_inputs(None, case.mask, case.types), inputs_embeds=given)
    (expected.last_hidden_state * torch.tensor(probe)).sum().backward()
    ours = functools.partial(encode, case.ours, None, case.mask, case.types)
    grad = mx.grad(lambda x: (ours(embeds=x).last_hidden_state * mx.array(probe)).sum())(mx.array(given.detach()))
    assert differences(ours(embeds=mx.array(given.detach())), expected)["last_hidden_state"] <= TOL
    assert np.abs(np.array(grad) - given.grad.numpy()).max() <= TOL
    first = [None if x is None else x[:1] for x in (case.ids, case.types)]  # the unpadded row
    with torch.no_grad():
        alone = case.reference(**torch_inputs(first[0], None, first[1]))
    assert differences(encode(case.ours, first[0], None, first[1]), alone)["last_hidden_state"] <= TOL


def weight_gradients(case, loss, recompute=False) -> dict[str, np.ndarray]:
    ours = load_ours(case.values, case.weights)
    set_recompute(ours, recompute)
    _, grads = nn.value_and_grad(ours, lambda m: loss(encode(m, case.ids, case.mask, case.types), mx.array))(ours)
    return {k: np.array(v) for k, v in tree_flatten(grads)}


def test_gradients_of_every_weight_match_the_reference_with_and_without_recompute_and_none_reach_padding(case):
    rng = np.random.default_rng(2)  # on real tokens, and the pooled output where the first token is one
    probe, pooled = rng.normal(size=(*case.ids.shape, 32)) * case.mask[..., None], rng.normal(size=(len(case.ids), 32))

    def loss(out, to):
        total, pooler = (out.last_hidden_state * to(probe)).sum(), getattr(out, "pooler_output", None)
        return total if pooler is None else total + (pooler * to(pooled * case.mask[:, :1])).sum()

    case.reference.zero_grad()
    loss(case.reference(**torch_inputs(case.ids, case.mask, case.types)), torch.tensor).backward()
    used = {k: p.grad for k, p in case.reference.named_parameters() if p.grad is not None}
    assert min(float(g.abs().max()) for g in used.values()) > 0  # the loss reaches every weight the reference uses
    expected = architecture(case.values["model_type"]).sanitize(
        {k: used.get(k, torch.zeros_like(p)).numpy() for k, p in case.reference.named_parameters()})
    grads = weight_gradients(case, loss)
    worst = {k: e for k, e in relative_errors(grads, expected).items() if e > TOL}
    assert set(grads) == set(expected) and not worst, worst
    recomputed = relative_errors(weight_gradients(case, loss, recompute=True), grads)
    assert max(recomputed.values()) <= 1e-5, max(recomputed, key=recomputed.get)
    # As torch's padding_idx in every reference, what padded positions give trains nothing in the padding row.
    grads = weight_gradients(case, lambda out, to: (out.last_hidden_state * to(1.0 - case.mask)[..., None]).sum())
    table = next(k for k, p in case.reference.named_parameters() if p is case.reference.get_input_embeddings().weight)
    row = grads[table][case.values.get("pad_token_id", 0)]
    assert np.abs(row).max() > 0 if table in case.arch.gaps else not row.any()  # a gap that closes fails here


def test_strict_loading_reports_missing_and_unexpected_keys_and_takes_task_checkpoints(case):
    name = sorted(case.weights)[len(case.weights) // 2]
    with pytest.raises(KbertError, match=rf"missing keys: {re.escape(name)}; unexpected keys: {re.escape(name)}s$"):
        load_ours(case.values, {f"{k}s" if k == name else k: v for k, v in case.weights.items()})
    if "pooler.dense.weight" in case.weights:  # sanitize keeps a pooler: a model built without one refuses it
        with pytest.raises(KbertError, match=r"unexpected keys: pooler\.dense\.bias, pooler\.dense\.weight$"):
            load_ours({**case.values, "add_pooling_layer": False}, case.weights)
    # A task model's checkpoint, with what older checkpoints kept, loads through sanitize into the bare encoder.
    task = reference_model(case.arch, case.arch.task, seed=3)
    ours = load_ours(case.values, {**task.state_dict(), **{k: torch.zeros(3) for k in case.arch.legacy}})
    with torch.no_grad():
        expected = getattr(task, task.base_model_prefix)(**torch_inputs(case.ids, case.mask, case.types))
    assert max(differences(encode(ours, case.ids, case.mask, case.types), expected).values()) <= TOL


@pytest.mark.parametrize(("name", "variant"), [pytest.param(a, v, marks=[pytest.mark.xfail(
    strict=True, reason=arch.gaps[v])] if v in arch.gaps else []) for a, arch in ARCHS.items() for v in arch.masked_lm])
def test_masked_lm_logits_match_the_reference(name, variant):
    arch = ARCHS[name]
    reference = reference_model(arch, "ForMaskedLM", arch.masked_lm[variant], seed=5)
    values, weights, (ids, mask, types) = reference.config.to_dict(), reference.state_dict(), batch(arch)
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, types)).logits.numpy()
    ours = load_ours(values, weights, masked_lm=True)
    logits = np.array(ours(mx.array(ids), mx.array(mask), None if types is None else mx.array(types)))
    real = mask.astype(bool)  # transformers' SDPA path leaves padded positions unspecified
    np.testing.assert_allclose(logits[real], expected[real], atol=TOL, rtol=0)
    encoder = load_ours(values, weights)  # the bare encoder from the same checkpoint, its head dropped
    assert np.array_equal(np.array(ours.logits(encode(encoder, ids, mask, types).last_hidden_state)), logits)
    head = max(k for k in weights if not k.startswith(f"{reference.base_model_prefix}.") and "decoder.w" not in k)
    with pytest.raises(KbertError, match=rf"missing keys: {re.escape(head)}; unexpected keys: {re.escape(head)}s$"):
        load_ours(values, {f"{k}s" if k == head else k: v for k, v in weights.items()}, masked_lm=True)


@pytest.mark.parametrize("name", list(ARCHS))
def test_configs_round_trip_and_presets_build_the_reference_parameter_names_and_shapes(name):
    registered = architecture(ARCHS[name].values["model_type"])
    for values in [ARCHS[name].values, *registered.presets.values()]:
        ours, config = build_encoder({**values, "model_type": registered.model_type})
        with torch.device("meta"):  # what kbert writes back builds the same model there
            cls, reference_config = reference_class(ARCHS[name], "Model", config.to_dict())
            expected = {k: tuple(v.shape) for k, v in registered.sanitize(cls(reference_config).state_dict()).items()}
        assert type(config).from_dict(config.to_dict()) == config
        assert expected == {k: tuple(v.shape) for k, v in tree_flatten(ours.parameters())}


BAD_CONFIGS = {  # what kbert refuses to build -> config.json values
    "hidden_size 32 is not divisible by num_attention_heads 5": {**V3, "num_attention_heads": 5},
    "conv_kernel_size 4 must be odd": {**V2, "conv_kernel_size": 4},
    "unsupported conv_act 'swish2'": {**V2, "conv_act": "swish2"},
    "unsupported hidden_act 'gelu_fast'": {**V3, "hidden_act": "gelu_fast"},
    "position_buckets 8, max_relative_positions 5": {**V3, "max_relative_positions": 5},
    "needs embedding_size == hidden_size": {**V2, "legacy": False},
    "dim_head 32 != hidden_size": {**ARCHS["neobert"].values, "dim_head": 32},
    "only the released NeoBERT architecture": {"model_type": "neobert", "rope": False},
    "rope_type 'linear' for full_attention is not supported": {"model_type": "modernbert", "rope_parameters": {
        "full_attention": {"rope_type": "linear", "rope_theta": 10.0, "factor": 2.0}}},
}


@pytest.mark.parametrize("message", list(BAD_CONFIGS))
def test_what_kbert_cannot_build_is_refused(message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_masked_lm(BAD_CONFIGS[message])


# Planted mistakes: each must fail the comparison that the checks above pass.


def swap_query_key(weights: dict, qk: tuple) -> dict:
    """Each layer's query and key projections trade places (in a fused q|k|v weight, their row blocks)."""
    a, b = qk
    if isinstance(b, str):
        return {k.replace(a, "\0").replace(b, a).replace("\0", b): v for k, v in weights.items()}
    return {k: v.reshape(b, 3, -1, v.shape[-1])[:, [1, 0, 2]].reshape(v.shape) if k.endswith(a) else v
            for k, v in weights.items()}


def floor_buckets(relative_pos, bucket_size, max_position):
    """DeBERTa's log buckets rounded down instead of up."""
    rel, mid = np.asarray(relative_pos, dtype=np.int64), bucket_size // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    log_pos = np.floor(np.log(abs_pos / mid) / np.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(abs_pos <= mid, rel, log_pos * np.sign(rel)).astype(np.int64)


def relative_bucket(case, mp):
    if case.values["position_buckets"] > 0:  # log buckets rounded the wrong way
        mp.setattr(deberta_v2, "make_log_bucket_position", floor_buckets)
    else:  # every relative position one bucket off
        right = deberta_v2.relative_indices
        mp.setattr(deberta_v2, "relative_indices", lambda n, buckets, most, span: right(n, buckets, most, span - 1))


def on_layers(attribute, value):
    """DeBERTa: each layer's attention with ``attribute`` set to ``value(attention)``."""
    def plant(case, mp):
        for layer in case.ours.encoder.layer:
            mp.setattr(layer.attention.self, attribute, value(layer.attention.self))
    return plant


def positions(offset):  # RoBERTa's position ids counted from ``offset``, padding or not
    return lambda case, mp: mp.setattr(roberta, "create_position_ids_from_input_ids", lambda ids, pad: (
        mx.broadcast_to(mx.arange(ids.shape[1]) + offset, ids.shape)))


GENERIC = ("layer-norm eps", "query and key swapped", "attention mask dropped")
MISTAKES = {  # name -> (case, monkeypatch) -> kbert's encoder with it, or None: the case's own, patched
    # another architecture's epsilon: RoBERTa's 1e-5 where the right one is smaller, else BERT's 1e-12
    "layer-norm eps": lambda c, mp: load_ours({**c.values, c.arch.eps: 1e-5 if c.values[c.arch.eps] < 1e-5 else 1e-12},
                                              c.weights),
    "query and key swapped": lambda c, mp: load_ours(c.values, swap_query_key(c.weights, c.arch.qk)),
    "attention mask dropped": lambda c, mp: mp.setattr(c, "mask", np.ones_like(c.mask)),  # on kbert's side only
    "relative bucket": relative_bucket,
    "no c2p": on_layers("c2p", lambda attention: False),
    "no p2c": on_layers("p2c", lambda attention: False),
    "scale without the relative terms": on_layers("scale", lambda attention: attention.head_dim ** -0.5),
    "key-only padding mask": lambda c, mp: mp.setattr(deberta_v2, "pairwise_padding_mask", lambda m, dtype: (
        (1 - m.astype(dtype)) * mx.finfo(dtype).min)[None, :, None, :]),  # padded queries then see real keys
    "RoPE left out": lambda c, mp: mp.setattr(mx.fast, "rope", lambda x, *args, **kwargs: x),
    "one relative bucket": lambda c, mp: mp.setattr(mpnet, "relative_buckets", lambda n: np.zeros((n, n), int)),
    "BERT's positions": positions(0),
    "positions count padding": positions(2),
}


@pytest.mark.parametrize(("case", "mistake"), [(a, m) for a, arch in ARCHS.items() for m in GENERIC + arch.mistakes],
                         indirect=["case"])
def test_planted_mistakes_are_caught(case, mistake, monkeypatch):
    forget = deberta_v2.relative_indices.cache_clear  # DeBERTa's relative positions, cached by sequence length
    forget()
    model = MISTAKES[mistake](case, monkeypatch) or case.ours
    worst = max(differences(encode(model, case.ids, case.mask, case.types), case.expected).values())
    forget()
    print(f"planted {case.name:11} {mistake:32} max |difference| {worst:.1e} > tolerance {TOL:.0e}")
    assert worst > TOL


# Quirks of one architecture each
DEBERTA, MODERNBERT = ARCHS["deberta-v3"], ARCHS["modernbert"]
NEOBERT_TINY = Path(__file__).parent / "data" / "neobert-tiny"  # the reference's own vectors; see its README.md


def test_roberta_position_ids_are_transformers_and_a_sequence_past_their_table_is_refused():
    ids, hf = np.array([[5, 6, 7, 1, 1], [1, 1, 8, 9, 10]]), transformers.models.roberta.modeling_roberta
    expected = hf.RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(ids), 1)
    ours = np.array(roberta.create_position_ids_from_input_ids(mx.array(ids), 1))
    assert ours.tolist() == expected.tolist() == [[2, 3, 4, 1, 1], [1, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="needs max_position_embeddings >= 41"):
        encode(prepared("roberta").ours, np.full((1, 39), 5))
    with pytest.raises(ValueError, match="model_type 'bert'"):  # XLM-R's is kept; another is refused
        roberta.RobertaConfig.from_dict({**ARCHS["roberta"].values, "model_type": "bert"})


def test_deberta_log_buckets_equal_transformers_at_released_sizes():
    hf = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
    for buckets, max_position, length in [(256, 512, 1100), (8, 64, 200), (64, 128, 400)]:
        query = torch.zeros(1, length, 1)
        expected = hf.build_relative_position(query, query, buckets, max_position)[0].numpy()
        assert np.array_equal(build_relative_position(length, length, buckets, max_position), expected)


def test_deberta_lm_predictions_head_matches_transformers_loaded_by_its_names():
    """``legacy: false``: the head's parameters carry transformers' names."""
    reference, (ids, mask, _) = reference_model(DEBERTA, "ForMaskedLM", {"legacy": False}, seed=5), batch(DEBERTA)
    ours, _ = build_masked_lm(reference.config.to_dict())
    load_state_strict(ours, {k: mx.array(v.numpy()) for k, v in reference.state_dict().items()}, "by name")
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask)).logits.numpy()
    assert np.abs(np.array(ours.eval()(mx.array(ids), mx.array(mask))) - expected).max() <= TOL


def test_deberta_recomputation_redraws_the_same_dropout_masks(monkeypatch):
    """Every dropout in a layer, the relative embeddings' too, draws from the recomputed layer's key."""
    ids, mask, _ = batch(DEBERTA)

    def grads(seed=5):
        mx.random.seed(0)
        model = build_encoder({**V3, "hidden_dropout_prob": 0.3, "attention_probs_dropout_prob": 0.3})[0]
        set_recompute(model.train(), True)
        mx.random.seed(seed)
        _, g = nn.value_and_grad(model, lambda m: encode(m, ids, mask).last_hidden_state.sum())(model)
        return {k: np.array(v) for k, v in tree_flatten(g)}

    recomputed = grads()
    monkeypatch.setattr(mx, "checkpoint", lambda fn: fn)  # the same code path, nothing recomputed
    kept, other_seed = grads(), grads(seed=6)
    assert max(np.abs(kept[k] - recomputed[k]).max() for k in kept) <= 1e-5
    assert max(np.abs(kept[k] - other_seed[k]).max() for k in kept) > 1e-4  # dropout is really on


def test_modernbert_local_layers_see_only_their_window():
    """Layer 0 global, without attention norm; 1 local (+-4 tokens): in two local layers a token sees 8 either side."""
    mixed = build_encoder(MODERNBERT.values)[0]
    assert [layer.is_local for layer in mixed.layers] == [False, True] and not mixed.layers[0].attn_norm.parameters()
    local = build_encoder({**MODERNBERT.values, "layer_types": ["sliding_attention"] * 2})[0].eval()
    ids = np.random.default_rng(0).integers(3, 99, (1, 24))
    changed = ids + (np.arange(24) == 12)
    delta = np.abs(np.array(encode(local, ids).last_hidden_state - encode(local, changed).last_hidden_state))[0]
    assert delta[:4].max() == delta[21:].max() == 0 and delta[4:21].max(-1).min() > 0


def test_modernbert_config_as_transformers_4_48_wrote_it_and_the_presets_read_as_transformers_does():
    """answerdotai/ModernBERT-base's config.json has flat rope and layer keys; transformers' defaults are its preset."""
    old = {**PRESETS["modernbert-base"], "num_hidden_layers": 5, "global_attn_every_n_layers": 2, "norm_bias": True,
           "global_rope_theta": 1000.0, "local_rope_theta": 20.0, "mlp_bias": True, "classifier_pooling": "mean"}
    pairs = [(old, old), (PRESETS["modernbert-base"], {}), *((values, values) for values in PRESETS.values())]
    for values, hf in ((values, transformers.ModernBertConfig(**given)) for values, given in pairs):
        ours = ModernBertConfig.from_dict(values)
        rope = {f"{kind}_rope_theta": hf.rope_parameters[f"{layers}_attention"]["rope_theta"]
                for kind, layers in (("global", "full"), ("local", "sliding"))}
        mine = {**ours.to_dict(), "layer_types": [ours.layer_type(i) for i in range(ours.num_hidden_layers)],
                "sliding_window": ours.sliding_window}
        shared = [name for name in mine if name in rope or hasattr(hf, name)]
        assert {n: mine[n] for n in shared} == {n: rope[n] if n in rope else getattr(hf, n) for n in shared}


def test_neobert_kbert_and_the_port_give_the_reference_vectors_and_kbert_reads_its_files():
    """On real tokens (padded ones are unspecified); and the reference's config, init and weight names."""
    values = json.loads((NEOBERT_TINY / "config.json").read_text())
    weights, inputs, expected = mx.load(str(NEOBERT_TINY / "model.safetensors")), *(
        np.load(NEOBERT_TINY / f"{name}.npz") for name in ("inputs", "expected"))
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    port = NeoBertPortModel(NeoBertPortConfig(**values))
    port.load_state_dict({k: torch.tensor(np.array(v)) for k, v in weights.items()})
    with torch.no_grad():
        ported = port(torch.tensor(ids, dtype=torch.long), torch.tensor(mask)).last_hidden_state.numpy()
    for hidden in (np.array(encode(load_ours(values, weights), ids, mask).last_hidden_state), ported):
        assert np.abs(hidden - expected["last_hidden_state"])[mask.astype(bool)].max() <= TOL  # so mean_pooled too
    config, base = NeoBertConfig.from_dict(values), NeoBertConfig.from_dict(architecture("neobert").presets["neobert"])
    assert (base.ffn_inner_size, base.norm_eps, base.max_length) == (2048, 1e-5, 4096)
    with pytest.raises(ValueError, match="max_length"):
        encode(NeoBertModel(config), np.zeros((1, 65), dtype=np.int32))
    model = NeoBertModel(config)  # a fresh one, initialised as the reference initialises
    assert float(mx.abs(model.encoder.weight).max()) <= config.embedding_init_range
    assert float(mx.abs(model.transformer_encoder[0].qkv.weight).max()) <= config.decoder_init_range
    assert np.array_equal(np.array(model.layer_norm.weight), np.ones(config.hidden_size, dtype=np.float32))
    split = {}  # later reference versions store the SwiGLU input projection as w1 (gate) and w2 (up)
    for name, value in weights.items():
        halves = mx.split(value, 2, axis=0) if name.endswith("ffn.w12.weight") else None
        split.update({name.replace("w12", f"w{i}"): halves[i - 1] for i in (1, 2)} if halves else {name: value})
    restored = sanitize({f"model.{k}": v for k, v in split.items()})
    assert set(restored) == set(weights) and all(np.array_equal(restored[k], v) for k, v in weights.items())


def test_neobert_rope_matches_the_reference_float32_table_to_max_length():
    """Adjacent-pair rotation with the reference's float32 angles t * (1 / 10000 ** (2i / d)), to position 4095."""
    d, length = 16, 4096
    x = np.random.default_rng(0).standard_normal((1, 2, length, d)).astype(np.float32)
    inv_freq = np.float32(1.0) / np.float32(10000.0) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    angle = (np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    x0, x1 = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    want = np.stack([x0 * np.cos(angle) - x1 * np.sin(angle), x0 * np.sin(angle) + x1 * np.cos(angle)], -1)
    assert np.abs(np.array(apply_rope(mx.array(x))) - want.reshape(x.shape)).max() < 1e-5
    neox = np.array(mx.fast.rope(mx.array(x), d, traditional=False, base=10000.0, scale=1.0, offset=0))
    assert np.abs(neox - want.reshape(x.shape)).max() > 1e-2  # the half-split (NeoX) layout is another function


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_recomputed_layers_train_with_the_same_dropout_masks_as_plain_ones(name):
    """--gradient-checkpointing trades memory for time and changes no result: in training each block draws its
    dropout masks from its own key, with or without recomputation (a recomputed block drew other masks than a
    plain one, so a run's results changed with the setting)."""
    from kbert.models.recompute import Dropout
    from kbert.models.task_model import build_task_model

    ids, mask, _ = batch(ARCHS[name])
    mx.random.seed(0)
    model = build_task_model(ARCHS[name].values, "binary", "cls", 0.0)
    dropouts = [module for module in model.modules() if isinstance(module, Dropout)]  # (NeoBERT has none)
    for module in dropouts:
        module.p = 0.2
    model.train()

    def gradients(recompute: bool, seed: int = 5) -> tuple[float, dict]:
        set_recompute(model.encoder, recompute)
        mx.random.seed(seed)
        loss, grads = nn.value_and_grad(model, lambda m: (m(mx.array(ids.astype(np.int32)), mx.array(mask)) ** 2)
                                        .sum())(model)
        return loss.item(), {k: np.array(v) for k, v in tree_flatten(grads)}

    (plain_loss, plain), (recomputed_loss, recomputed) = gradients(False), gradients(True)
    assert plain_loss == recomputed_loss
    for key in plain:  # (recomputation may sum a gradient in another order: DeBERTa-v2's differ by ulps)
        np.testing.assert_allclose(recomputed[key], plain[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert not dropouts or gradients(False, seed=6)[0] != plain_loss  # the masks change with the seed
