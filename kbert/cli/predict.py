"""``kbert predict`` (a finished run's fold models on new rows) and ``kbert embed`` (sentence embeddings of a text
file): their options and handlers."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_data_dir, add_number, add_out, add_setting, check_run_id

EMBED_LENGTH = 256  # kbert embed's default --max-length (the encoder's positions when it has fewer)


def add_parser(commands) -> None:
    from kbert.pipeline.config import shipped_names, words_of

    predict = add_command(commands, "predict", help="predict a CSV with a run, a baseline or an ensemble",
                          description="Predict new rows with every saved fold model of a run or baseline and "
                                      "average them, as it predicted its test rows; or with an ensemble (the JSON "
                                      "beside its submission): every member predicts, then the ensemble's blend, "
                                      "in the submission's format.")
    predict.add_argument("run", help="a run or baseline folder, its id under <out>/<competition>/, or an "
                                     "ensemble's JSON (submissions/<competition>/<name>.json)")
    predict.add_argument("--data", required=True, help="CSV with the competition's input columns (and ids)")
    add_setting(predict, "tta", default=1, help="average over this many serializations (default 1: off; an "
                                                "ensemble's members use their own)")
    predict.add_argument("--output", help="where to write the predictions (default <run>/predictions/<name>.csv; "
                                          "required for an ensemble)")
    predict.add_argument("--submission", action="store_true",
                         help="a run or baseline: write its submission's format (labels at the cut-off its own "
                              "submission used, its own --tta) instead of id + predictions; needs --output")
    add_out(predict, help="runs folder to look run ids up in (default runs; an ensemble: the one it was made from)")
    add_data_dir(predict, help="where the competition's files are now, if not where the run or ensemble read them")
    predict.set_defaults(handler=cmd_predict)

    embed = add_command(commands, "embed", help="write sentence embeddings of a text file with an encoder",
                        description="Embed one text per line of FILE with a pretrained encoder and write "
                                    "a (lines, hidden) float32 .npy array.")
    embed.add_argument("model", help=f"a shipped name ({shipped_names()}), a local Hugging Face model folder or a "
                                     "Hub id (org/name[@revision])")
    embed.add_argument("--texts", required=True, help="UTF-8 text file, one text per line")
    embed.add_argument("--out", required=True, help="output .npy file")
    embed.add_argument("--pooling", choices=words_of("kbert.models.pooling", "EMBED_POOLINGS"), default="mean",
                       help="how to pool tokens (default mean)")  # not the run's pooling: no learned weights here
    embed.add_argument("--normalize", action="store_true", help="L2-normalise each embedding")
    add_setting(embed, "spm_normalization", default="sentencepiece",
                help="text normalisation of an spm.model-only (DeBERTa-v2/v3) checkpoint, as in kbert run")
    add_number(embed, "--max-length", int, "max_length", default=None,
               help=f"maximum tokens per text (default {EMBED_LENGTH}, or the encoder's positions if fewer; more "
                    "than its positions is refused)")
    add_number(embed, "--batch-size", int, "batch_size", default=64)
    embed.set_defaults(handler=cmd_embed)


def cmd_predict(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.errors import KbertError
    from kbert.pipeline.new_rows import predict_run, resolve_run_dir

    from kbert.ensembles.predict import is_baseline, predict_baseline, predict_ensemble, predict_submission

    if args.run.endswith(".json"):
        if not args.output:
            raise KbertError(f"kbert predict {args.run}: an ensemble needs --output (the submission file to write)")
        if args.tta > 1 or args.submission:  # each member predicts as it was made, and a blend is a submission
            raise KbertError(f"{'--tta' if args.tta > 1 else '--submission'}: an ensemble writes its submission with "
                             "each member's own settings; drop it")
        path = predict_ensemble(Path(args.run), args.data, Path(args.output), args.out_dir, args.data_dir)
        print(f"submission: {path}")
        return 0
    if not (Path(args.run) / "config.yaml").is_file():
        check_run_id(args.run, "kbert predict RUN")
    elif args.out_dir is not None:  # (it names the runs folder a run id is looked up in)
        raise KbertError(f"--out {args.out_dir}: {args.run} is a run folder, not a run id to look up there; drop it")
    run_dir = resolve_run_dir(args.run, args.out_dir or "runs")
    if args.submission:
        if not args.output or args.tta > 1:
            raise KbertError("--submission needs --output (the submission file) and takes the run's own --tta")
        path = predict_submission(run_dir, args.data, Path(args.output), args.data_dir)
        print(f"submission: {path}")
        return 0
    if is_baseline(run_dir):
        if args.tta > 1:
            raise KbertError(f"--tta {args.tta}: {run_dir} is a baseline, which reads the columns, not a text")
        path = predict_baseline(run_dir, args.data, args.output, args.data_dir)
    else:
        path = predict_run(run_dir, args.data, args.tta, args.output, args.data_dir)
    print(f"predictions: {path}")
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.errors import KbertError
    from kbert.io import write_npy
    from kbert.models.encoders import load_encoder, max_tokens, read_config, resolve_encoder_path
    from kbert.pipeline.artifacts import check_output_file
    from kbert.pipeline.embed import Embedding, embed_texts

    if not args.out.strip():
        raise KbertError("--out is empty: give the .npy file to write")
    out = Path(args.out)
    if out.is_dir():
        raise KbertError(f"--out {out}: a folder; give the .npy file to write")
    with_suffix = out if out.suffix == ".npy" else out.with_name(out.name + ".npy")
    check_output_file(with_suffix, f"--out {args.out}", keep=[args.texts])
    texts = _read_lines(Path(args.texts))
    folder = resolve_encoder_path(args.model)
    max_length = args.max_length or min(EMBED_LENGTH, max_tokens(read_config(folder)) or EMBED_LENGTH)
    encoder, _, tokenizer = load_encoder(folder, args.spm_normalization, max_length)
    embedding = Embedding(args.pooling, args.normalize, max_length, args.batch_size)
    vectors = embed_texts(encoder, tokenizer, texts, embedding)
    write_npy(with_suffix, vectors)
    print(f"{with_suffix}: {vectors.shape[0]} x {vectors.shape[1]} embeddings")
    return 0


def _read_lines(path) -> list[str]:
    """The texts to embed, one per line as ``wc -l`` counts them (``\n`` or ``\r\n`` ends a line; a form feed or
    U+2028 inside a line is text, so the vectors stay one per line); KbertError for a missing, non-UTF-8 or empty
    file."""
    from kbert.errors import KbertError
    from kbert.io import existing_file

    existing_file(path, "text file")
    try:
        with open(path, encoding="utf-8", newline="") as file:  # (no newline translation: a lone \r stays text)
            text = file.read()
    except UnicodeDecodeError as exc:
        raise KbertError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    texts = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")] if text else []
    if not texts:
        raise KbertError(f"{path}: no lines to embed")
    return texts
