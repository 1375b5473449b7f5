"""Every module that `book/` or a chapter imports comes with what pyproject.toml declares.

Colab and Kaggle install the package with ``--no-deps`` into a runtime that has its own
packages; a reader elsewhere gets only what pyproject lists. A missing entry would surface as an
ImportError in the middle of a chapter, so it is caught here instead.
"""

import ast
import importlib.metadata
import json
import re
import sys
import tomllib

from nbconventions import ROOT


def _top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _chapter_sources():
    """Each code cell as Python: magics dropped, ``%%writefile x.py`` cells as the file."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            lines = "".join(cell["source"]).splitlines()
            if lines and lines[0].startswith("%%"):
                if not re.match(r"%%writefile \S+\.py$", lines[0]):
                    continue
                lines = lines[1:]
            yield path.name, "\n".join(ln for ln in lines if not ln.startswith(("%", "!")))


def imported_modules() -> dict[str, str]:
    """Top-level third-party modules imported anywhere, each with one place that imports it."""
    found = {}
    sources = [(str(p.relative_to(ROOT)), p.read_text()) for p in (ROOT / "book").rglob("*.py")]
    sources += list(_chapter_sources())
    for where, source in sources:
        for name in _top_level_imports(source):
            found.setdefault(name, where)
    for name in list(found):
        if name in sys.stdlib_module_names or name == "book" or name in written_modules():
            del found[name]
    return found


def written_modules() -> set[str]:
    """Modules the chapters write themselves (``%%writefile x.py``), such as chapter 19's
    ``train``, which the chapter imports after writing it."""
    names = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            first = "".join(cell["source"]).partition("\n")[0]
            found = re.match(r"%%writefile (\w+)\.py$", first)
            if cell["cell_type"] == "code" and found:
                names.add(found.group(1))
    return names


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared_closure() -> set[str]:
    """pyproject's dependencies and, installed here, everything they require in turn."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [_requirement_name(r) for r in project["dependencies"]]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_requirement_name(r) for r in requires if "extra ==" not in r]
    return seen


def test_every_imported_module_is_declared_or_required_by_a_declared_package():
    providers = importlib.metadata.packages_distributions()
    closure = declared_closure()
    missing = []
    for module, where in sorted(imported_modules().items()):
        dists = {_requirement_name(d) for d in providers.get(module, [module])}
        if not dists & closure:
            missing.append(f"{module} (imported in {where}; from {sorted(dists)})")
    assert not missing, "add to pyproject's dependencies: " + "; ".join(missing)


def test_the_scan_sees_the_imports_that_matter():
    found = imported_modules()
    assert {"jax", "numpy", "ipywidgets", "matplotlib"} <= set(found)
    assert "IPython" in found  # a chapter displays HTML


def test_rich_is_declared_while_a_chapter_draws_with_visualize_array_sharding():
    chapters = "".join(source for _, source in _chapter_sources())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_requirement_name(r) for r in project["dependencies"]}
    assert ("visualize_array_sharding" in chapters) == ("rich" in declared)
