"""A new architecture is one file: a toy encoder (tests/data/toy_encoder.py) copied into the models folder of an
installed kbert is found by the same registry as the shipped architectures, and runs through `kbert run` (from
scratch at its preset size, and with LoRA adapters on a checkpoint folder of it) and `kbert embed`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.test_install import installed, installed_env  # noqa: F401  (the fixture: a wheel installed in a folder)
from tests.tiny import tiny_args

pytestmark = pytest.mark.slow  # installs a wheel and trains in kbert processes
TOY = Path(__file__).parent / "data" / "toy_encoder.py"
TINY_RUN = tiny_args(60, max_length=32)

# In the subprocess: what the registry found, then a checkpoint folder of the toy architecture (random weights and a
# WordPiece tokenizer on Titanic's names), the way a pretrained one arrives.
FIND_AND_SAVE = """
import json, sys
from pathlib import Path
from kbert.models import runtime
runtime.setup()
import pandas as pd
import kbert.models
from kbert.models.architecture import ARCHITECTURES
from kbert.models.encoders import build_encoder, save_encoder
from kbert.models.tokenizer import train_wordpiece
from kbert.pipeline.config import BUNDLED_DATA_DIR

toy = ARCHITECTURES["toybert"]
tokenizer = train_wordpiece(pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv")["Name"].tolist(), vocab_size=300)
encoder, config = build_encoder({**toy.presets["toybert-tiny"], "vocab_size": tokenizer.get_vocab_size()})
save_encoder(encoder, config, tokenizer, Path(sys.argv[1]))
print(json.dumps({"models": kbert.models.__file__, "types": sorted(ARCHITECTURES), "module": toy.model.__module__}))
"""


@pytest.mark.slow
def test_a_toy_architecture_file_is_registered_and_runs_everywhere(installed, tmp_path):  # noqa: F811
    _, site = installed
    shutil.copy(TOY, site / "kbert" / "models" / TOY.name)
    # Only the installed kbert: an editable install's finder must not answer for it.
    (site / "sitecustomize.py").write_text(
        'import sys\nsys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]\n')
    env = installed_env(site)

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    folder = tmp_path / "toy-checkpoint"
    found = json.loads(run("-c", FIND_AND_SAVE, str(folder)).splitlines()[-1])
    assert Path(found["models"]).parent == site / "kbert" / "models"
    assert found["module"] == "kbert.models.toy_encoder"
    assert {"toybert", "bert", "neobert"} <= set(found["types"])
    assert json.loads((folder / "config.json").read_text())["model_type"] == "toybert"

    out = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    run("-m", "kbert.cli", "run", "titanic", "--encoder", "toybert-tiny", *TINY_RUN, *out, "--run-id", "scratch")
    scratch = json.loads((tmp_path / "runs" / "titanic" / "scratch" / "folds" / "0" / "config.json").read_text())
    assert scratch["encoder_config"]["model_type"] == "toybert"

    run("-m", "kbert.cli", "run", "titanic", "--encoder", str(folder), "--adapter", "lora", *TINY_RUN, *out,
        "--run-id", "lora")
    saved = (tmp_path / "runs" / "titanic" / "lora" / "folds" / "0" / "adapter.safetensors")
    keys = json.loads(run("-c", "import sys, json, mlx.core as mx; print(json.dumps(list(mx.load(sys.argv[1]))))",
                          str(saved)))
    assert any(k.startswith("encoder.encoder.layer.0.attention.self.query.lora_a") for k in keys)

    (tmp_path / "texts.txt").write_text("Braund, Mr. Owen Harris\nHeikkinen, Miss. Laina\n")
    run("-m", "kbert.cli", "embed", str(folder), "--texts", str(tmp_path / "texts.txt"), "--out",
        str(tmp_path / "e.npy"))
    vectors = np.load(tmp_path / "e.npy")
    assert vectors.shape == (2, 32) and np.isfinite(vectors).all()
