"""Write docs/settings.md, the reference of every run setting, from the declarations in pipeline/config.py:
``python docs/make_settings.py`` (tests/test_config.py fails while the file is out of date)."""

from pathlib import Path

from kbert.pipeline.config import settings_markdown

if __name__ == "__main__":
    Path(__file__).with_name("settings.md").write_text(settings_markdown(), encoding="utf-8")
