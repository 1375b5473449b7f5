"""The solution runs' slicing keeps every cell a solution needs and leaves out the rest."""

from cell_slice import names, needed

CELLS = {
    0: "import jax\nscale = 2",
    1: "losses = [train(s) for s in range(100)]  # slow, read by nothing later",
    2: "%%writefile worker.py\nprint('hi')",
    3: "def helper(x):\n    return x * scale",
    4: "for name in ['a', 'b']:\n    print(name)\nmesh = jax.make_mesh((8,), ('i',))",
    6: "%%writefile train.py\nstep = 1",
    7: "import train\nrows = 2",
    5: "def answer(x):\n    return helper(x) + sum(y for y in [x])\n"
    "check(answer, mesh, 'worker.py')",
}


def test_names_in_the_order_python_runs_them():
    assert names(CELLS[3]) == ({"helper"}, {"scale"})  # read when helper is called
    assert names(CELLS[4]) == ({"name", "mesh"}, {"print", "jax"})  # strings but file names
    assert names(CELLS[7]) == ({"train", "rows"}, {"train.py"})
    assert names(CELLS[2]) == ({"worker.py"}, set())
    assert not {"x", "y"} & names(CELLS[5])[1]


def test_needed_follows_reads_back_to_their_cells():
    assert needed(CELLS, [5]) == {0, 2, 3, 4, 5}  # not cell 1
    assert needed(CELLS, [7]) == {6, 7}
    assert needed({**CELLS, 8: "print('rows')"}, [8]) == {8}  # a string, not a name
    assert needed(CELLS, [5], always=[1]) == {0, 1, 2, 3, 4, 5}
    assert needed({0: "x = 1", 1: "x = 2", 2: "print(x)"}, [2]) == {1, 2}
    assert needed({0: "x = 1", 1: "x += 1", 2: "print(x)"}, [2]) == {0, 1, 2}
