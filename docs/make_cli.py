"""Write docs/cli-reference.md, every ``kbert`` command's options, from the parsers themselves (kbert/cli):
``python docs/make_cli.py`` (tests/test_docs.py fails while the file is out of date)."""

from pathlib import Path

from kbert.cli import cli_markdown

if __name__ == "__main__":
    Path(__file__).with_name("cli-reference.md").write_text(cli_markdown(), encoding="utf-8")
