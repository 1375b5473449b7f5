"""The one exception style for mistakes a reader can make.

Notebooks print such an error as its one sentence, not a traceback: IPython calls
``_render_traceback_`` when an exception defines it.
"""


class ReaderError(Exception):
    """A mistake the reader can fix; the message is one sentence saying what to change."""

    def _render_traceback_(self):
        return [f"{type(self).__name__}: {self}"]
