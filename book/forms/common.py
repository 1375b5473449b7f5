"""What the forms share: the meshes they offer and build, and a short reason for a failure."""

from __future__ import annotations

import functools
import itertools

from book import specs, validate

AXIS_TYPES = ("Explicit", "Auto")
DEFAULT_NAMES = {1: "data", 2: "data, model", 3: "pipe, data, model"}


def mesh_shapes(device_count: int) -> list[tuple[int, ...]]:
    """Mesh shapes that use every device: 1D, all 2D splits, and 3D splits without 1s."""
    device_count = validate.whole(
        device_count, "The device count", high=validate.MAX_DEVICES, error=specs.SpecError
    )
    shapes = [(device_count,)]
    divisors = [d for d in range(1, device_count + 1) if device_count % d == 0]
    shapes += [(a, device_count // a) for a in divisors]
    for a, b in itertools.product(divisors[1:], repeat=2):
        c, rest = divmod(device_count, a * b)
        if rest == 0 and c > 1:
            shapes.append((a, b, c))
    return shapes


@functools.lru_cache(maxsize=64)
def mesh(mesh_shape: tuple[int, ...], axis_names: tuple[str, ...], axis_type: str = "Explicit"):
    """The mesh of a choice, built once: going back to a choice costs nothing."""
    import jax
    from jax.sharding import AxisType

    kind = getattr(AxisType, axis_type)
    return jax.make_mesh(mesh_shape, axis_names, axis_types=(kind,) * len(mesh_shape))


def first_sentence(err) -> str:
    """The first sentence of an exception's message, short, for a form to show."""
    try:
        text = str(err).strip()
    except Exception:
        text = ""
    first = text.splitlines()[0] if text else type(err).__name__
    return first.split(". ")[0].rstrip(".")[:200]
