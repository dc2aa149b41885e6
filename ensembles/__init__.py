"""Ensembles, on top of the pipeline: tabular baselines as members, and blends of members scored by nested CV.

members.py reads runs, tuning trials and baselines back from their folders (oof.csv, test.csv, metrics.json);
blend.py holds the methods (mean, top-k, weighted, rank, hill climbing, stacking) and the nested CV that scores
them honestly; baseline.py trains gradient-boosted and linear models on the pipeline's folds (`kbert baseline`);
ensemble.py picks and writes the blended submission (`kbert ensemble`).
"""
