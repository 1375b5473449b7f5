"""Which of a notebook's code cells a few chosen cells need, by the names they read.

The worked-solution runs execute a chapter's exercises a second time; the chapter's own nbmake
item has run everything else already. So each second run keeps only the cells whose names the
solutions read, and the cells those cells read from, back to the setup: a solution that used a
name from a cell left out would fail with a NameError, never pass by accident.
"""

import ast
import re

from IPython.core.inputtransformer2 import TransformerManager

_IPYTHON = TransformerManager()  # turns %magics and !commands into Python
FILE_NAME = re.compile(r"[\w./-]+\.\w+")  # a string that may name a file: train.py


class _Names(ast.NodeVisitor):
    """Walks a cell in the order Python runs it: what it binds at the top level, and which
    names it reads before binding them (directly, or from inside a function it defines)."""

    def __init__(self):
        self.bound, self.reads = set(), set()

    def read(self, name):
        if name not in self.bound:
            self.reads.add(name)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and FILE_NAME.fullmatch(node.value):
            self.read(node.value)  # perhaps a file a %%writefile cell writes

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.read(node.id)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.read(node.target.id)
        self.visit(node.target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for statement in node.body + node.orelse:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_Import(self, node):
        for alias in node.names:
            self.read(f"{alias.name.split('.')[0]}.py")  # a module a cell may have written
            self.bound.add(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def inner_scope(self, local, body):
        """Visit body with local names bound for it alone, as a function's or a
        comprehension's own names are."""
        outer = set(self.bound)
        self.bound |= local
        for node in body:
            self.visit(node)
        self.bound = outer

    def visit_comprehension_like(self, node, results):
        outer = set(self.bound)
        for generator in node.generators:
            self.visit(generator.iter)
            self.visit(generator.target)
            for condition in generator.ifs:
                self.visit(condition)
        for result in results:
            self.visit(result)
        self.bound = outer

    def visit_ListComp(self, node):
        self.visit_comprehension_like(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self.visit_comprehension_like(node, [node.key, node.value])

    def function(self, node, body):
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(default)
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        arguments += [a for a in (node.args.vararg, node.args.kwarg) if a]
        local = {a.arg for a in arguments}
        for statement in body:  # a name the function assigns anywhere is its own
            for inner in ast.walk(statement):
                if isinstance(inner, ast.Name) and not isinstance(inner.ctx, ast.Load):
                    local.add(inner.id)
                elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    local.add(inner.name)
        self.inner_scope(local, body)

    def visit_FunctionDef(self, node):
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.function(node, node.body)
        self.bound.add(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.function(node, [node.body])

    def visit_ClassDef(self, node):
        for part in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(part)
        self.inner_scope(set(), node.body)
        self.bound.add(node.name)

    def visit_ExceptHandler(self, node):
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bound.add(node.name)
        for statement in node.body:
            self.visit(statement)


def names(source):
    """(names the cell binds at its top level, names it reads that it has not bound first).
    A %%writefile cell binds the name of the file it writes, which a later cell's string
    names."""
    if source.startswith("%%writefile"):
        return {source.split("\n")[0].split()[-1]}, set()
    walker = _Names()
    walker.visit(ast.parse(_IPYTHON.transform_cell(source)))
    return walker.bound, walker.reads


def needed(cells, targets, always=()):
    """The indices of cells ({index: source}) that targets need, targets and always included:
    walking back from the last cell, a cell is kept when it binds a name a kept later cell
    reads; then its own reads are wanted in turn."""
    keep, wanted = set(targets) | set(always), set()
    for i in sorted(cells, reverse=True):
        binds, reads = names(cells[i])
        if i in keep or binds & wanted:
            keep.add(i)
            wanted = (wanted - binds) | reads
    return keep
