"""The competition pipeline: data -> folds -> text -> tokens -> training -> OOF/test -> submission."""

import models  # noqa: F401  (binds a fast BLAS before anything imports mlx.core)
