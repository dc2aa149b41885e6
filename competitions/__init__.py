"""Competition definitions: one YAML per competition, bundled demo data under ``data/``."""
