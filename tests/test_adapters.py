"""Adapters (models/adapters.py): unchanged output at initialisation, only adapter weights train, merging,
QLoRA, checkpoints, and the forward pass, merge and DoRA gradients against PEFT."""

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.adapters import (ADAPTER_WEIGHTS_FILE, AdapterConfig, LoRALinear, apply_adapters, dense_weight,
                                   load_adapter_weights, merge_adapters, read_adapter_config, resolve_adapter,
                                   row_norms, save_adapters)
from kbert.models.task_model import build_task_model
from kbert.pipeline.train import make_train_step

ENCODERS = {
    "bert": {"model_type": "bert", "vocab_size": 60, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 32},
    "modernbert": {"model_type": "modernbert", "vocab_size": 60, "hidden_size": 64, "num_hidden_layers": 3,
                   "num_attention_heads": 4, "intermediate_size": 128, "global_attn_every_n_layers": 2,
                   "local_attention": 4, "pad_token_id": 0},
    "neobert": {"model_type": "neobert", "vocab_size": 60, "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 144},  # SwiGLU inner width 96
}
KINDS = ["lora", "rslora", "dora"]


def tiny_model(family, seed=0, task="binary", pooling="mean"):
    mx.random.seed(seed)
    model = build_task_model(ENCODERS[family], task, pooling)
    model.eval()
    return model


def batch(seed=1, n=4, length=12):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, 60, size=(n, length)).astype(np.int32)
    mask = np.ones((n, length), dtype=np.int32)
    mask[1, 8:] = 0  # padding in one row
    ids[1, 8:] = 0
    return mx.array(ids), mx.array(mask)


def params(model):
    return {k: np.array(v) for k, v in tree_flatten(model.parameters())}


def trained(model, steps=3, seed=0, lr=1e-2):
    """A few compiled AdamW steps (weight decay on) on random targets."""
    ids, mask = batch()
    targets = mx.array(np.random.default_rng(seed).integers(0, 2, size=ids.shape[0]).astype(np.float32))
    optimizer = optim.AdamW(learning_rate=lr, weight_decay=0.01)
    step = make_train_step(model, optimizer, max_grad_norm=1.0)
    for _ in range(steps):
        loss = step(ids, mask, targets)
        mx.eval(loss, model.parameters(), optimizer.state)
    model.eval()
    return model


@pytest.mark.parametrize("family", list(ENCODERS))
@pytest.mark.parametrize("kind", KINDS)
def test_output_is_unchanged_at_initialisation(family, kind):
    model = tiny_model(family)
    ids, mask = batch()
    before = np.array(model(ids, mask))
    report = apply_adapters(model, resolve_adapter(kind))
    after = np.array(model(ids, mask))
    assert len(report.injected) > 0
    assert np.abs(after - before).max() <= 1e-6


@pytest.mark.parametrize("family", list(ENCODERS))
def test_default_targets_cover_every_linear_layer_of_the_blocks(family):
    model = tiny_model(family)
    report = apply_adapters(model, resolve_adapter("balanced"))
    layers = ENCODERS[family]["num_hidden_layers"]
    per_layer = {"bert": 6, "modernbert": 4, "neobert": 4}[family]
    assert len(report.injected) == layers * per_layer
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == layers * per_layer
    assert report.saved_modules == ["head"]  # cls pooling, no fusion: nothing else holds weights (it named them)
    assert apply_adapters(tiny_model(family, pooling="attention"),
                          resolve_adapter("balanced")).saved_modules == ["head", "pooler"]


def test_settings_that_would_change_nothing_are_refused():
    """Targets that name no layer, quantization settings without a quantized base, a rank or alpha pattern that
    finds no adapted layer, and the encoder's own pooler (kbert's heads never read it: its adapter stays 0) were
    accepted, and the run trained as without them."""
    from kbert.models.adapters import check_layer_patterns

    with pytest.raises(KbertError, match="^adapter targets ' , ' name no layer"):
        resolve_adapter("lora", {"targets": " , "})
    for key, value in (("group_size", 32), ("quantize_embeddings", True)):
        with pytest.raises(KbertError, match=f"^adapter setting {key} acts only with a quantized base"):
            resolve_adapter("lora", {key: value})
    for kind in ("lora", "qlora"):  # a merged checkpoint always dequantizes: false never acted
        with pytest.raises(KbertError, match="^adapter setting merge_dequantize false: "):
            resolve_adapter(kind, {"merge_dequantize": False})
    assert resolve_adapter("qlora", {"group_size": 32}).group_size == 32
    config = resolve_adapter("lora", {"rank_pattern": {"nomatch": 4}})
    report = apply_adapters(tiny_model("bert"), config)
    with pytest.raises(KbertError, match="^adapter rank_pattern 'nomatch' matches none of the 12 adapted layers"):
        check_layer_patterns(config, report.injected)
    check_layer_patterns(resolve_adapter("lora", {"alpha_pattern": {r"layer\.0\.": 4}}), report.injected)
    with pytest.raises(KbertError, match="^adapter target 'pooler.dense' matches no linear layer"):
        apply_adapters(tiny_model("bert"), resolve_adapter("lora", {"targets": "pooler.dense"}))


@pytest.mark.parametrize("family", list(ENCODERS))
@pytest.mark.parametrize("kind", KINDS + ["qlora"])
def test_training_changes_only_adapters_and_saved_modules(family, kind):
    """Every parameter is compared before and after: the changed ones are exactly the reported trainable ones."""
    model = tiny_model(family, pooling="attention")
    config = resolve_adapter(kind, {"group_size": 32} if kind == "qlora" else {})
    report = apply_adapters(model, config)
    before = params(model)
    trained(model)
    after = params(model)
    assert set(before) == set(after)
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    expected = {k for k, _ in tree_flatten(model.trainable_parameters())}
    assert changed == expected
    assert all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b", "magnitude") or k.startswith(("head.", "pooler."))
               for k in changed)
    assert sum(before[k].size for k in changed) == report.trainable
    assert report.trainable < report.total


def test_injection_is_counted_and_patterns_must_match():
    model = tiny_model("bert")
    config = AdapterConfig(rank=4, targets="query,value", modules_to_save="head")
    report = apply_adapters(model, config)
    hidden, layers = 64, 2
    assert sorted(report.injected) == [f"encoder.layer.{i}.attention.self.{n}" for i in range(layers)
                                       for n in ("query", "value")]
    assert report.trainable == layers * 2 * (4 * hidden + hidden * 4) + (hidden + 1)  # adapters + head
    assert report.trainable == sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    with pytest.raises(KbertError, match="adapter target 'qkv' matches no linear layer"):
        apply_adapters(tiny_model("bert"), AdapterConfig(targets="query,qkv"))
    with pytest.raises(KbertError, match="modules_to_save 'classifier_norm' matches no module"):
        apply_adapters(tiny_model("bert"), AdapterConfig(modules_to_save="head,classifier_norm"))
    with pytest.raises(KbertError, match="unknown adapter 'lorra'"):
        resolve_adapter("lorra")


@pytest.mark.parametrize("family, pattern, expected", [
    ("bert", "attention.*", 8), ("modernbert", "mlp.*", 6), ("modernbert", "Wqkv,Wo,Wi", 12), ("modernbert", "attn.Wo", 3),
    ("neobert", "ffn.*", 4),
])
def test_glob_patterns_select_module_groups(family, pattern, expected):
    report = apply_adapters(tiny_model(family), AdapterConfig(targets=pattern))
    assert len(report.injected) == expected


def test_ranks_per_layer_and_saved_norms():
    model = tiny_model("bert")
    config = AdapterConfig(rank=4, rank_pattern={r"layer\.1\.": 16}, alpha_pattern={r"layer\.1\.": 32.0},
                           modules_to_save="head,pooler,LayerNorm")
    report = apply_adapters(model, config)
    assert {name: rank for name, rank in report.injected.items() if ".layer.1." in name} == {
        name: 16 for name in report.injected if ".layer.1." in name}
    assert all(rank == 4 for name, rank in report.injected.items() if ".layer.0." in name)
    layer1 = model.encoder.encoder.layer[1].attention.self.query
    assert layer1.lora_a.shape == (16, 64) and layer1.scale == 2.0
    trainable = {k for k, _ in tree_flatten(model.trainable_parameters())}
    assert "encoder.embeddings.LayerNorm.weight" in trainable and "encoder.encoder.layer.0.output.LayerNorm.bias" in trainable
    assert "encoder.embeddings.word_embeddings.weight" not in trainable


def test_rslora_scales_by_the_square_root_of_the_rank():
    linear = nn.Linear(8, 4)
    assert LoRALinear(linear, rank=16, alpha=8.0).scale == 0.5
    assert LoRALinear(linear, rank=16, alpha=8.0, rslora=True).scale == 2.0


@pytest.mark.parametrize("family", list(ENCODERS))
@pytest.mark.parametrize("kind", ["lora", "dora", "rslora"])
def test_merged_model_matches_the_adapter_model(family, kind):
    model = tiny_model(family)
    apply_adapters(model, resolve_adapter(kind))
    trained(model, steps=4, lr=2e-3)
    ids, mask = batch(seed=5)
    adapted_hidden, adapted_logits = np.array(model.encoder(ids, mask).last_hidden_state), np.array(model(ids, mask))
    base_hidden = np.array(tiny_model(family).encoder(ids, mask).last_hidden_state)
    assert np.abs(adapted_hidden - base_hidden).max() > 1e-3  # the adapters moved the output
    merged = merge_adapters(model)
    assert merged > 0 and not any(isinstance(m, LoRALinear) for m in model.modules())
    assert np.abs(np.array(model.encoder(ids, mask).last_hidden_state) - adapted_hidden).max() <= 1e-5
    assert np.abs(np.array(model(ids, mask)) - adapted_logits).max() <= 1e-5
    # The merged model is an ordinary model again: the same names as the base, nothing extra.
    assert set(params(model)) == set(params(tiny_model(family)))


def test_qlora_quantizes_the_base_and_merges_to_its_dequantized_equivalent():
    model = tiny_model("bert")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".layer." in n}
    dense_bytes = sum(m.weight.nbytes for m in linears.values())
    config = resolve_adapter("qlora", {"group_size": 32})
    apply_adapters(model, config)
    layer = model.encoder.encoder.layer[0].attention.self.query
    assert isinstance(layer.base, nn.QuantizedLinear) and layer.base.bits == 4
    assert not any(isinstance(m, nn.Linear) for m in model.encoder.encoder.modules())  # no float copy kept
    bases = [m.base for m in model.modules() if isinstance(m, LoRALinear)]
    quantized_bytes = sum(b.weight.nbytes + b.scales.nbytes + b.biases.nbytes for b in bases)
    assert len(bases) == len(linears) and quantized_bytes <= 0.19 * dense_bytes  # 4 bits + 2 x 32 bits per 32
    trained(model, steps=4)
    ids, mask = batch(seed=5)
    adapted = np.array(model(ids, mask))

    # The dequantized equivalent: the same adapters on plain Linear layers holding the dequantized weights.
    equivalent = tiny_model("bert")
    apply_adapters(equivalent, AdapterConfig(**{**config.to_dict(), "bits": 0}))
    twins = dict(equivalent.named_modules())
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            twins[name].base.weight = dense_weight(module.base)
            twins[name].lora_a, twins[name].lora_b = module.lora_a, module.lora_b
        elif isinstance(module, nn.QuantizedEmbedding):  # the token table is quantized too
            twins[name].weight = dense_weight(module)
    equivalent.update(dict(head=model.head.parameters(), pooler=model.pooler.parameters()))
    assert np.abs(np.array(equivalent(ids, mask)) - adapted).max() <= 1e-5

    kept = merge_adapters(model, dequantize=False)  # kept separate: nothing to fold
    assert kept == 0 and isinstance(model.encoder.encoder.layer[0].attention.self.query, LoRALinear)
    assert merge_adapters(model, dequantize=True) == 12
    assert np.abs(np.array(model(ids, mask)) - adapted).max() <= 1e-5


def test_qlora_8bit_and_group_size_checks():
    model = tiny_model("bert")
    apply_adapters(model, resolve_adapter("qlora", {"bits": 8, "group_size": 64}))
    assert model.encoder.encoder.layer[0].output.dense.base.bits == 8
    with pytest.raises(KbertError, match="not a multiple of group_size 128"):
        apply_adapters(tiny_model("bert"), resolve_adapter("qlora", {"group_size": 128}))
    with pytest.raises(KbertError, match="bits must be 0"):
        resolve_adapter("qlora", {"bits": 3})
    with pytest.raises(KbertError, match="^adapter group_size must be 32, 64 or 128, got 2$"):  # (MLX's quantize's)
        resolve_adapter("qlora", {"group_size": 2})


@pytest.mark.parametrize("options, message", [
    ({"targets": 5}, "adapter setting targets must be text, got 5"),
    ({"rank_pattern": 5}, "adapter setting rank_pattern must be a mapping of layer patterns to integers, got 5"),
    ({"alpha_pattern": {"query": "x"}},
     "adapter setting alpha_pattern must be a mapping of layer patterns to finite numbers, got {'query': 'x'}"),
    ({"rslora": "no"}, "adapter setting rslora must be true or false, got 'no'"),  # (a truthy string: rsLoRA on)
    ({"rank": 4.5}, "adapter setting rank must be an integer, got 4.5"),
    ({"rank_pattern": {"(": 4}},  # (re.error in the first fold, and a run folder left)
     "adapter rank_pattern '(' is not a regular expression: missing ), unterminated subpattern at position 0"),
    ({"alpha_pattern": {"query": -16.0}}, "adapter alpha_pattern values must be above 0, got {'query': -16.0}"),
])
def test_adapter_settings_of_the_wrong_type_are_refused_in_one_line(options, message):
    with pytest.raises(KbertError) as error:
        resolve_adapter("lora", options)
    assert str(error.value) == message


def test_adapter_targets_may_be_a_yaml_list():
    assert resolve_adapter("lora", {"targets": ["query", "value"]}).targets == "query,value"


@pytest.mark.parametrize("kind", ["dora", "qlora"])
def test_adapter_checkpoint_round_trip(tmp_path, kind):
    overrides = {"group_size": 32} if kind == "qlora" else {}
    config = resolve_adapter(kind, overrides)
    model = tiny_model("modernbert")
    apply_adapters(model, config)
    trained(model)
    save_adapters(model, tmp_path, config, base="tiny-modernbert", base_fingerprint="abc")
    saved = mx.load(str(tmp_path / ADAPTER_WEIGHTS_FILE))
    assert set(saved) == {k for k, _ in tree_flatten(model.trainable_parameters())}
    assert read_adapter_config(tmp_path)["base_encoder"] == "tiny-modernbert"

    fresh = tiny_model("modernbert")  # the same base weights (same seed), fresh adapters
    apply_adapters(fresh, AdapterConfig.from_dict(read_adapter_config(tmp_path)["adapter"]))
    load_adapter_weights(fresh, tmp_path)
    ids, mask = batch()
    assert np.array_equal(np.array(fresh(ids, mask)), np.array(model(ids, mask)))

    other_rank = tiny_model("modernbert")
    apply_adapters(other_rank, resolve_adapter(kind, {"rank": 4, **overrides}))
    with pytest.raises(KbertError, match="adapter weight shapes do not match"):
        load_adapter_weights(other_rank, tmp_path)
    no_dora = tiny_model("modernbert")
    apply_adapters(no_dora, resolve_adapter("lora", {"bits": config.bits, **overrides}))
    if kind == "dora":
        with pytest.raises(KbertError, match="unexpected keys: .*magnitude"):
            load_adapter_weights(no_dora, tmp_path)
    (tmp_path / ADAPTER_WEIGHTS_FILE).write_bytes((tmp_path / ADAPTER_WEIGHTS_FILE).read_bytes()[:100])
    with pytest.raises(KbertError, match="not a readable safetensors file"):
        load_adapter_weights(fresh, tmp_path)


# ---- against PEFT ---------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")


class Wrapper(torch.nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.proj = linear

    def forward(self, x):
        return self.proj(x)


def peft_pair(kind, rank=4, alpha=8.0, in_dims=24, out_dims=16, seed=0):
    """A torch Linear under PEFT and our LoRALinear holding identical base and adapter weights (B != 0)."""
    torch.manual_seed(seed)
    base = torch.nn.Linear(in_dims, out_dims)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=["proj"], lora_dropout=0.0,
                             use_rslora=kind == "rslora", use_dora=kind == "dora")
    reference = peft.get_peft_model(Wrapper(base), config)
    layer = reference.base_model.model.proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(0, 0.3)  # as after training: the update is not zero
        if kind == "dora":
            layer.lora_magnitude_vector["default"].weight.mul_(torch.linspace(0.8, 1.2, out_dims))
    ours_base = nn.Linear(in_dims, out_dims)
    ours_base.weight = mx.array(base.weight.detach().numpy())
    ours_base.bias = mx.array(base.bias.detach().numpy())
    ours = LoRALinear(ours_base, rank, alpha, rslora=kind == "rslora", dora=kind == "dora")
    ours.lora_a = mx.array(layer.lora_A["default"].weight.detach().numpy())
    ours.lora_b = mx.array(layer.lora_B["default"].weight.detach().numpy())
    if kind == "dora":
        ours.magnitude = mx.array(layer.lora_magnitude_vector["default"].weight.detach().numpy())
    reference.eval()
    ours.eval()
    return reference, ours


@pytest.mark.parametrize("kind", KINDS)
def test_forward_and_merge_match_peft(kind):
    reference, ours = peft_pair(kind)
    x = np.random.default_rng(0).normal(size=(5, 7, 24)).astype(np.float32)
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    assert np.abs(np.array(ours(mx.array(x))) - expected).max() <= 1e-5
    assert np.abs(expected - np.array(ours.base(mx.array(x)))).max() > 1e-2  # the adapter really contributes
    merged = reference.merge_and_unload().proj
    assert np.abs(np.array(ours.merged().weight) - merged.weight.detach().numpy()).max() <= 1e-5
    assert np.abs(np.array(ours.merged()(mx.array(x))) - expected).max() <= 1e-5


def test_peft_initialisation_matches_ours():
    """PEFT also starts from B = 0 and m = ||W|| per output row, and A within the Kaiming bound 1/sqrt(in)."""
    torch.manual_seed(0)
    base = torch.nn.Linear(24, 16)
    reference = peft.get_peft_model(Wrapper(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["proj"],
                                                                   use_dora=True))
    layer = reference.base_model.model.proj
    ours_base = nn.Linear(24, 16)
    ours_base.weight = mx.array(base.weight.detach().numpy())
    ours = LoRALinear(ours_base, 4, 8.0, dora=True)
    assert np.allclose(np.array(ours.magnitude), layer.lora_magnitude_vector["default"].weight.detach().numpy(),
                       atol=1e-6)
    assert not np.array(ours.lora_b).any() and not layer.lora_B["default"].weight.detach().numpy().any()
    bound = 1 / np.sqrt(24)
    assert np.abs(np.array(ours.lora_a)).max() <= bound
    assert np.abs(layer.lora_A["default"].weight.detach().numpy()).max() <= bound


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_peft(kind):
    """DoRA's weight norm is not differentiated (PEFT detaches it): the gradients agree with PEFT's."""
    reference, ours = peft_pair(kind)
    x = np.random.default_rng(1).normal(size=(6, 24)).astype(np.float32)
    weights = np.random.default_rng(2).normal(size=(6, 16)).astype(np.float32)
    layer = reference.base_model.model.proj
    (reference(torch.from_numpy(x)) * torch.from_numpy(weights)).sum().backward()
    ours.freeze()
    ours.unfreeze(recurse=False, keys=["lora_a", "lora_b"] + (["magnitude"] if kind == "dora" else []))
    grads = nn.value_and_grad(ours, lambda m, v: (m(v) * mx.array(weights)).sum())(ours, mx.array(x))[1]
    pairs = [("lora_a", layer.lora_A["default"].weight), ("lora_b", layer.lora_B["default"].weight)]
    if kind == "dora":
        pairs.append(("magnitude", layer.lora_magnitude_vector["default"].weight))
    for name, tensor in pairs:
        assert np.abs(np.array(grads[name]) - tensor.grad.numpy()).max() <= 1e-4, name


# ---- in the pipeline ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_with_adapters_saves_adapter_only_folds_that_reload(tmp_path):
    """`kbert run --encoder FOLDER --adapter dora`: adapter-only fold checkpoints reload onto the base and give
    the same outputs as the same run saved merged."""
    from kbert.models.checkpoints import load_checkpoint
    from tests.test_cli import SMOKE, kbert
    from tests.test_pretrained import random_reference, tiny_tokenizer_folder

    folder = tmp_path / "base"
    folder.mkdir()
    random_reference("bert", tiny_tokenizer_folder(folder).get_vocab_size()).save_pretrained(folder)
    common = ["run", "titanic", "--encoder", str(folder), "--max-length", "64", *SMOKE, "--out", "runs",
              "--adapter", "dora", "--lora-rank", "4"]
    adapter_run = kbert(*common, "--run-id", "adapter", cwd=tmp_path)
    assert adapter_run.returncode == 0, adapter_run.stderr
    assert "+ dora adapters" in adapter_run.stdout and "adapters on 12 layers (rank 4)" in adapter_run.stdout
    merged_run = kbert(*common, "--run-id", "merged", "--adapter-checkpoint", "merged", cwd=tmp_path)
    assert merged_run.returncode == 0, merged_run.stderr
    assert adapter_run.stdout.split("CV ")[1].split("\n")[0] == merged_run.stdout.split("CV ")[1].split("\n")[0]

    adapter_fold = tmp_path / "runs" / "titanic" / "adapter" / "folds" / "0"
    merged_fold = tmp_path / "runs" / "titanic" / "merged" / "folds" / "0"
    assert (adapter_fold / "adapter.safetensors").is_file() and not (adapter_fold / "model.safetensors").exists()
    assert (adapter_fold / "adapter.safetensors").stat().st_size < 0.3 * (merged_fold / "model.safetensors").stat().st_size
    from_adapter, _ = load_checkpoint(adapter_fold)
    from_merged, _ = load_checkpoint(merged_fold)
    assert any(isinstance(m, LoRALinear) for m in from_adapter.modules())
    assert not any(isinstance(m, LoRALinear) for m in from_merged.modules())
    ids = mx.array(np.random.default_rng(0).integers(5, 40, size=(3, 16)).astype(np.int32))
    mask = mx.ones(ids.shape, dtype=mx.int32)
    assert np.abs(np.array(from_adapter(ids, mask)) - np.array(from_merged(ids, mask))).max() <= 1e-5

    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(KbertError, match="trained on another version of the base encoder"):
        load_checkpoint(adapter_fold)


def test_adapter_settings_are_checked_when_the_run_is_configured(titanic):
    from kbert.pipeline.config import resolve_run_config

    config = resolve_run_config(titanic, {"encoder": "minilm-l6", "adapter": "balanced",
                                          "adapter_options": {"rank": 16}})
    assert config.train.learning_rate == 5e-4 and config.model.adapter_options == {"rank": 16}
    with pytest.raises(KbertError, match="needs a pretrained encoder"):
        resolve_run_config(titanic, {"adapter": "balanced"})
    with pytest.raises(KbertError, match="unknown adapter setting"):
        resolve_run_config(titanic, {"encoder": "minilm-l6", "adapter": "lora", "adapter_options": {"rnak": 4}})
    with pytest.raises(KbertError, match="given without an adapter"):
        resolve_run_config(titanic, {"encoder": "minilm-l6", "adapter_options": {"rank": 4}})


def test_quantized_base_on_cpu_matches_quantized_matmul():
    """On a CPU the quantized base is dequantized for a BLAS matmul; the result is quantized_matmul's."""
    mx.random.seed(0)
    layer = LoRALinear(nn.QuantizedLinear.from_linear(nn.Linear(128, 96), group_size=64, bits=4), rank=4, alpha=8.0)
    x = mx.random.normal((3, 5, 128))
    assert np.abs(np.array(layer.base_output(x)) - np.array(layer.base(x))).max() <= 1e-5


def test_qlora_quantizes_the_token_table_and_merge_restores_a_plain_model():
    model = tiny_model("neobert")
    config = resolve_adapter("qlora_memory", {"group_size": 32})
    assert config.gradient_checkpointing and config.quantize_embeddings
    apply_adapters(model, config)
    assert isinstance(model.encoder.encoder, nn.QuantizedEmbedding) and model.encoder.recompute_layers
    trained(model, steps=2)
    ids, mask = batch()
    adapted = np.array(model(ids, mask))
    merge_adapters(model)
    assert isinstance(model.encoder.encoder, nn.Embedding)
    assert set(params(model)) == set(params(tiny_model("neobert")))
    assert np.abs(np.array(model(ids, mask)) - adapted).max() <= 1e-5


def test_dora_on_a_quantized_base():
    """QDoRA: the magnitude starts at the dequantized weight's row norms, so the output at initialisation is
    the quantized base's; training and merging work as for DoRA."""
    model = tiny_model("bert")
    config = resolve_adapter("dora", {"bits": 4, "group_size": 32, "quantize_embeddings": False})
    apply_adapters(model, config)
    ids, mask = batch()
    layer = model.encoder.encoder.layer[0].attention.self.query
    x = mx.random.normal((2, 3, 64))
    assert np.abs(np.array(layer(x)) - np.array(layer.base(x))).max() <= 1e-5
    trained(model, steps=3, lr=2e-3)
    assert np.abs(np.array(layer.magnitude) - np.array(row_norms(dense_weight(layer.base)))).max() > 0
    adapted = np.array(model(ids, mask))
    merge_adapters(model)
    assert np.abs(np.array(model(ids, mask)) - adapted).max() <= 1e-5


@pytest.mark.parametrize("encoder, targets, adapted", [
    ({"model_type": "bert"}, "query-value", {"query", "value"}),
    ({"model_type": "bert"}, "attention", {"query", "key", "value"}),
    ({"model_type": "modernbert"}, "query-value", {"Wqkv"}),
    ({"model_type": "neobert", "max_length": 32}, "attention", {"qkv"}),
])
def test_named_target_sets_use_each_architectures_own_projection_names(encoder, targets, adapted):
    from kbert.models.task_model import build_task_model

    values = {**encoder, "vocab_size": 40, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "max_position_embeddings": 32}
    model = build_task_model(values, "binary", "cls")
    apply_adapters(model, AdapterConfig(rank=2, targets=targets))
    names = {name.rsplit(".", 1)[-1] for name, module in model.encoder.named_modules() if isinstance(module, LoRALinear)}
    assert names == adapted
