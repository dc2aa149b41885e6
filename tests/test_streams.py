"""Batches sharded over CPU streams (pipeline/streams.py): the same loss, gradients and outputs as one stream."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.models.heads import HeadConfig, build_head
from kbert.pipeline.fold_processes import usable_cores
from kbert.pipeline.streams import cpu_streams, shard_rows
from kbert.pipeline.train import Execution, make_forward
from tests.test_compiled_steps import batch, run_steps


def test_shard_rows_cover_every_row_once_in_near_equal_parts():
    assert shard_rows(7, 3) == [slice(0, 2), slice(2, 4), slice(4, 7)]
    assert shard_rows(2, 4) == [slice(0, 1), slice(1, 2)]  # fewer rows than shards
    assert shard_rows(5, 1) == [slice(0, 5)]


def test_one_stream_per_usable_core_and_none_when_off(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert usable_cores() == 3
    assert len(cpu_streams(0)) == 3
    assert cpu_streams(1) == ()
    assert len(cpu_streams(2)) == 2
    assert cpu_streams(2)[0] == mx.default_stream(mx.cpu)


@pytest.mark.parametrize("count", [2, 3])  # 8 rows: 4 + 4, and 2 + 3 + 3
def test_sharded_training_steps_match_one_stream(count):
    one_model, one_losses = run_steps(compiled=True)
    sharded_model, sharded_losses = run_steps(compiled=True, streams=cpu_streams(count))
    np.testing.assert_allclose(sharded_losses, one_losses, rtol=1e-5, atol=1e-6)
    one, sharded = dict(tree_flatten(one_model.parameters())), dict(tree_flatten(sharded_model.parameters()))
    for name in one:  # AdamW divides by sqrt(v): float32 summation-order differences of tiny gradients grow to
        # ~3e-5 after 4 steps of lr 1e-3 (each step moves a weight by up to 1e-3)
        np.testing.assert_allclose(np.array(sharded[name]), np.array(one[name]), rtol=1e-4, atol=1e-4, err_msg=name)
    assert one_losses[0] != one_losses[-1]  # the weights moved


@pytest.mark.parametrize("compiled", [True, False])
def test_sharded_forward_matches_one_stream_and_sees_new_weights(compiled):
    model, _ = run_steps(compiled=True, n=1)
    ids, mask, _ = batch(3)
    want = np.array(make_forward(model, Execution(compiled=False))(ids, mask))
    sharded = make_forward(model, Execution(compiled, streams=cpu_streams(2)))
    np.testing.assert_allclose(np.array(sharded(ids, mask)), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(sharded(ids[:1], mask[:1])), want[:1], rtol=1e-5, atol=1e-6)  # one row
    model.head.classifier.bias = model.head.classifier.bias + 1.0  # the head's logit moves by 1
    np.testing.assert_allclose(np.array(sharded(ids, mask)), want + 1.0, rtol=1e-5, atol=1e-5)


def test_class_weighted_cross_entropy_is_not_sharded_because_it_is_no_mean_over_rows():
    """Its batch loss divides by the rows' class weights, so the shards' row-share-weighted losses miss it."""
    weighted = HeadConfig(task="multiclass", num_outputs=3, class_weights=[1.0, 5.0, 1.0])
    assert not weighted.loss_is_row_mean()
    assert HeadConfig(task="multiclass", num_outputs=3).loss_is_row_mean()
    mx.random.seed(0)
    head = build_head(4, weighted)
    logits, targets = mx.random.normal((4, 3)), mx.array([1, 0, 0, 2])
    whole = head.loss(logits, targets).item()
    halves = sum(head.loss(logits[rows], targets[rows]).item() * 0.5 for rows in shard_rows(4, 2))
    assert abs(whole - halves) > 0.05


@pytest.mark.slow
def test_a_resume_on_another_core_count_trains_the_folds_left_on_the_kept_folds_streams(tmp_path, monkeypatch):
    """A fold's numbers depend on its streams, one per core by default: a run stopped on a 1-core machine and
    resumed on a 2-core one blended folds of two layouts, an answer neither machine gives alone."""
    import json
    from dataclasses import replace

    from kbert.errors import KbertError
    from kbert.pipeline.run import run_competition
    from tests.tiny import tiny_config

    config = tiny_config("titanic", tmp_path, limit_rows=90, folds=3, epochs=2)

    def run(cores: int, out: str, **kwargs):
        monkeypatch.setenv("OMP_NUM_THREADS", str(cores))
        return run_competition(replace(config, out_dir=str(tmp_path / out)), run_id="r", progress=False, **kwargs)

    one_core = run(1, "one", log=lambda _: None).run_dir / "oof.csv"
    assert one_core.read_bytes() != (run(2, "two", log=lambda _: None).run_dir / "oof.csv").read_bytes()

    def stop(step: int, score: float) -> None:
        raise KbertError("stopped after a fold")

    with pytest.raises(KbertError, match="stopped after a fold"):
        run(1, "resumed", log=lambda _: None, on_fold=stop)
    said = []
    resumed = run(2, "resumed", log=said.append).run_dir
    assert ("the folds left train on 1 CPU stream(s) each, as the kept folds did (this machine's plan: 2): a fold's "
            "numbers depend on its streams") in said, said
    assert (resumed / "oof.csv").read_bytes() == one_core.read_bytes()
    assert [json.loads(path.read_text())["record"]["streams"] for path in sorted(resumed.glob("folds/*/fold.json"))
            ] == [1, 1, 1]
