"""Ensemble members: any folder that follows the run-artifact contract (``kbert run``, a tuning trial,
``kbert baseline``), read back as OOF and test prediction tables aligned to the competition's rows.

A member folder holds metrics.json (metric, cv), config.yaml, folds.csv, oof.csv (id + prediction columns) and
test.csv (id + fold-averaged prediction columns); see pipeline/artifacts.py. Each is checked where it is read
(pipeline/provenance.py), and members blended together must share their folds. A member trained on forward-chaining
time-series folds has no OOF prediction for the first block (empty cells in oof.csv, NaN rows in ``oof``): its
``covered`` rows are the others, and ensembles blend on the rows every member covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kbert.errors import KbertError
from kbert.pipeline.provenance import Expected, Partial, ShuffledTargets, check_member


@dataclass
class Member:
    name: str  # "<run-id>" or "<study>/trial-0003", relative to runs/<competition>/
    path: Path
    cv: float  # the member's own OOF score, as recorded in metrics.json
    oof: np.ndarray  # (n_train, columns) in the competition's training row order; NaN rows: no OOF prediction
    test: np.ndarray  # (n_test, columns) in the test file's row order
    columns: list[str]
    folds: np.ndarray  # (n_train,) the fold of each training row (its folds.csv, repeat 0)

    @property
    def covered(self) -> np.ndarray:
        """(n_train,) bool: the rows with an OOF prediction (all but a time-series run's first block)."""
        return ~np.isnan(self.oof).any(axis=1)


def common_rows(members: list[Member]) -> np.ndarray:
    """The training rows every member has an OOF prediction for, in row order."""
    rows = np.flatnonzero(np.logical_and.reduce([m.covered for m in members]))
    if len(rows) == 0:
        raise KbertError("--members: no training row has an out-of-fold prediction from every member")
    return rows


def member_folders(competition_dir: Path) -> list[Path]:
    """Every finished run, baseline and tuning trial under ``runs/<competition>/``: folders with a metrics.json
    and a folds.csv, one or two levels down (run folders and study/trial folders). One that lacks its oof.csv or
    test.csv is among them, and refused when it is read, not passed over in silence."""
    return [metrics.parent for metrics in sorted([*competition_dir.glob("*/metrics.json"),
                                                  *competition_dir.glob("*/*/metrics.json")])
            if (metrics.parent / "folds.csv").is_file()]


def load_member(folder: Path, competition_dir: Path, expected: Expected) -> Member:
    """The member in ``folder``, checked against the competition and its data (pipeline/provenance.py): a
    ``--limit-rows`` run raises ``Partial``, anything else that does not belong is one error naming it."""
    name = folder.relative_to(competition_dir).as_posix()
    checked = check_member(folder, expected, f"member {name}")
    return Member(name=name, path=folder, cv=float(checked.metrics["cv"]), oof=checked.oof, test=checked.test,
                  columns=expected.columns, folds=checked.folds)


def without_twins(members: list[Member], log) -> list[Member]:
    """Each set of members whose predictions are the same, once (the first): a copied folder, two trials of the same
    parameters, a pseudo-labelled run that took no test row; one model would weigh as two."""
    twins = [b for i, b in enumerate(members)
             if any(np.array_equal(a.oof, b.oof, equal_nan=True) and np.array_equal(a.test, b.test)
                    for a in members[:i])]
    if twins:
        log(f"skipped {len(twins)} member(s) with the predictions of another: {', '.join(b.name for b in twins[:5])}")
    return [m for m in members if all(m is not b for b in twins)]


def select_members(competition_dir: Path, spec: str, expected: Expected, greater_is_better: bool,
                   log=print) -> list[Member]:
    """``spec``: ``all``, ``top:K`` (the K best by their own CV) or comma-separated member names
    (run ids, ``<study>/trial-NNNN``). Every member is checked (``load_member``) and all must share one split of
    the training rows; named members must cover every row, ``all`` and ``top:K`` skip partial runs with a
    note."""
    if not competition_dir.is_dir():
        raise KbertError(f"{competition_dir}: no runs for this competition yet; run kbert run or kbert baseline first")
    spec = spec.strip()
    if spec == "all" or spec.startswith("top:"):
        members, skipped, sanity = [], [], []
        for folder in member_folders(competition_dir):
            try:
                members.append(load_member(folder, competition_dir, expected))
            except Partial:
                skipped.append(folder.name)
            except ShuffledTargets:
                sanity.append(folder.name)
        for names, what in ((skipped, "that do not cover every training and test row"),
                            (sanity, "trained with --permute-target (sanity checks on shuffled targets)")):
            if names:
                log(f"skipped {len(names)} run(s) {what}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")
        members = without_twins(members, log)
        if spec.startswith("top:"):
            count = spec.partition(":")[2]
            if not count.isdigit() or int(count) < 1:
                raise KbertError(f"--members {spec}: K in top:K must be an integer >= 1")
            members = sorted(members, key=lambda m: -m.cv if greater_is_better else m.cv)[: int(count)]
    else:
        members, names = [], [n.strip() for n in spec.split(",") if n.strip()]
        if not names:
            raise KbertError(f"--members {spec!r}: names no member; give all, top:K or run ids separated by commas")
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise KbertError(f"--members: '{twice}' is named twice; name each member once")
        for name in names:
            folder = competition_dir / name
            if not (folder / "metrics.json").is_file():
                raise KbertError(f"--members: no finished run '{name}' in {competition_dir} (no metrics.json)")
            members.append(load_member(folder, competition_dir, expected))
        members = without_twins(members, log)
    if len(members) < 1:
        raise KbertError(f"--members {spec}: no usable members in {competition_dir}")
    for member in members[1:]:
        moved = int((member.folds != members[0].folds).sum())
        if moved:
            raise KbertError(f"member {member.name}: split into other folds than {members[0].name} ({moved} training "
                             "rows in another fold); blend members trained on the same folds")
    return members
