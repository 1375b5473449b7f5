"""The committed chapters follow the book's conventions, and the checker catches violations."""

import json

import nbformat
import pytest

import nbconventions
from nbconventions import ROOT, check_folder, check_notebook, repository


def test_committed_chapters_follow_the_conventions():
    assert check_folder(ROOT / "notebooks") == []


def test_every_chapter_is_in_the_table_of_contents():
    toc = (ROOT / "_toc.yml").read_text()
    chapters = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert chapters, "no chapters found"
    for stem in chapters:
        assert f"notebooks/{stem}" in toc


def good_setup():
    url, branch = repository()
    return (
        "if clone is not None:\n    sys.path.insert(0, str(clone))\n"
        'elif not importlib.metadata.version("jax-sharding-book"):\n'
        f'    pip("--no-deps", "git+{url}@{branch}")\nimport book.devices\nbook.devices.setup(8)'
    )


def write(tmp_path, name, code_cells, markdown="# Title\n\n## Summary\n\n## Exercises"):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(markdown)]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in code_cells]
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def test_a_good_chapter_passes(tmp_path):
    assert check_notebook(write(tmp_path, "01_x.ipynb", [good_setup(), "x = 1"])) == []


@pytest.mark.parametrize(
    "cell, rule",
    [
        ("from jax.experimental.shard_map import shard_map", "jax.shard_map"),
        ("f = shard_map(g, mesh, check_rep=False)", "check_vma"),
        ("with mesh:\n    y = f(x)", "jax.set_mesh"),
        ("jax.tree_map(f, t)", "jax.tree.map"),
        ("s = PositionalSharding(devices)", "NamedSharding"),
        ("jax.device_put_replicated(x, devices)", "device_put"),
        ("m = jax.make_mesh((2, 4), ('a', 'b'))", "without axis_types"),
        ("spec = eval(text)", "never eval"),
    ],
)
def test_stale_code_is_caught(tmp_path, cell, rule):
    found = check_notebook(write(tmp_path, "01_x.ipynb", [good_setup(), cell]))
    assert len(found) == 1 and rule in found[0]


def test_make_mesh_with_axis_types_over_several_lines_passes(tmp_path):
    cell = "m = jax.make_mesh(\n    (2, 4),\n    ('a', 'b'),\n    axis_types=(Explicit,) * 2,\n)"
    assert check_notebook(write(tmp_path, "01_x.ipynb", [good_setup(), cell])) == []


def test_outputs_missing_setup_and_sections_are_caught(tmp_path):
    path = write(tmp_path, "02_y.ipynb", ["import jax", good_setup()], markdown="# Title")
    nb = json.loads(path.read_text())
    nb["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1"}]
    path.write_text(json.dumps(nb))
    found = "\n".join(check_notebook(path))
    assert "has outputs" in found
    assert "lacks 'book.devices.setup('" in found
    assert "--no-deps" in found
    assert "no Summary" in found and "no Exercises" in found


def test_repository_is_read_from_the_config():
    url, branch = nbconventions.repository()
    assert url.startswith("https://github.com/") and branch == "main"


@pytest.mark.parametrize(
    "markdown",
    [
        ":::{dropdown} Solution\nx = 1\n:::",
        "```{note}\nA note.\n```",
        "See {term}`mesh`.",
        "(sec-meshes)=\n## Meshes",
    ],
)
def test_myst_that_notebooks_show_raw_is_caught(tmp_path, markdown):
    path = write(
        tmp_path,
        "01_x.ipynb",
        [good_setup()],
        markdown=f"# T\n\n{markdown}\n\n## Summary\n\n## Exercises",
    )
    found = check_notebook(path)
    assert len(found) == 1 and "raw text in Jupyter" in found[0]


def test_details_and_plain_fences_pass(tmp_path):
    markdown = (
        "# T\n\n<details>\n<summary>Solution</summary>\n\n```python\nx = {1: 2}\n```\n\n"
        "</details>\n\nA set {a} and `f(x)`.\n\n## Summary\n\n## Exercises"
    )
    assert check_notebook(write(tmp_path, "01_x.ipynb", [good_setup()], markdown=markdown)) == []


def test_pages_over_their_limits_are_caught(tmp_path):
    long_prose = "# T\n\n" + "word " * 4001 + "\n\n## Summary\n\n## Exercises"
    path = write(tmp_path, "01_x.ipynb", [good_setup(), "x = 1\n" * 451], markdown=long_prose)
    found = "\n".join(check_notebook(path))
    assert "4,00" in found and "words of prose" in found
    assert "lines of visible code" in found
    nb = json.loads(path.read_text())
    nb["cells"][2]["metadata"]["tags"] = ["hide-input"]  # folded proofs do not count
    path.write_text(json.dumps(nb))
    assert "visible code" not in "\n".join(check_notebook(path))


@pytest.mark.parametrize(
    "cell, shown",
    [
        ("book.display.table(['a'], [[1]])", True),  # the cell's last expression
        ("display(book.display.table(['a'], [[1]]))", True),
        ("if True:\n    book.display.table(['a'], [[1]])", False),
        ("book.display.table(['a'], [[1]])\nx = 1", False),
        ("for k in (1, 2):\n    book.display.collective_table(k)", False),
        ("book.display.timeline(ops, kinds)\nplt.show()", True),  # draws a figure
    ],
)
def test_a_table_a_notebook_would_not_show_is_caught(tmp_path, cell, shown):
    found = check_notebook(write(tmp_path, "01_x.ipynb", [good_setup(), cell]))
    assert (found == []) is shown, found
