"""kbert's layers point one way: every import of a kbert module, at the top of a file or inside a function, goes
to the importer's own layer or a layer below it. The files are read with ``ast`` (nothing is imported), and the
folder of each subpackage comes from pyproject.toml (tests/test_install.py checks that the wheel holds them all),
so a new subpackage must be placed in a layer here too.

    bottom       kbert (errors, io, names, tasks)   imports nothing of kbert but the bottom
    models       kbert.models                       the bottom
    features     kbert.features                     the bottom
    competitions kbert.competitions                 the bottom (YAML and data only)
    pipeline     kbert.pipeline                     the bottom, models, features
    ensembles    kbert.ensembles                    the above and pipeline
    tune         kbert.tune                         the above and pipeline
    report       kbert.report                       the above, pipeline, ensembles, tune
    auto         kbert.auto                         the above, pipeline, ensembles, tune, report
    cli          kbert.cli                          everything
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOTTOM = ("kbert", "kbert.errors", "kbert.io", "kbert.names", "kbert.tasks")
BELOW = {  # layer -> the layers its modules may import (its own included)
    "bottom": {"bottom"},
    "models": {"bottom", "models"},
    "features": {"bottom", "features"},
    "competitions": {"bottom"},
    "pipeline": {"bottom", "models", "features", "pipeline"},
    "ensembles": {"bottom", "models", "features", "pipeline", "ensembles"},
    "tune": {"bottom", "models", "features", "pipeline", "tune"},
    "report": {"bottom", "models", "features", "pipeline", "ensembles", "tune", "report"},
    "auto": {"bottom", "models", "features", "pipeline", "ensembles", "tune", "report", "auto"},
    "cli": {"bottom", "models", "features", "pipeline", "ensembles", "tune", "report", "auto", "cli"},
}


def layer_of(module: str) -> str:
    """The layer of a kbert module name; an unplaced subpackage fails the test."""
    if module in BOTTOM:
        return "bottom"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in BELOW and parts[1] != "bottom":
        return parts[1]
    raise AssertionError(f"{module}: not in any layer; add it to tests/test_layers.py")


SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folder(package: str) -> Path:
    """The folder of an installed package: its own package-dir entry, else its parent's folder plus its name."""
    folders = SETUPTOOLS["package-dir"]
    if package in folders:
        return (ROOT / folders[package]).resolve()
    parent, name = package.rsplit(".", 1)
    return package_folder(parent) / name


def package_modules() -> dict[str, Path]:
    """Every module the wheel installs, by its kbert name."""
    modules = {}
    for package in SETUPTOOLS["packages"]:
        for path in sorted(package_folder(package).glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def kbert_imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module) for every kbert import in the file, relative imports resolved."""
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from kbert.models import runtime` imports the submodule kbert.models.runtime
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == "kbert" or name.startswith("kbert.")]
    return found


MODULES = package_modules()


def test_every_module_is_placed_in_a_layer():
    assert {"kbert", "kbert.errors", "kbert.io", "kbert.tasks", "kbert.models.bert", "kbert.features",
            "kbert.pipeline.run", "kbert.ensembles.blend", "kbert.cli"} <= set(MODULES)
    for module in MODULES:
        layer_of(module)


def test_imports_point_down_the_layers():
    checked, violations = 0, []
    for module, path in MODULES.items():
        allowed = BELOW[layer_of(module)]
        for line, imported in kbert_imports(path, module):
            checked += 1
            if layer_of(imported) not in allowed:
                violations.append(f"{path.relative_to(ROOT)}:{line}: {layer_of(module)} module {module} imports "
                                  f"{imported} ({layer_of(imported)})")
    print(f"\n{len(MODULES)} modules, {checked} kbert imports checked, {len(violations)} pointing up")
    assert not violations, "\n".join(violations)


def test_the_checker_catches_an_upward_import(tmp_path):
    bad = tmp_path / "heads.py"
    bad.write_text("def f():\n    from kbert.pipeline.config import RunConfig\n    from . import bert\n")
    imports = kbert_imports(bad, "kbert.models.heads")
    assert imports == [(2, "kbert.pipeline.config"), (3, "kbert.models.bert")]
    assert layer_of(imports[0][1]) not in BELOW["models"] and layer_of(imports[1][1]) in BELOW["models"]


def test_importing_kbert_has_no_side_effects():
    """Importing the package and its layers loads no MLX and binds no BLAS; runtime.setup() does that. The
    config and the tuning workers stay MLX-free too: a spawned worker calls setup() before MLX loads."""
    code = ("import sys, kbert, kbert.models, kbert.features, kbert.pipeline, kbert.pipeline.config, kbert.cli, "
            "kbert.tune.workers; "
            "from kbert.models import runtime; print('mlx.core' in sys.modules, runtime.status().blas.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "unbound"]
