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


class Unprintable:
    """An object whose ``repr`` and ``str`` raise, as a broken user class might."""

    def __repr__(self):
        raise RuntimeError("no repr")

    __str__ = __repr__
