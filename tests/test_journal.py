"""Study journals that outlive a kill (kbert/tune/storage.py ``open_journal``): a torn last line is cut back to
the last newline before the first append, under the journal's lock, said once; a torn fragment that an older
kbert let an append be glued onto is cut from the front of its line; a line beyond repair is one line naming it.
And what opening a journal creates goes again when the command is refused. Fast: journals are written by Optuna
itself with a trivial objective; nothing trains."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import TrialState

from kbert.cli import main
from kbert.errors import KbertError
from kbert.io import removed_on_refusal
from kbert.tune import TuneOptions, load_study, write_report
from kbert.tune.storage import mend_journal, open_journal

BASE = Path(__file__).resolve().parent / "bad_inputs" / "base"  # twelve Titanic rows and a competition YAML
TORN = b'{"op_code":6,"worker_id":"killed-1","trial_id":9,"sta'  # what a kill in the middle of an append leaves

optuna.logging.set_verbosity(optuna.logging.WARNING)


def optuna_study(storage: optuna.storages.BaseStorage, name: str = "s") -> optuna.Study:
    return optuna.create_study(study_name=name, storage=storage, load_if_exists=True)


def plain_journal(path: Path) -> JournalStorage:
    """Optuna's own journal storage, as an older kbert opened it: nothing checked."""
    return JournalStorage(JournalFileBackend(str(path)))


def objective(trial: optuna.Trial) -> float:
    return trial.suggest_float("x", 0, 1)


def journal_with_trials(path: Path, trials: int, name: str = "s") -> Path:
    optuna_study(plain_journal(path), name).optimize(objective, n_trials=trials)
    return path


def completed(storage: optuna.storages.BaseStorage, name: str = "s") -> int:
    return len(optuna.load_study(study_name=name, storage=storage).get_trials(states=(TrialState.COMPLETE,)))


def test_a_torn_last_line_is_cut_on_the_next_open_and_every_finished_trial_is_kept(tmp_path, capsys):
    path = journal_with_trials(tmp_path / "journal.log", 3)
    whole = path.read_bytes()
    with path.open("ab") as handle:
        handle.write(TORN)
    assert completed(plain_journal(path)) == 3  # Optuna's reader skips the torn line ...

    study = optuna.load_study(study_name="s", storage=open_journal(path))
    assert path.read_bytes() == whole  # ... and kbert cuts it before anything is appended to it
    torn_line = len(whole.splitlines()) + 1
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {path}: cut {len(TORN)} byte(s) that a killed write left of a record (line {torn_line}, the "
        f"last); every complete record is kept"]
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 3
    study.optimize(objective, n_trials=2)  # appends land on a whole line
    assert completed(plain_journal(path)) == 5  # and a reopen reads every trial
    assert completed(open_journal(path)) == 5
    assert capsys.readouterr().err == ""  # said once: the next opening finds the file whole


def glued_journal(path: Path) -> tuple[Path, int]:
    """A journal broken as an older kbert broke it: a torn fragment, an append glued onto it (Optuna's reader
    skips that line while it is the last), then one more append, after which every read fails. Returns the
    path and the glued line's number."""
    journal_with_trials(path, 2)
    glued = len(path.read_bytes().splitlines()) + 1
    with path.open("ab") as handle:
        handle.write(TORN)
    study = optuna.load_study(study_name="s", storage=plain_journal(path))
    study.set_user_attr("glued", 1)  # lands on the torn line
    with pytest.raises(ValueError):  # the next append: the glued line is no longer the last
        study.set_user_attr("after", 2)
    with pytest.raises(ValueError):
        plain_journal(path)
    return path, glued


def test_a_record_glued_onto_a_torn_line_is_kept_and_the_fragment_cut(tmp_path, capsys):
    path, glued = glued_journal(tmp_path / "journal.log")
    study = optuna.load_study(study_name="s", storage=open_journal(path))
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {path}: cut {len(TORN)} byte(s) that a killed write left of a record (line {glued}); every "
        f"complete record is kept"]
    assert study.user_attrs == {"glued": 1, "after": 2}  # the glued record survives, and the one after it
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 2
    study.optimize(objective, n_trials=1)
    assert completed(plain_journal(path)) == 3  # Optuna itself reads the mended file


def test_a_line_beyond_repair_is_refused_in_one_line_naming_it(tmp_path):
    path = journal_with_trials(tmp_path / "journal.log", 1)
    lines = path.read_bytes().splitlines(keepends=True)
    for broken in (TORN + b"\n",  # a torn fragment with nothing glued onto it
                   b"hello" + lines[1],  # a record behind what never began as one: not cut, whatever it is
                   b"[1, 2]\n"):  # JSON, but no record
        path.write_bytes(b"".join([lines[0], broken, *lines[1:]]))
        before = path.read_bytes()
        with pytest.raises(KbertError) as refused:
            open_journal(path)
        assert str(refused.value) == (f"{path}: line 2 is not a journal record, nor a torn one followed by a record; "
                                      f"restore the file from a copy, or use another --study")
        assert path.read_bytes() == before


def test_mending_is_a_pure_function_of_the_bytes(tmp_path):
    record = b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[1]}'
    assert mend_journal(record + b"\n", tmp_path) is None
    assert mend_journal(b"", tmp_path) is None
    two_kills = mend_journal(b'{"op_c' + TORN + record + b"\n" + record[:9], tmp_path)  # two torn appends, then one
    assert (two_kills.text, two_kills.cut, two_kills.lines) == (record + b"\n", 6 + len(TORN) + 9, (1, 2))
    assert two_kills.places() == "line 1, line 2, the last"


def test_the_repair_waits_for_the_journals_lock(tmp_path):
    """A tail without its newline may be an append in flight: only the lock's holder may cut it."""
    path = journal_with_trials(tmp_path / "journal.log", 1)
    with path.open("ab") as handle:
        handle.write(TORN)
    held = JournalFileSymlinkLock(str(path))  # as Optuna's backend holds it while it appends
    held.acquire()
    opened = threading.Thread(target=open_journal, args=(path,))
    opened.start()
    time.sleep(0.5)
    assert path.read_bytes().endswith(TORN) and opened.is_alive()
    held.release()
    opened.join(timeout=10)
    assert not opened.is_alive() and path.read_bytes().endswith(b"\n")


def test_a_refusal_takes_back_the_journal_and_folder_that_opening_made(tmp_path):
    path = tmp_path / "runs" / "c" / "s" / "journal.log"
    with pytest.raises(KbertError), removed_on_refusal():
        optuna_study(open_journal(path))
        raise KbertError("refused after the study was written")
    assert not (tmp_path / "runs").exists()
    path.parent.mkdir(parents=True)
    journal_with_trials(path, 1)  # an existing journal stays, whatever is refused after it is opened
    before = path.read_bytes()
    with pytest.raises(KbertError), removed_on_refusal():
        open_journal(path)
        raise KbertError("refused")
    assert path.read_bytes() == before


@pytest.mark.parametrize("storage, message", [
    ("data", "--storage data: a folder; give the journal file's path (or a database URL)"),
    ("new/", "--storage new/: a folder; give the journal file's path (or a database URL)"),
    ("competition.yaml/journal.log", "--storage competition.yaml/journal.log: 'competition.yaml' is not a folder"),
    ("dangling.log", "--storage dangling.log: not a file; give the journal file's path (or a database URL)"),
])
def test_storage_that_cannot_be_a_journal_file_is_refused_before_anything_is_made(storage, message, tmp_path,
                                                                                  monkeypatch):
    shutil.copytree(BASE, tmp_path / "case")
    monkeypatch.chdir(tmp_path / "case")
    Path("dangling.log").symlink_to("nowhere/journal.log")
    with pytest.raises(KbertError) as refused:
        TuneOptions(competition="competition.yaml", storage=storage)
    assert str(refused.value) == message
    assert not Path("new").exists() and not Path("runs").exists()


def test_storage_in_a_folder_nobody_may_write_in_is_refused(tmp_path, monkeypatch):
    """(root may write anywhere: the permission is what os.access answers)"""
    monkeypatch.chdir(tmp_path)
    Path("shared").mkdir()
    monkeypatch.setattr("kbert.io.os.access", lambda path, mode: Path(path).name != "shared")
    with pytest.raises(KbertError) as refused:
        TuneOptions(competition="titanic", storage="shared/studies/journal.log")
    assert str(refused.value) == "--storage shared/studies/journal.log: 'shared' is not writable"


def base_case(tmp_path: Path, monkeypatch) -> Path:
    shutil.copytree(BASE, tmp_path / "case")
    monkeypatch.chdir(tmp_path / "case")
    return Path("runs/mini-titanic/s/journal.log")


def test_loading_an_existing_study_appends_nothing(tmp_path, monkeypatch):
    """A study created by ``kbert tune`` (no trial trained) is only read by the report, and a worker refused for
    other settings leaves its journal as it was (optuna.create_study's load_if_exists appends a record)."""
    path = base_case(tmp_path, monkeypatch)
    load_study(TuneOptions(competition="competition.yaml", study="s"), create=True)
    before = path.read_bytes()
    load_study(TuneOptions(competition="competition.yaml", study="s"), create=False, check=False)
    with pytest.raises(KbertError, match="was created with other settings"):
        load_study(TuneOptions(competition="competition.yaml", study="s", overrides={"folds": 3}), create=True)
    assert path.read_bytes() == before


def test_a_new_study_refused_for_its_artifact_store_leaves_no_study_folder(tmp_path, monkeypatch):
    base_case(tmp_path, monkeypatch)
    with pytest.raises(KbertError, match="--artifacts competition.yaml: not a folder"):
        load_study(TuneOptions(competition="competition.yaml", study="s", artifacts="competition.yaml"), create=True)
    assert not Path("runs").exists()


def test_a_study_once_opened_stays_whatever_is_refused_after_it(tmp_path, monkeypatch):
    path = base_case(tmp_path, monkeypatch)
    with pytest.raises(KbertError), removed_on_refusal():  # e.g. a caller's block around a whole kbert tune
        load_study(TuneOptions(competition="competition.yaml", study="s"), create=True)
        raise KbertError("no trial completed")
    assert path.is_file()
    with pytest.raises(KbertError, match="has no completed trial yet"):
        write_report(TuneOptions(competition="competition.yaml", study="s"))
    assert sorted(p.name for p in path.parent.iterdir()) == ["journal.log", "study.json"]  # no report/, heartbeat


def test_kbert_tune_report_and_ensemble_study_repair_a_torn_journal_first(tmp_path, monkeypatch, capsys):
    path = base_case(tmp_path, monkeypatch)
    path.parent.mkdir(parents=True)
    journal_with_trials(path, 2)
    for command in (["tune", "competition.yaml", "--study", "s", "--report"],
                    ["ensemble", "competition.yaml", "--study", "s"]):
        with path.open("ab") as handle:
            handle.write(TORN)
        code = main(command)
        err = capsys.readouterr().err
        assert err.count("warning: ") == 1 and f"warning: {path}: cut {len(TORN)} byte(s)" in err, command
        assert "Traceback" not in err and not path.read_bytes().endswith(TORN)
        # the trials were made by Optuna, not kbert: each command goes on to a refusal of its own, in one line
        assert code in (0, 2) and (code == 0 or err.strip().splitlines()[-1].startswith("kbert: error: ")), err
    assert completed(plain_journal(path)) == 2
