"""Checks that a parallel computation gives the single-device answer, to float32 accuracy.

A parallel matmul adds its partial products in another order than one device would, so its
float32 result may differ from the plain product in the last bits, but never by more than
rounding allows. ``assert_product`` measures the error against a float64 reference, relative to
``|A| @ |B|`` (the size of the terms being added), so one bound fits every entry whatever
its own magnitude, and a wrong block (a misplaced index, a missing step) fails loudly.
"""

from __future__ import annotations

import numpy as np

# float32 rounding is 6e-8 per operation; sums of a few thousand terms stay well below this.
RTOL = 1e-5


def product_error(result, a, b) -> np.ndarray:
    """Each entry's error against ``a @ b`` in float64, relative to ``|a| @ |b|``."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    got = np.asarray(result, np.float64)
    if got.shape != (a64.shape[0], b64.shape[1]):
        raise AssertionError(
            f"The result has shape {got.shape}, but A @ B has shape {(a64.shape[0], b64.shape[1])}."
        )
    scale = np.abs(a64) @ np.abs(b64)
    return np.abs(got - a64 @ b64) / np.maximum(scale, np.finfo(np.float64).tiny)


def assert_product(result, a, b, *, row_blocks: int = 1, rtol: float = RTOL) -> float:
    """Assert that ``result`` equals ``a @ b`` to float32 accuracy; return the largest error.

    ``row_blocks`` is the number of row blocks the result is split into (one per device when
    it is sharded by rows), so a failure can say which device's rows are wrong.
    """
    error = product_error(result, a, b)
    bad = error > rtol
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        height = error.shape[0] // row_blocks if error.shape[0] % row_blocks == 0 else 0
        blocks = sorted({int(r) // height for r in rows}) if height else []
        where = f" (row blocks {blocks} of {row_blocks})" if row_blocks > 1 and blocks else ""
        r, c = np.unravel_index(np.argmax(error), error.shape)
        raise AssertionError(
            f"The result differs from A @ B in {int(bad.sum())} of {error.size} entries, in "
            f"{len(rows)} rows{where}; the worst, row {r} column {c}, is off by "
            f"{error[r, c]:.2g} of its scale, more than {rtol:g}."
        )
    return float(error.max())
