"""The one exception type users see: the CLI prints its message without a traceback and exits 2."""


class KbertError(Exception):
    """A problem with the user's input or environment (missing file, bad column, invalid config)."""
