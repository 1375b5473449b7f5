"""Checks that a parallel computation gives the single-device answer, to float32 accuracy.

A parallel matmul adds its partial products in another order than one device would, so its
float32 result may differ from the plain product in the last bits, but never by more than
rounding allows. ``assert_product`` measures the error against a float64 reference, relative to
``|A| @ |B|`` (the size of the terms being added), so one bound fits every entry whatever
its own magnitude, and a wrong block (a misplaced index, a missing step) fails loudly. An
entry that is ``nan`` or infinite is never within a tolerance, so it fails too.

What is checked is refused in one sentence (``book.validate``) when it cannot be checked at
all: operands that are not matrices of finite numbers, or whose shapes do not multiply, and a
tolerance that is not a number between 0 and 1 (``nan`` would pass everything).
"""

from __future__ import annotations

import decimal
import fractions
import math

import numpy as np

from book import validate

RTOL = 1e-5  # the least tolerance, for short sums
_EPS32 = float(np.finfo(np.float32).eps)


def _numbers(value, name: str) -> np.ndarray:
    """``value`` as a float64 array, or one sentence when it holds no numbers."""
    array = None
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        raise validate.WrongKind(f"{name} holds masked entries, which hold no numbers.")
    if callable(getattr(value, "is_deleted", None)) and value.is_deleted():
        validate.array(value, name)  # says it was deleted, as a donated array is
    if not isinstance(value, (str, bytes, dict, set)):
        try:
            array = validate.widened(np.asarray(value))
            exact = (fractions.Fraction, decimal.Decimal)  # NumPy keeps them as objects
            if array.dtype.kind == "O" and all(type(x) in exact for x in array.flat):
                array = array.astype(np.float64)
        except Exception:  # noqa: BLE001 - a ragged or self-holding list, an odd object
            array = None
    if array is not None and array.dtype.kind == "c":
        raise validate.WrongKind(f"{name} must hold real numbers, not complex ones.")
    if array is None or array.dtype.kind not in "biuf":
        raise validate.WrongKind(
            f"{name} must be an array of numbers, not {validate.describe(value)}."
        )
    with np.errstate(over="ignore"):
        return array.astype(np.float64)


def _operand(value, name: str) -> np.ndarray:
    array = _numbers(value, name)
    if array.ndim != 2:
        raise validate.BadValue(f"{name} must be a matrix (2-D), not of shape {array.shape}.")
    if not np.isfinite(array).all():
        raise validate.BadValue(
            f"{name} holds nan or infinite values, so no product of it can be checked; use "
            "finite numbers."
        )
    return array


@validate.impostors_refused
def tolerance(k: int) -> float:
    """The error allowed for sums of ``k`` float32 products, relative to ``|A| @ |B|``.

    Rounding errors of a sum grow about like ``sqrt(k)`` unit roundoffs whatever the order of
    the additions; 16 of them leave room for any blocking, and a misplaced block of ``A`` or
    ``B`` is still off by a large fraction of the scale.
    """
    k = validate.whole(k, "k, the length of the sums", high=2**62, error=validate.BadValue)
    return max(RTOL, 16 * _EPS32 * math.sqrt(k))


@validate.impostors_refused
def product_error(result, a, b) -> np.ndarray:
    """Each entry's error against ``a @ b`` in float64, relative to ``|a| @ |b|``.

    A result of the wrong shape is a wrong result, so it raises ``AssertionError``; an entry
    that is ``nan`` or infinite has an infinite error.
    """
    a64, b64 = _operand(a, "A"), _operand(b, "B")
    if a64.shape[1] != b64.shape[0]:
        raise validate.BadValue(
            f"A is {a64.shape} and B is {b64.shape}: A @ B needs as many columns in A as rows in B."
        )
    got = _numbers(result, "The result")
    if got.shape != (a64.shape[0], b64.shape[1]):
        raise AssertionError(
            f"The result has shape {got.shape}, but A @ B has shape {(a64.shape[0], b64.shape[1])}."
        )
    with np.errstate(over="ignore"):
        scale = np.abs(a64) @ np.abs(b64)
    if not np.isfinite(scale).all():  # no relative error can be read against inf
        raise validate.BadValue(
            "A @ B overflows float64 (|A| @ |B| reaches infinity), so no result can be checked "
            "against it; scale A and B down."
        )
    # Below float32's normal range a right result loses up to one smallest normal a product
    # (XLA flushes subnormals to zero): there the error is judged against k of them.
    k = max(1, a64.shape[1])
    floor = k * float(np.finfo(np.float32).tiny) / tolerance(k)
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(got - a64 @ b64) / np.maximum(scale, floor)
    return np.where(np.isfinite(got), error, np.inf)


@validate.impostors_refused
def assert_product(result, a, b, *, row_blocks: int = 1, rtol: float | None = None) -> float:
    """Assert that ``result`` equals ``a @ b`` to float32 accuracy; return the largest error.

    ``row_blocks`` is the number of row blocks the result is split into (one per device when
    it is sharded by rows), so a failure can say which device's rows are wrong. ``rtol``
    defaults to ``tolerance(K)``.
    """
    error = product_error(result, a, b)
    row_blocks = validate.whole(
        row_blocks, "row_blocks", high=validate.MAX_DEVICES, error=validate.BadValue
    )
    if rtol is None:
        rtol = tolerance(max(1, np.shape(a)[1]))
    else:
        rtol = validate.number(
            rtol,
            "rtol",
            above=True,
            high=1.0,
            wanted="a tolerance above 0 such as 1e-5",
            error=validate.BadValue,
        )
    bad = error > rtol
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        height = error.shape[0] // row_blocks if error.shape[0] % row_blocks == 0 else 0
        blocks = sorted({int(r) // height for r in rows}) if height else []
        where = f" (row blocks {blocks} of {row_blocks})" if row_blocks > 1 and blocks else ""
        r, c = np.unravel_index(np.argmax(error), error.shape)
        got = _numbers(result, "The result")[r, c]
        if not np.isfinite(got):
            off = f"is {got}, not a finite number"
        elif np.abs(_operand(a, "A")[r]) @ np.abs(_operand(b, "B")[:, c]) == 0:  # no scale
            off = f"is {got:.6g} where A @ B is 0"
        else:
            off = f"is off by {error[r, c]:.2g} of its scale, more than {rtol:g}"
        raise AssertionError(
            f"The result differs from A @ B in {int(bad.sum())} of {error.size} entries, in "
            f"{len(rows)} rows{where}; the worst, row {r} column {c}, {off}."
        )
    return float(error.max()) if error.size else 0.0
