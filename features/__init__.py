"""Table -> text serializers. Each has ``fit(train_rows)`` and ``transform(rows) -> list[str]``."""

from features.titanic import TitanicSerializer

SERIALIZERS = {"titanic": TitanicSerializer}
