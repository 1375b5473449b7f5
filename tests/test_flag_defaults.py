"""The GPU flag defaults that chapter 06 tabulates are those of the pinned jaxlib.

No GPU is needed: XLA writes, beside each module it dumps, the debug options that differ from
its defaults, and the GPU flags are among them on every platform. Set to the default the
chapter states, a flag must be missing from that file; set to another value, it must appear,
so that the check cannot pass by reading nothing.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "notebooks" / "06_collective_matmul.ipynb"
ANOTHER = {"true": "false", "false": "true"}  # and 0 for a number


def gpu_rows():
    """(flag, default) for each GPU row of the chapter's table of flags."""
    cells = json.loads(CHAPTER.read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.findall(r"^\| `--(\w+)` \| GPU \| (\S+) \|", text, re.M)


def differing(flags, folder):
    """The debug options XLA reports as set away from its defaults, with ``flags`` given."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join([f"--xla_dump_to={folder}", *flags])
    compile_one = "import jax; jax.jit(lambda x: x + 1)(1.0)"
    subprocess.run([sys.executable, "-c", compile_one], env=env, check=True, timeout=300)
    return "".join(p.read_text() for p in folder.glob("*.debug_options"))


def test_the_chapter_states_the_pinned_jaxlibs_defaults(tmp_path):
    rows = gpu_rows()
    assert len(rows) == 4, rows
    as_stated = differing([f"--{f}={v}" for f, v in rows], tmp_path / "stated")
    changed = differing([f"--{f}={ANOTHER.get(v, '0')}" for f, v in rows], tmp_path / "other")
    for flag, default in rows:
        assert f"{flag}:" not in as_stated, f"{flag}'s default is not {default}"
        assert f"{flag}:" in changed, f"{flag} is not reported when changed"
