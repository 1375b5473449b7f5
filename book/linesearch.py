"""A reader's pattern searched in a program's growing output, in a child process a deadline stops.

Python's ``re`` cannot be interrupted. ``validate.pattern`` refuses the patterns that can take
exponential time, but one with several wildcards, such as ``.*loss.*=.*nan``, still takes time
that grows as a power of a line's length where the line almost matches, so a worker printing a
long such line could hold ``wait_for`` for hours past its job's timeout. The search therefore
runs in a child Python process, which is killed when the deadline passes; only the text that
arrived since the last search is sent to it.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import time

from book import validate
from book.errors import ReaderError

# The child: one pattern, then one JSON-encoded text per line, answered with the offset of
# the first match in it, or -1.
_CHILD = (
    "import json, re, sys\n"
    "regex = re.compile(json.loads(sys.stdin.readline()), re.M)\n"
    "for line in sys.stdin:\n"
    "    found = regex.search(json.loads(line))\n"
    "    print(found.start() if found else -1, flush=True)\n"
)


class SearchTooSlow(ReaderError):
    """The search of an output had not ended when the job's deadline passed."""


class Search:
    """``search(output, deadline)``: the first match in ``output``, or None; call it again
    as the output grows. ``close()`` ends the child; use it as a context manager."""

    def __init__(self, regex: re.Pattern, what: str):
        self.regex, self.what = regex, what
        self.done = 0  # characters searched without a match, up to the end of a line
        self.seen = -1  # the output's length at the last search
        self.child: subprocess.Popen | None = None

    def __enter__(self) -> Search:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()
            for pipe in (self.child.stdin, self.child.stdout):
                pipe.close()
            self.child = None

    def __call__(self, output: str, deadline: float) -> re.Match | None:
        if len(output) == self.seen:
            return None
        self.seen = len(output)
        text = output[self.done :]
        start = self._ask(text, deadline)
        if start < 0:
            self.done += text.rfind("\n") + 1  # a line not yet ended is searched again
            return None
        # The child tried every earlier offset; trying this one alone takes no longer.
        return self.regex.match(text, start)

    def _ask(self, text: str, deadline: float) -> int:
        if self.child is None:
            self.child = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CHILD],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                encoding="utf-8",
                errors="surrogatepass",
            )
            self.child.stdin.write(json.dumps(self.regex.pattern) + "\n")
        self.child.stdin.write(json.dumps(text) + "\n")
        self.child.stdin.flush()
        ready, _, _ = select.select(
            [self.child.stdout], [], [], max(deadline - time.monotonic(), 0)
        )
        answer = self.child.stdout.readline() if ready else ""
        if not answer.strip().lstrip("-").isdigit():
            self.close()
            raise SearchTooSlow(
                f"Searching {self.what} for {validate.describe(self.regex.pattern, 60)} had not "
                "ended when the "
                "job's timeout passed: a pattern with several wildcards such as .* can take "
                "hours on a long line; make it more specific, e.g. r'^step 10 ', or anchor it "
                "with ^."
            )
        return int(answer)
