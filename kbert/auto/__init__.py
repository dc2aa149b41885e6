"""``kbert auto``: baselines, encoder runs and a study within a time limit, then the best honest ensemble.

- plan.py: the jobs of each preset, in order
- budget.py: how long a job will take (measured rates), and whether it fits
- driver.py: the driver (resumable), the live leaderboard and the final ensemble
- leaderboard.py: the table, leaderboard.csv and its HTML report
"""

from kbert.auto.driver import AutoOptions, AutoResult, run_auto

__all__ = ["AutoOptions", "AutoResult", "run_auto"]
