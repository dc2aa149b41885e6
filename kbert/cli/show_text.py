"""``kbert show-text``: print the first training rows as the model reads them (options and handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir, add_number


def add_parser(commands) -> None:
    show = add_command(commands, "show-text", help="print training rows as the model reads them",
                       description="Serialize the first N training rows with the competition's text "
                                   "settings (fitted on all training rows) and print them with their targets.")
    add_competition(show)
    add_number(show, "--n", int, {"at_least": 1}, default=5, help="how many rows (default 5)")
    add_data_dir(show)
    show.set_defaults(handler=cmd_show_text)


def cmd_show_text(args: argparse.Namespace) -> int:
    from kbert.pipeline.config import load_competition, resolve_run_config
    from kbert.pipeline.data import duplicate_report, input_rows, load_competition_data, text_columns
    from kbert.pipeline.fold import make_serializer

    competition = load_competition(args.competition)
    config = resolve_run_config(competition)
    data = load_competition_data(competition, args.data_dir)
    features, _ = input_rows(competition, data.train, data.test)
    all_texts = make_serializer(config).fit(features).transform(features)
    texts, lengths = all_texts[: args.n], [len(t.split()) for t in all_texts]
    for (_, row), text in zip(data.train.iloc[: args.n].iterrows(), texts):
        target = ", ".join(f"{c}={row[c]}" for c in competition.target_columns)
        print(f"[{row[competition.id_column]}] {target}\n  {text}")
    print(f"{len(features)} training rows; words per row: mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}")
    duplicates = duplicate_report(data.train, text_columns(competition), competition.target_columns)
    if duplicates:
        print(duplicates)
    return 0
