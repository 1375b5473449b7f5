"""Values no reader means to pass, shared by the hostile-input tests."""


def holding_itself(kind):
    """A list, tuple-bearing list or dict that holds itself: ``repr`` copes, recursion does not."""
    if kind == "dict":
        found = {}
        found["me"] = found
        return found
    found = [1] if kind == "list" else []
    found.append(found)
    return found


def nested(depth=10_000):
    """A list inside a list, ``depth`` deep: finite, but deeper than Python's recursion limit."""
    found = []
    for _ in range(depth):
        found = [found]
    return found


def leaked_tracer():
    """A value traced inside ``jax.jit`` and kept after it returned: it has no number to read."""
    import jax
    import jax.numpy as jnp

    kept = []
    jax.jit(lambda: kept.append(jnp.zeros(()) + 1) or 0)()
    return kept[0]


class Unprintable:
    """An object whose ``repr`` and ``str`` raise, as a broken user class might."""

    def __repr__(self):
        raise RuntimeError("no repr")

    __str__ = __repr__


class LyingText(str):
    """A text whose own methods fail: only what it holds may be read."""

    def __len__(self):
        raise RuntimeError("len")

    def strip(self, *args):
        raise RuntimeError("strip")

    def split(self, *args):
        raise RuntimeError("split")

    def __iter__(self):
        raise RuntimeError("iter")

    def __eq__(self, other):
        raise RuntimeError("eq")

    def __hash__(self):
        raise RuntimeError("hash")


class LyingList(list):
    """A list whose length and iteration fail."""

    def __len__(self):
        raise RuntimeError("len")

    def __iter__(self):
        raise RuntimeError("iter")


class NegativeLength(list):
    """A list whose ``__len__`` says -1: ``len()`` itself raises, in no line of the reader's."""

    def __len__(self):
        return -1


class LyingTuple(tuple):
    """A tuple whose length, iteration and indexing fail."""

    def __len__(self):
        raise RuntimeError("len")

    def __iter__(self):
        raise RuntimeError("iter")

    def __getitem__(self, index):
        raise RuntimeError("getitem")


class LyingDict(dict):
    """A mapping whose length, keys and items fail."""

    def __len__(self):
        raise RuntimeError("len")

    def __iter__(self):
        raise RuntimeError("iter")

    def keys(self):
        raise RuntimeError("keys")

    def items(self):
        raise RuntimeError("items")


class LyingNumber(float):
    """A number whose conversion and comparisons fail."""

    def __float__(self):
        raise RuntimeError("float")

    def __lt__(self, other):
        raise RuntimeError("lt")

    def __gt__(self, other):
        raise RuntimeError("gt")


def lying(kind, held):
    """``held`` as a subclass of its built-in type whose own methods fail."""
    return {"text": LyingText, "list": LyingList, "tuple": LyingTuple, "dict": LyingDict}.get(
        kind, LyingNumber
    )(held)


def impostor(claimed):
    """An object whose ``__class__`` claims ``claimed``: ``isinstance`` believes it."""

    class Impostor:
        @property
        def __class__(self):
            return claimed

    return Impostor()


class Unreadable:
    """An object every attribute of which raises, ``__class__`` included."""

    def __getattribute__(self, name):
        raise RuntimeError(f"no {name}")
