"""The Kaggle commands: ``kbert download``, ``submit``, ``submissions`` and ``leaderboard`` (options, handlers and
the competition -> Kaggle slug rule they share). The kaggle package is imported only inside the handlers, through
kbert.pipeline.kaggle."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir, add_number
from kbert.cli.competition import cmd_validate

SLUG_HELP = "a competition name, YAML path or Kaggle slug"


def add_parser(commands) -> None:
    from kbert.pipeline.config import words_of

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

    package = add_command(commands, "package", help="a run, baseline or ensemble as an offline Kaggle notebook package",
                          description="Write a Kaggle dataset (kbert's wheels for one Python, the members' models, "
                                      "the competition's YAML) and an inference notebook that installs from it with "
                                      "no network, predicts the competition's test.csv and writes "
                                      "/kaggle/working/submission.csv.")
    package.add_argument("source", help="an ensemble's JSON (submissions/<competition>/<name>.json), or a run or "
                                         "baseline folder")
    package.add_argument("--out", required=True, help="the package folder to write (a new one)")
    package.add_argument("--dataset", required=True, help="the Kaggle dataset to upload it as: OWNER/SLUG")
    package.add_argument("--python", choices=words_of("kbert.ensembles.package", "PYTHONS"), default="3.11",
                         help="the Python of the notebook's image the wheels are for (default 3.11)")
    package.add_argument("--device", choices=words_of("kbert.ensembles.package", "DEVICES"), default="cpu",
                         help="MLX's CPU build (default) or its CUDA 12 build for a GPU notebook")
    package.add_argument("--competition", default="",
                         help="the competition the package is for (its name is its Kaggle slug); a run made for "
                              "another is refused (default: the source's)")
    package.add_argument("--push", action="store_true",
                         help="then upload the dataset (a new version if it exists) and push the notebook through "
                              "the official kaggle client, with kbert submit's credentials")
    package.add_argument("--notes", help="the dataset version's notes (with --push; default 'kbert package')")
    package.add_argument("--resolve-only", action="store_true",
                         help="only check that every wheel exists for this Python and print them; write nothing")
    package.set_defaults(handler=cmd_package)

    push = add_command(commands, "push", help="upload a kbert package's dataset and push its notebook to Kaggle",
                       description="Create the package's Kaggle dataset (or add a version when it exists), wait "
                                   "until Kaggle has processed it, then push the inference notebook, through the "
                                   "official kaggle client with kbert submit's credentials.")
    push.add_argument("package", help="a folder kbert package wrote (dataset/ and notebook/)")
    push.add_argument("--notes", default="kbert package", help="the dataset version's notes")
    push.set_defaults(handler=cmd_push)


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
    import unicodedata
    from pathlib import Path

    from kbert.errors import KbertError
    from kbert.pipeline.kaggle import submit_file

    if not any(unicodedata.category(c)[0] in "LNPS" for c in args.message):  # (spaces or zero-width characters)
        raise KbertError("-m/--message is empty: give the submission a description (Kaggle lists it beside the score)")
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


def cmd_package(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.errors import KbertError
    from kbert.ensembles.package import (PackageSpec, build_package, check_backend, check_spec, package_contents,
                                         requirements, resolve_wheels)

    if args.notes is not None and not args.push:
        raise KbertError("--notes: the notes of a dataset version that --push uploads; without --push they would be "
                         "dropped (give them to kbert push)")
    if args.resolve_only and args.push:
        raise KbertError("--resolve-only writes nothing, so there is nothing to --push: give one of them")
    spec = PackageSpec(Path(args.source), Path(args.out), args.dataset, args.python, args.device, args.competition)
    if args.resolve_only:
        check_spec(spec, writing=False)
        contents = package_contents(spec.source, spec.competition)
        wheels = resolve_wheels(requirements(spec.device, contents.libraries), spec.python)
        for wheel in check_backend(wheels, spec.device, spec.python):
            print(wheel)
        return 0
    if args.push:
        from kbert.pipeline.kaggle import NO_CREDENTIALS, credential_source

        if credential_source() is None:  # before minutes of building
            raise KbertError(NO_CREDENTIALS)
    build_package(spec)
    if args.push:
        args.package, args.notes = str(spec.out), args.notes or "kbert package"
        return cmd_push(args)
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.errors import KbertError
    from kbert.pipeline.kaggle import push_package

    package = Path(args.package)
    for part, metadata in (("dataset", "dataset-metadata.json"), ("notebook", "kernel-metadata.json")):
        if not (package / part / metadata).is_file():
            raise KbertError(f"{package}: no {part}/{metadata}; give a folder kbert package wrote")
    for line in push_package(package / "dataset", package / "notebook", args.notes):
        print(line)
    return 0
