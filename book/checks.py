"""Checks that a parallel computation gives the single-device answer, to float32 accuracy.

A parallel matmul adds its partial products in another order than one device would, so its
float32 result may differ from the plain product in the last bits, but never by more than
rounding allows. ``assert_product`` measures the error against a float64 reference, relative to
``|A| @ |B|`` (the size of the terms being added), so one bound fits every entry whatever
its own magnitude, and a wrong block (a misplaced index, a missing step) fails loudly.
"""

from __future__ import annotations

import math

import numpy as np

RTOL = 1e-5  # the least tolerance, for short sums
_EPS32 = float(np.finfo(np.float32).eps)


def tolerance(k: int) -> float:
    """The error allowed for sums of ``k`` float32 products, relative to ``|A| @ |B|``.

    Rounding errors of a sum grow about like ``sqrt(k)`` unit roundoffs whatever the order of
    the additions; 16 of them leave room for any blocking, and a misplaced block of ``A`` or
    ``B`` is still off by a large fraction of the scale.
    """
    return max(RTOL, 16 * _EPS32 * math.sqrt(k))


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


def assert_product(result, a, b, *, row_blocks: int = 1, rtol: float | None = None) -> float:
    """Assert that ``result`` equals ``a @ b`` to float32 accuracy; return the largest error.

    ``row_blocks`` is the number of row blocks the result is split into (one per device when
    it is sharded by rows), so a failure can say which device's rows are wrong. ``rtol``
    defaults to ``tolerance(K)``.
    """
    error = product_error(result, a, b)
    rtol = tolerance(np.shape(a)[1]) if rtol is None else rtol
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
