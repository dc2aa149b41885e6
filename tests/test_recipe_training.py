"""The Kaggle recipe's training parts in pipeline/train.py, each against its definition: the weight EMA, FGM and AWP
on the word embeddings (compiled and eager, plain and accumulated steps, with adapters), the mean of the best
epochs' weights; the settings' refusals; a run with all three resumes to the same files."""

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
import yaml
from mlx.utils import tree_flatten, tree_unflatten

from kbert.errors import KbertError
from kbert.io import read_json
from kbert.models.adapters import AdapterConfig, apply_adapters
from kbert.models.architecture import ARCHITECTURES
from kbert.models.task_model import build_task_model
from kbert.pipeline import fold
from kbert.pipeline.config import TrainConfig, resolve_run_config
from kbert.pipeline.streams import cpu_streams
from kbert.pipeline.train import (Adversary, Execution, FoldData, Progress, Validation, at, loss_fn, make_adversary,
                                  make_grad_step, make_train_step, make_update, pad_batch, predict_outputs, train_fold,
                                  word_embedding_path)
from tests.tiny import run_tiny

TINY = {"model_type": "bert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 32, "add_pooling_layer": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
TABLE = "encoder.embeddings.word_embeddings.weight"


def tiny_model(adapters: bool = False, seed: int = 0):
    mx.random.seed(seed)
    model = build_task_model(TINY, "binary", "cls", 0.0)
    if adapters:
        apply_adapters(model, AdapterConfig(rank=2))
    return model


def tokens(rows: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 50, rng.integers(3, 13)).astype(np.int32) for _ in range(rows)]


def batch(seed: int = 0, rows: int = 8):
    ids, mask = pad_batch(tokens(rows, seed), length_bucket=4)
    return ids, mask, mx.array(np.random.default_rng(seed).integers(0, 2, rows).astype(np.float32))


def flat(tree) -> dict[str, np.ndarray]:
    return {name: np.array(value) for name, value in tree_flatten(tree)}


def assert_trees_close(actual: dict, expected: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


# ---- train_fold on a tiny fold: 8 training rows in one batch, so each epoch is one optimizer step

def fold_data() -> FoldData:
    targets = np.random.default_rng(1).integers(0, 2, 8).astype(np.float32)
    return FoldData(tokens(8, 1), targets, tokens(6, 2), np.array([0, 1] * 3, dtype=np.float32), tokens(4, 3))


def config(**changes) -> TrainConfig:
    return TrainConfig(**{"epochs": 4, "batch_size": 8, "eval_batch_size": 8, "learning_rate": 1e-2,
                          "warmup_ratio": 0.0, "patience": 10, "max_length": 16, "cpu_streams": 1, **changes})


def scripted(model, scores: list[float]) -> tuple[Validation, list[dict]]:
    """A validation whose i-th call scores ``scores[i]`` and keeps the model's trainable weights as they were."""
    seen = []

    def evaluate(outputs):
        seen.append(flat(model.trainable_parameters()))
        return scores[len(seen) - 1]

    return Validation(evaluate, greater_is_better=True), seen


def train(model, scores: list[float], **changes):
    validation, seen = scripted(model, scores)
    result = train_fold(model, fold_data(), config(**changes), validation, seed=0, progress=Progress(bar=False))
    return result, seen


@pytest.mark.parametrize("compiled", [True, False])
def test_the_ema_is_the_moving_average_of_the_weights_after_each_step_and_the_model_ends_with_the_best(compiled):
    """EMA off, the scripted validation sees the training weights after each step; on, with the same seed, it sees
    e_t = d e_(t-1) + (1 - d) theta_t from e_0 = the initial weights, and the model ends with the best epoch's."""
    decay = 0.6
    model = tiny_model()
    initial = flat(model.trainable_parameters())
    _, raw = train(model, [0.0] * 4, compile=compiled)
    assert not np.array_equal(raw[-1][TABLE], initial[TABLE])  # the weights moved
    model = tiny_model()
    result, seen = train(model, [0.1, 0.3, 0.2, 0.0], ema=decay, compile=compiled)
    expected = initial
    for after_step, judged in zip(raw, seen, strict=True):
        expected = {name: decay * expected[name] + (1 - decay) * after_step[name] for name in expected}
        assert_trees_close(judged, expected)
    assert result.best_epoch == 1
    assert_trees_close(flat(model.trainable_parameters()), seen[1], rtol=0, atol=0)


@pytest.mark.parametrize("ema", [0.0, 0.5])
@pytest.mark.parametrize("adapters", [False, True])
def test_average_best_ends_with_the_mean_of_the_best_epochs_weights(ema, adapters):
    model = tiny_model(adapters)
    frozen = {name: value for name, value in flat(model.parameters()).items()
              if name not in flat(model.trainable_parameters())}
    result, seen = train(model, [0.1, 0.5, 0.3, 0.9, 0.2, 0.42], epochs=5, average_best=3, ema=ema)
    assert result.averaged_epochs == [1, 2, 3] and result.best_epoch == 3
    assert [entry.get("averaged", False) for entry in result.history] == [False, True, True, True, False]
    mean = {name: (seen[1][name] + seen[2][name] + seen[3][name]) / 3 for name in seen[1]}
    assert_trees_close(flat(model.trainable_parameters()), mean)
    assert_trees_close({name: value for name, value in flat(model.parameters()).items() if name in frozen}, frozen,
                       rtol=0, atol=0)
    assert result.best_score == 0.42  # the mean's outputs, scored again
    np.testing.assert_allclose(result.valid_outputs, predict_outputs(model, fold_data().valid_tokens, config()),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("adversarial", ["fgm", "awp"])
def test_the_three_parts_together_with_accumulated_gradients(adversarial):
    """EMA, adversarial training and the mean of the best epochs in one fold of micro-batches (the accumulated
    step, as fp16's loss scale also takes)."""
    result, seen = train(tiny_model(), [0.1, 0.3, 0.2, 0.0, 0.0], ema=0.5, adversarial=adversarial, average_best=2,
                         grad_accum=2, batch_size=4)
    assert result.averaged_epochs == [1, 2] and np.isfinite(result.valid_outputs).all()
    assert all(np.isfinite(entry["train_loss"]) for entry in result.history)
    assert not np.array_equal(seen[-1][TABLE], seen[0][TABLE])


def test_adversarial_training_starts_at_its_epoch():
    _, plain = train(tiny_model(), [0.0] * 2, epochs=2)
    _, late = train(tiny_model(), [0.0] * 2, epochs=2, adversarial="fgm", adversarial_start=2)
    assert_trees_close(late[0], plain[0], rtol=0, atol=0)
    assert not np.array_equal(late[1][TABLE], plain[1][TABLE])


# ---- one adversarial step against the definition

def recording(seen: list, table: str = TABLE):
    """loss_fn that keeps the word-embedding table each forward pass runs with."""

    def loss(model, *inputs):
        seen.append(at(model, table))
        return loss_fn(model, *inputs)

    return loss


def table_gradient(model, inputs) -> mx.array:
    """The loss's gradient with respect to the word-embedding table, frozen or not."""
    module = at(model, TABLE.rpartition(".")[0])

    def of_table(table):
        module["weight"] = table
        return loss_fn(model, *inputs)

    original = module["weight"]
    try:
        return mx.grad(of_table)(original)
    finally:
        module["weight"] = original


def expected_step(model, adversary: Adversary, inputs, lr: float, max_grad_norm: float) -> dict:
    """The definition by hand: gradients at E and at E + r summed, E restored, then clipping and SGD."""
    grad, module = nn.value_and_grad(model, loss_fn), at(model, TABLE.rpartition(".")[0])
    table = module["weight"]
    _, clean = grad(model, *inputs)
    g = np.array(table_gradient(model, inputs), dtype=np.float64)
    e = np.array(table, dtype=np.float64)
    if adversary.kind == "fgm":
        moved = e + adversary.epsilon * g / np.linalg.norm(g)
    else:
        moved = e + adversary.lr * g / (np.linalg.norm(g) + 1e-6) * (np.linalg.norm(e) + 1e-6)
        moved = np.clip(moved, e - adversary.epsilon * np.abs(e), e + adversary.epsilon * np.abs(e))
    module["weight"] = mx.array(moved.astype(np.float32))
    _, again = grad(model, *inputs)
    module["weight"] = table
    again = dict(tree_flatten(again))
    summed = tree_unflatten([(name, value + again[name]) for name, value in tree_flatten(clean)])
    clipped, _ = optim.clip_grad_norm(summed, max_grad_norm)
    optim.SGD(learning_rate=lr).update(model, clipped)
    return {"parameters": flat(model.parameters()), "perturbation": moved - e, "gradient": g}


@pytest.mark.parametrize("kind, epsilon", [("fgm", 0.5), ("awp", 1e-3)])
@pytest.mark.parametrize("adapters", [False, True])
def test_one_adversarial_step_perturbs_along_the_gradient_and_steps_on_the_summed_gradients(kind, epsilon, adapters):
    """Inside the step the second pass runs at E + r (FGM: ||r|| = epsilon, cosine 1 with E's gradient; AWP: its
    formula, the clamp active); after it the weights are SGD's of the summed, clipped gradients on the clean table
    (a frozen table, under adapters, unchanged)."""
    adversary = Adversary(kind, epsilon, TABLE, lr=1.0)  # AWP's lr this large makes the clamp bite
    inputs, lr, max_grad_norm = batch(0), 0.1, 0.5
    expected = expected_step(tiny_model(adapters), adversary, inputs, lr, max_grad_norm)
    model, seen = tiny_model(adapters), []
    before = flat(model.parameters())
    step = make_train_step(model, optim.SGD(learning_rate=lr), max_grad_norm, execution=Execution(compiled=False),
                           loss=recording(seen), adversary=adversary)
    mx.eval(step(*inputs), model.parameters())
    assert len(seen) == 2
    applied = np.array(seen[1], dtype=np.float64) - np.array(seen[0], dtype=np.float64)
    np.testing.assert_allclose(np.array(seen[0]), before[TABLE], rtol=0, atol=0)
    g = expected["gradient"]
    if kind == "fgm":
        assert np.linalg.norm(applied) == pytest.approx(epsilon, rel=1e-5)
        assert np.sum(applied * g) / np.linalg.norm(applied) / np.linalg.norm(g) == pytest.approx(1.0, abs=1e-6)
    else:
        reach = epsilon * np.abs(before[TABLE])
        rounding = 1e-6 * np.abs(before[TABLE])  # E + r is rounded to float32
        assert np.all(np.abs(applied) <= reach + rounding)
        assert np.sum(np.abs(np.abs(applied) - reach) <= rounding) > applied.size // 2  # the clamp bites
    np.testing.assert_allclose(applied, expected["perturbation"], rtol=1e-4, atol=1e-7)
    after = flat(model.parameters())
    assert_trees_close(after, expected["parameters"], rtol=1e-4, atol=1e-6)
    if adapters:
        assert np.array_equal(after[TABLE], before[TABLE])
        assert TABLE not in flat(model.trainable_parameters())  # frozen again after the step
    else:
        assert not np.array_equal(after[TABLE], before[TABLE])


def adversarial_steps(compiled: bool, accumulated: bool, adapters: bool, n: int = 3, streams: tuple = ()) -> dict:
    model = tiny_model(adapters)
    optimizer = optim.SGD(learning_rate=0.1, momentum=0.9)  # moves by the gradients' size, unlike AdamW's first steps
    adversary = Adversary("fgm", 1.0, TABLE)
    if accumulated:
        grad_step = make_grad_step(model, compiled, adversary=adversary)
        update = make_update(model, optimizer, 1.0, compiled)
    else:
        step = make_train_step(model, optimizer, 1.0, execution=Execution(compiled, streams=streams),
                               adversary=adversary)
    for i in range(n):
        if accumulated:
            _, grads = grad_step(mx.array(1.0), *batch(i))
            update(grads)
        else:
            step(*batch(i))
        mx.eval(model.parameters(), optimizer.state)
    return flat(model.parameters())


@pytest.mark.parametrize("accumulated, adapters", [(False, False), (True, False), (False, True)])
def test_compiled_and_eager_adversarial_steps_give_the_same_weights(accumulated, adapters):
    eager = adversarial_steps(False, accumulated, adapters)
    assert_trees_close(adversarial_steps(True, accumulated, adapters), eager, rtol=1e-4, atol=1e-5)
    assert not np.array_equal(eager["head.classifier.weight"], flat(tiny_model(adapters).parameters())[
        "head.classifier.weight"])


def test_a_sharded_step_perturbs_along_the_whole_batch_gradient():
    """Rows split over CPU streams: one perturbation, from the sum of the shards' gradients, as one stream makes."""
    one = adversarial_steps(False, False, False)
    try:
        sharded = adversarial_steps(False, False, False, streams=cpu_streams(2))
    finally:
        cpu_streams(1)  # the CPU kernels' threads as they were
    assert_trees_close(sharded, one, rtol=1e-4, atol=1e-4)


def test_every_architecture_names_its_word_embedding_table_and_trains_adversarially():
    """The table ``word_embedding_path`` names is an embedding of vocab_size rows, and one FGM step perturbs it."""
    assert all(arch.masked_lm is not None and arch.masked_lm.embeddings for arch in ARCHITECTURES.values())
    parity = pytest.importorskip("tests.parity")
    for name, arch in parity.ARCHS.items():
        mx.random.seed(0)
        model, seen = build_task_model(arch.values, "binary", "cls", 0.0), []
        path = word_embedding_path(model)
        assert isinstance(at(model, path.rpartition(".")[0]), nn.Embedding), name
        assert at(model, path).shape[0] == arch.values["vocab_size"], name
        ids, mask, targets = batch(0)
        step = make_train_step(model, optim.SGD(learning_rate=0.1), 1.0, execution=Execution(compiled=False),
                               loss=recording(seen, path), adversary=Adversary("fgm", 0.5, path))
        mx.eval(step(ids % arch.values["vocab_size"], mask, targets), model.parameters())
        assert np.linalg.norm(np.array(seen[1]) - np.array(seen[0])) == pytest.approx(0.5, rel=1e-4), name


# ---- refusals

def test_a_quantized_embedding_table_is_refused():
    model = tiny_model()
    apply_adapters(model, AdapterConfig(rank=2, bits=4, group_size=32, quantize_embeddings=True))
    with pytest.raises(KbertError, match="^--adversarial fgm perturbs the word embeddings.*quantize_embeddings"):
        make_adversary(model, config(adversarial="fgm"))


@pytest.mark.parametrize("setting, value, message", [
    ("ema", 1.0, "ema must be a finite number in [0, 1), got 1.0"),
    ("adversarial_epsilon", 0, "adversarial_epsilon must be a finite number > 0, got 0"),
    ("adversarial_start", 0, "adversarial_start must be an integer >= 1, got 0"),
    ("average_best", -1, "average_best must be an integer >= 0, got -1"),
    ("adversarial", "pgd", "adversarial 'pgd' is unknown; known: none, fgm, awp"),
])
def test_settings_out_of_range_are_refused_in_one_line(titanic, setting, value, message):
    with pytest.raises(KbertError) as error:
        resolve_run_config(titanic, {setting: value})
    assert str(error.value) == message


# ---- resuming

def test_a_run_with_the_recipe_interrupted_after_its_first_fold_resumes_to_the_files_of_an_uninterrupted_one(
        tmp_path, monkeypatch):
    settings = {"limit_rows": 40, "epochs": 3, "ema": 0.9, "adversarial": "fgm", "average_best": 2,
                "dropout_samples": 3}
    run_tiny("titanic", tmp_path, run_id="whole", **settings)
    real, started = fold.train_fold, []

    def interrupted_in_the_second_fold(*args, **kwargs):
        if started:
            raise KeyboardInterrupt
        started.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(fold, "train_fold", interrupted_in_the_second_fold)
    with pytest.raises(KeyboardInterrupt):
        run_tiny("titanic", tmp_path, run_id="resumed", **settings)
    folds = tmp_path / "runs" / "titanic" / "resumed" / "folds"
    assert (folds / "0" / "fold.json").is_file() and not (folds / "1" / "fold.json").is_file()
    monkeypatch.setattr(fold, "train_fold", real)
    run_tiny("titanic", tmp_path, run_id="resumed", **settings)
    whole, resumed = (tmp_path / "runs" / "titanic" / name for name in ("whole", "resumed"))
    files = sorted(p.relative_to(whole) for p in whole.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(resumed) for p in resumed.rglob("*") if p.is_file())
    records = {Path(name) for name in ("config.yaml", "folds/0/fold.json", "folds/1/fold.json", "metrics.json",
                                       "clock.json")}
    for name in files:  # the records may differ in the run's name and its timings alone
        if name in records:
            assert without_volatile(read(whole / name)) == without_volatile(read(resumed / name)), name
        else:
            assert (whole / name).read_bytes() == (resumed / name).read_bytes(), name
    assert records <= set(files)


VOLATILE = ("run_id", "seconds", "wall_time_s", "spent_s", "submission", "record_sha256")  # (the seal covers the timings)


def read(path: Path):
    return yaml.safe_load(path.read_text()) if path.suffix == ".yaml" else read_json(path)


def without_volatile(value):
    """A config or record less the run's name, its submission's path and its timings, at any depth (and the
    sha256 of each fold.json, whose timings it covers: the fold.json files are compared themselves)."""
    if isinstance(value, dict):
        return {k: without_volatile(v) for k, v in value.items()
                if k not in VOLATILE and not k.endswith("/fold.json")}
    if isinstance(value, list):
        return [without_volatile(v) for v in value]
    return value
