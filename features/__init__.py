"""Table -> text serializers. Each has ``fit(train_rows)`` and ``transform(rows) -> list[str]``."""

from features.generic import ListSerializer
from features.titanic import TitanicSerializer

SERIALIZERS = {"list": ListSerializer, "titanic": TitanicSerializer}
