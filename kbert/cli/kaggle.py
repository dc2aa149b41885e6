"""The Kaggle commands: ``kbert download``, ``submit``, ``submissions`` and ``leaderboard`` (options, handlers and
the competition -> Kaggle slug rule they share). The kaggle package is imported only inside the handlers, through
kbert.pipeline.kaggle."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir, add_number
from kbert.cli.competition import cmd_validate

SLUG_HELP = "a competition name, YAML path or Kaggle slug"


def add_parser(commands) -> None:
    download = add_command(commands, "download", help="download and unzip a Kaggle competition's files",
                           description="Fetch a competition's files with the official kaggle package and "
                                       "unzip them into data/<slug>/, the folder kbert run reads first. "
                                       "Accept the competition's rules on kaggle.com first.")
    download.add_argument("slug", help="the competition's Kaggle slug, e.g. titanic")
    add_data_dir(download, help="where the files go (default data/<slug>)")
    download.add_argument("--force", action="store_true", help="download again even if the files are there")
    download.set_defaults(handler=cmd_download)

    submit = add_command(commands, "submit", help="validate a submission file, then submit it to Kaggle",
                         description="Check the file against the competition's sample submission (as kbert "
                                     "validate does) and submit it with the official kaggle package.")
    add_competition(submit, help="a name under competitions/ or a path to a competition YAML; its name is the "
                    "Kaggle slug")
    submit.add_argument("file", help="the submission CSV")
    submit.add_argument("-m", "--message", required=True, help="the submission's description on Kaggle")
    add_data_dir(submit, help="folder with the sample submission (default: as kbert run)")
    submit.set_defaults(handler=cmd_submit)

    submissions = add_command(commands, "submissions", help="list your Kaggle submissions and their scores")
    add_competition(submissions, help=SLUG_HELP)
    submissions.set_defaults(handler=cmd_submissions)

    leaderboard = add_command(commands, "leaderboard", help="show the top of a competition's public leaderboard")
    add_competition(leaderboard, help=SLUG_HELP)
    add_number(leaderboard, "--top", int, {"at_least": 1}, default=20, help="rows to show (default 20)")
    leaderboard.set_defaults(handler=cmd_leaderboard)


def kaggle_slug(competition: str) -> str:
    """A competition name or YAML path -> its Kaggle slug (the YAML's name); anything else is taken as a slug."""
    from kbert.pipeline.config import find_competition, load_competition

    if competition.endswith((".yaml", ".yml")) or find_competition(competition) is not None:
        return load_competition(competition).name
    return competition


def cmd_download(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.names import check_name
    from kbert.pipeline.config import DOWNLOAD_DIR, find_competition
    from kbert.pipeline.kaggle import download_competition

    check_name(args.slug, "kbert download SLUG")  # data/<slug>/ by default; a Kaggle slug is a plain name anyway
    folder = Path(args.data_dir) if args.data_dir else DOWNLOAD_DIR / args.slug
    files = download_competition(args.slug, folder, force=args.force)
    names = [str(p.relative_to(folder)) for p in files]
    print(f"{folder}: {len(names)} files ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})")
    if find_competition(args.slug) is not None:
        print(f"next: kbert run {args.slug}" + (f" --data-dir {folder}" if args.data_dir else ""))
    else:
        print(f"next: kbert init {args.slug} --train {folder}/train.csv --test {folder}/test.csv "
              f"(check the file names), then kbert run {args.slug}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.pipeline.kaggle import submit_file

    cmd_validate(args)
    print(submit_file(kaggle_slug(args.competition), Path(args.file), args.message))
    return 0


def cmd_submissions(args: argparse.Namespace) -> int:
    from kbert.pipeline.kaggle import submissions_table

    print(submissions_table(kaggle_slug(args.competition)))
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from kbert.pipeline.kaggle import leaderboard_table

    print(leaderboard_table(kaggle_slug(args.competition), args.top))
    return 0
