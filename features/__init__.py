"""Table -> text serializers. Each has ``fit(train_rows)`` and ``transform(rows) -> list[str]``."""

from functools import partial

from features.generic import TableSerializer
from features.titanic import TitanicSerializer

GENERIC_SERIALIZERS = ("list", "sentence", "template")  # features/generic.py, configured from YAML alone
SERIALIZERS = {**{style: partial(TableSerializer, style=style) for style in GENERIC_SERIALIZERS},
               "titanic": TitanicSerializer}
