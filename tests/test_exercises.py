"""Every chapter's exercises: the stubs as a reader finds them, and the worked solutions.

The committed notebooks keep the reader's cells as stubs; as written, each checker must say the
exercise is not answered yet, never fail the chapter. Then each exercise cell is replaced by the
solution folded below it (keeping the checking call), the chapter is executed a second
time, and every checker must answer "Correct". A second run executes the setup and only the
cells whose names the solutions read (tests/cell_slice.py). These runs belong to no xdist
group, so they run beside the book build. They are nbclient runs rather than nbmake items:
nbmake executes notebook files as they are collected, while each of these runs a notebook
rewritten here and then reads the verdicts its cells showed; they take nbmake's cell timeout
and kernel from the project's pytest options, so both runs of a chapter execute alike.
"""

import re

import nbformat
import pytest
from nbclient import NotebookClient

import cell_slice
from nbconventions import ROOT

pytestmark = pytest.mark.slow

# The worked solution folded under the exercise: <details> with the summary "Solution", which
# the built book, JupyterLab, Colab and Kaggle all show folded.
SOLUTION = re.compile(r"<details>\s*<summary>Solution</summary>\s*\n```python\n(.*?)```", re.S)


def exercise_cells(nb):
    """(index of the exercise cell, the solution code shown after it) for each exercise."""
    found = []
    for i, cell in enumerate(nb.cells):
        if "exercise" not in cell.metadata.get("tags", []):
            continue
        later = "\n".join(c.source for c in nb.cells[i + 1 : i + 3] if c.cell_type == "markdown")
        match = SOLUTION.search(later)
        assert match, f"exercise cell {i} has no folded solution after it"
        found.append((i, match.group(1)))
    return found


def verdicts(cell) -> str:
    """What an exercise cell showed: the checker's verdict as text, and any error it raised."""
    shown = "".join(
        o.get("data", {}).get("text/plain", "") + o.get("text", "") for o in cell.outputs
    )
    errors = [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]
    return shown + "".join(errors)


def chapters_with_exercises():
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [p for p in paths if exercise_cells(nbformat.read(p, as_version=4))]


def test_the_first_chapters_have_checked_exercises():
    stems = [p.stem for p in chapters_with_exercises()]
    first = {
        "01_devices_and_meshes",
        "02_sharded_arrays",
        "03_automatic_parallelism",
        "04_explicit_sharding",
        "05_shard_map_and_collectives",
        "06_collective_matmul",
        "07_data_parallelism",
        "08_fsdp",
        "09_tensor_parallelism",
        "10_sharded_data_loading",
        "11_multi_controller",
    }
    assert first <= set(stems)


# What a reader may have set for the whole notebook before calling a checker: the checkers
# must answer under the book's own settings all the same, and leave the reader's in place.
READERS_SETTINGS = {
    "jax_numpy_rank_promotion": "raise",
    "jax_disable_jit": True,
    "jax_default_matmul_precision": "bfloat16",
}
CHECKED_AS_READERS_SET = """
_before = {{_n: getattr(jax.config, _n) for _n in {settings!r}}}
for _n, _v in {settings!r}.items():
    jax.config.update(_n, _v)
with jax.set_mesh(jax.make_mesh((2, 4), ("rows", "cols"))):
    _verdicts = [
{checks}
    ]
assert all(getattr(jax.config, _n) == _v for _n, _v in {settings!r}.items())
for _n, _v in _before.items():
    jax.config.update(_n, _v)
print(*map(repr, _verdicts), sep="\\n")
"""


@pytest.mark.parametrize("path", chapters_with_exercises(), ids=lambda p: p.stem)
def test_worked_solutions_pass_their_checkers(path, tmp_path, pytestconfig):
    """Each solution, checked right after the reader changed JAX's settings and set a mesh."""
    nb = nbformat.read(path, as_version=4)
    cells = exercise_cells(nb)
    for i, solution in cells:
        checks = [line for line in nb.cells[i].source.splitlines() if "book.exercises." in line]
        assert checks, f"exercise cell {i} calls no checker"
        listed = "".join(f"        {line.strip()},\n" for line in checks)
        check = CHECKED_AS_READERS_SET.format(settings=READERS_SETTINGS, checks=listed)
        nb.cells[i].source = f"import jax\n\n{solution}\n{check}"
    code = {i: c.source for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    importer = next(i for i in code if "import book.exercises" in code[i])
    keep = cell_slice.needed(code, [i for i, _ in cells], always=[min(code), importer])
    for i in set(code) - keep:
        nb.cells[i].source = ""  # ran in the chapter's own nbmake item
    NotebookClient(
        nb,
        timeout=pytestconfig.getoption("nbmake_timeout"),
        kernel_name=pytestconfig.getoption("nbmake_kernel") or "",  # "": the notebook's own
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    for i, _ in cells:
        shown = verdicts(nb.cells[i]).strip()
        assert shown and all(line.startswith("Correct:") for line in shown.splitlines()), (
            f"{path.stem} cell {i}: {shown}"
        )


@pytest.mark.parametrize("path", chapters_with_exercises(), ids=lambda p: p.stem)
def test_stubs_are_explained_not_failed(path, executed):
    """Read from the chapter as its nbmake item executed it, so it runs no second time here."""
    nb = nbformat.read(executed(path.stem), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    ran = all(c.execution_count for c in code)
    failed = any(o.output_type == "error" for c in code for o in c.outputs)
    assert ran and not failed, f"{path.stem} did not execute as written: see its own nbmake item"
    for i, _ in exercise_cells(nb):
        shown = verdicts(nb.cells[i])
        assert shown.startswith("Not answered yet"), f"{path.stem} cell {i}: {shown}"
