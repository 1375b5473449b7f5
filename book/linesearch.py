"""A reader's pattern searched in a program's growing output, in a child process a deadline stops.

Python's ``re`` cannot be interrupted. ``validate.pattern`` refuses the patterns that can take
exponential time, but one with several wildcards, such as ``.*loss.*=.*nan``, still takes time
that grows as a power of a line's length where the line almost matches, so a worker printing a
long such line could hold ``wait_for`` for hours past its job's timeout. The search therefore
runs in a child Python process, killed when the deadline passes (two seconds on, if less
remained, so that a last look is not taken for a slow pattern). Each line is searched
on its own, as ``wait_for`` promises a line, and only the lines that arrived since the last
search are sent; where the output is the last part of a longer log, which moves as the log
grows, the search finds its place again by the text it ended at.
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

# The child: one pattern, then one JSON-encoded list of lines per line of input, answered with
# the index of the first line the pattern matches, or -1.
_CHILD = (
    "import json, re, sys\n"
    "regex = re.compile(json.loads(sys.stdin.readline()), re.M)\n"
    "for given in sys.stdin:\n"
    "    lines = json.loads(given)\n"
    "    print(next((i for i, x in enumerate(lines) if regex.search(x)), -1), flush=True)\n"
)
_MARK = 200  # characters before the searched end that find it again in a moved window
_GRACE = 2.0  # seconds a search gets past the deadline: a plain pattern's search ends in it


class SearchTooSlow(ReaderError):
    """The search of an output had not ended when the job's deadline passed."""


class Search:
    """``search(output, deadline)``: the first match in ``output``, or None; call it again
    as the output grows. ``close()`` ends the child; use it as a context manager."""

    def __init__(self, regex: re.Pattern, what: str):
        if regex.search("") is not None:
            raise ReaderError(
                f"The pattern {validate.describe(regex.pattern, 60)} matches an empty line, so "
                "it would match before anything is printed; give text it must find, such as "
                "r'^step 10 '."
            )
        if validate.matches_newline(regex):
            raise ReaderError(
                "The pattern holds a newline, but each line is searched on its own; give a "
                "pattern for one line."
            )
        self.regex, self.what = regex, what
        self.done = 0  # characters searched without a match, up to the end of a line
        self.searched = ""  # those characters, to tell a grown output from a moved one
        self.mark = ""  # their last ones, to find the place again if the window moved
        self.seen = None  # the output at the last search
        self.settled = False  # whether that search took its last line as whole
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

    def __call__(self, output: str, deadline: float, ended: bool = False) -> re.Match | None:
        """The first match in a line of ``output`` that has ended. A last line without its
        newline is searched once it has stayed the same for a look (a prompt), or once the
        program has ``ended``: while it is being written it could match in part, "step 1"
        of "step 10"."""
        stable = output == self.seen  # (quick, even of a long log's last part)
        if stable and self.settled:
            return None
        self.seen = output
        if not output.startswith(self.searched):  # moved (a longer log's last part) or rewritten
            # The window moved where everything up to the last text searched is text searched
            # before: go on after it. Otherwise (a rewritten log) search it all again.
            found = output.find(self.mark) if self.mark else -1
            end = found + len(self.mark)
            self.done = end if found >= 0 and self.searched.endswith(output[:end]) else 0
            self.searched = output[: self.done]
        lines = output[self.done :].split("\n")  # the last one not yet ended, or ""
        printed = [line.removesuffix("\r") for line in lines]  # "\r\n" ends a line too
        whole = ended or stable
        index = self._ask(printed if whole else printed[:-1], deadline)
        self.settled = whole
        if index < 0:
            self.done = len(output) - len(lines[-1])  # a line not yet ended is searched again
            self.searched = output[: self.done]
            self.mark = self.searched[-_MARK:]
            return None
        # The child tried every earlier line; searching this one takes no longer.
        return self.regex.search(printed[index])

    def _ask(self, lines: list[str], deadline: float) -> int:
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
        self.child.stdin.write(json.dumps(lines) + "\n")
        self.child.stdin.flush()
        # At least _GRACE seconds, so that a search asked for as the deadline passes (the
        # last look at a job's output) is not taken for a slow pattern.
        wait = max(deadline - time.monotonic(), _GRACE)
        ready, _, _ = select.select([self.child.stdout], [], [], wait)
        answer = self.child.stdout.readline() if ready else ""
        if not answer.strip().lstrip("-").isdigit():
            self.close()
            raise SearchTooSlow(
                f"Searching {self.what} for {validate.describe(self.regex.pattern, 60)} had not "
                f"ended after {wait:.0f} s, when the "
                "job's timeout had passed: a pattern with several wildcards such as .* can take "
                "hours on a long line; make it more specific, e.g. r'^step 10 ', or anchor it "
                "with ^."
            )
        return int(answer)
