"""The chapter conventions of the book, checked on the committed notebooks.

Run as a script (``python tests/nbconventions.py notebooks``) or through the test suite. Each
finding is one line naming the notebook, the cell and the rule.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from pathlib import Path

import book.display

ROOT = Path(__file__).resolve().parent.parent

# What older tutorials write; the pinned JAX has removed or replaced each of these.
STALE = [
    (r"\bPositionalSharding\b", "removed: use NamedSharding + PartitionSpec"),
    (r"jax\.experimental\.shard_map|experimental import shard_map", "use jax.shard_map"),
    (r"\bcheck_rep\s*=", "renamed: check_vma"),
    (r"\bjax\.tree_map\b", "removed: use jax.tree.map"),
    (r"xla_force_host_platform_device_count", "use book.devices.setup (jax_num_cpu_devices)"),
    (r"set_n_cpu_devices", "use book.devices.setup"),
    (r"^\s*with\s+mesh\s*:", "use jax.set_mesh(mesh)"),
    (r"\buse_mesh\b", "removed: use jax.set_mesh"),
    (r"device_put_(sharded|replicated)", "removed: use jax.device_put with a NamedSharding"),
    (r"\bPmapSharding\b", "removed"),
    (r"hlo_module_to_dot_graph", "gone: use book.hlo"),
    (r"(?<![\w.])eval\(", "never eval reader input: use book.specs"),
]


def repository() -> tuple[str, str]:
    """The repository URL and branch from _config.yml (read without a YAML dependency)."""
    text = (ROOT / "_config.yml").read_text()
    url = re.search(r"^\s+url:\s*(\S+)", text, re.M).group(1)
    branch = re.search(r"^\s+branch:\s*(\S+)", text, re.M).group(1)
    return url, branch


def source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _make_mesh_calls(src: str):
    for m in re.finditer(r"jax\.make_mesh\(", src):
        depth = 0
        for j in range(m.end() - 1, len(src)):
            depth += src[j] == "("
            depth -= src[j] == ")"
            if depth == 0:
                yield src[m.start() : j + 1]
                break


# The page shows the lesson: proofs of the book fold (these tags) or live in tests/.
MAX_WORDS, MAX_VISIBLE_CODE = 4000, 450
FOLDED = {"hide-input", "remove-input", "hide-cell", "remove-cell"}

# MyST syntax that Jupyter, Colab and Kaggle show as raw text in a notebook's markdown: a
# directive (":::{dropdown}", "```{note}"), a role ("{term}`mesh`") or a target "(label)=".
# Chapters fold with HTML <details> instead, which every one of them renders.
MYST_ONLY = re.compile(r"^\s*(?::{3,}|`{3,})\s*\{[\w-]+\}|\{[\w-]+\}`|^\(\S+\)=\s*$", re.M)


# book.display's functions that return what a notebook shows (a Rendered table or diagram):
# read from the module, so that a new one is checked too.
RENDERERS = {
    name
    for name, f in inspect.getmembers(book.display, inspect.isfunction)
    if str(inspect.signature(f).return_annotation) in ("Rendered", "Diagram")
}


def _unshown_renders(src: str):
    """Lines of book.display calls whose table or diagram a notebook discards: only a cell's
    last top-level expression is displayed, so one inside a block or before it shows nothing."""
    if src.lstrip().startswith("%%"):
        return
    text = "\n".join("" if line.lstrip()[:1] in "%!" else line for line in src.splitlines())
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    last = tree.body[-1] if tree.body else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and node is not last and isinstance(node.value, ast.Call):
            func = ast.unparse(node.value.func)
            if func.startswith("book.display.") and func.split(".")[-1] in RENDERERS:
                yield node.lineno, func


def check_notebook(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    code = [(i, c) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    found = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and (raw := MYST_ONLY.search(source(cell))):
            found.append(
                f"{path.name}: cell {i}: {raw.group(0).strip()!r} shows as raw text in Jupyter: "
                "fold with <details> and write plain Markdown"
            )
    for i, cell in code:
        src = source(cell)
        if cell.get("outputs") or cell.get("execution_count") is not None:
            found.append(f"{path.name}: cell {i} has outputs: commit chapters stripped")
        for line in src.splitlines():
            for pattern, why in STALE:
                if re.search(pattern, line):
                    found.append(f"{path.name}: cell {i}: `{line.strip()[:60]}`: {why}")
        for line, func in _unshown_renders(src):
            found.append(
                f"{path.name}: cell {i}, line {line}: {func}(...) is never shown (only a "
                "cell's last top-level expression is): wrap it in display(...)"
            )
        for call in _make_mesh_calls(src):
            if "axis_types" not in call:
                found.append(f"{path.name}: cell {i}: jax.make_mesh without axis_types")
    if path.name[:2].isdigit():
        found += _check_chapter(path, cells, code)
    return found


def _check_chapter(path, cells, code) -> list[str]:
    found = []
    first_md = source(cells[0]) if cells and cells[0]["cell_type"] == "markdown" else ""
    if not first_md.lstrip().startswith("# "):
        found.append(f"{path.name}: the first cell should be the H1 title and overview")
    setup = source(code[0][1]) if code else ""
    url, branch = repository()
    for needed, why in [
        (
            'importlib.metadata.version("jax-sharding-book")',
            "installs the book package only where its distribution is missing",
        ),
        ("sys.path.insert(0, str(clone))", "uses a clone's own book/ without the network"),
        ("--no-deps", "never reinstalls the runtime's jax"),
        (f"git+{url}@{branch}", "installs from the repository in _config.yml"),
        ("book.devices.setup(", "chooses the devices before JAX starts"),
    ]:
        if needed not in setup:
            found.append(f"{path.name}: the setup cell (first code cell) lacks {needed!r}: {why}")
    markdown = "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")
    for heading in ("Summary", "Exercises"):
        if not re.search(rf"^#+\s*{heading}", markdown, re.M):
            found.append(f"{path.name}: no {heading} section")
    words, visible = page_size(cells)
    if words > MAX_WORDS:
        found.append(f"{path.name}: {words:,} words of prose (at most {MAX_WORDS:,}): cut or fold")
    if visible > MAX_VISIBLE_CODE:
        found.append(
            f"{path.name}: {visible} lines of visible code (at most {MAX_VISIBLE_CODE}): move "
            "proofs of the book to tests/ or fold them (hide-input)"
        )
    return found


def page_size(cells) -> tuple[int, int]:
    """Words of prose (fenced code left out) and lines of code the page shows unfolded."""
    markdown = "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")
    words = len(re.sub(r"```.*?```", "", markdown, flags=re.S).split())
    visible = sum(
        len(source(c).splitlines())
        for c in cells
        if c["cell_type"] == "code" and not FOLDED & set(c.get("metadata", {}).get("tags", []))
    )
    return words, visible


def check_folder(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.glob("*.ipynb")):
        found += check_notebook(path)
    return found


if __name__ == "__main__":
    findings = check_folder(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "notebooks"))
    print("\n".join(findings))
    sys.exit(1 if findings else 0)
