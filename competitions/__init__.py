"""Bundled competitions: one YAML per competition and its Kaggle data under ``data/<name>/``. No code.

A user's own competitions live in the working folder's ``competitions/`` (where ``kbert init`` writes) and are
found first; see kbert/pipeline/config.py ``find_competition``. Nothing writes here at run time.
"""
