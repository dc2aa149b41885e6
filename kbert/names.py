"""User-given names that become file or folder names: one check, used wherever such a name is accepted.

A run id, a competition's ``name:``, a ``kbert init`` name, a study name, a pretrain id, a baseline or member
id: each becomes a folder or file under a folder the user chose (``--out``, ``--submissions-dir``,
``competitions/``), so it must not leave it. A plain name is letters, digits, ``-``, ``_`` and ``.``, does not
start with a dot (no ``..``, no hidden files) and is at most 128 characters; anything else (a separator, an
absolute path, a space, an empty name) is refused with one line naming where the name came from.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from kbert.errors import KbertError

PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def check_name(value: object, what: str) -> str:
    """``value`` when it is a plain name; else a KbertError naming ``what`` (an option such as ``--run-id`` or
    a YAML key such as ``competitions/x.yaml: name``)."""
    text = "" if value is None else str(value)
    if not PLAIN_NAME.fullmatch(text):
        raise KbertError(f"{what} {text!r} is not a plain name: use letters, digits, '-', '_' and '.' "
                         "(not first), at most 128, with no folder separators")
    return text


SHARED_FOLDERS = ("folds", "cache", "pretrain", "auto")  # runs/<competition>/<these>: not a run's or a study's


def check_run_name(value: object, what: str) -> str:
    """A run id or study name: a plain name (``check_name``) that is not one of the folders every run of the
    competition shares under ``--out`` (``SHARED_FOLDERS``): a run named ``cache`` got the tokenizer cache."""
    name = check_name(value, what)
    if name in SHARED_FOLDERS:
        raise KbertError(f"{what} {name!r}: runs/<competition>/{name}/ is kbert's own ({', '.join(SHARED_FOLDERS)} "
                         "are); choose another name")
    return name


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a close known name, else an empty string."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
