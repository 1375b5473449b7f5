"""The rendered pages of chapters 10 and 11 carry what their cells showed, for every process."""

import pytest

import book.slurm

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]

SCRIPTS = [
    "multihost_worker.py",
    "multihost_train.py",
    "broken_worker.py",
    "stuck_worker.py",
    "slurm_job.sbatch",
    "cpu_job.sbatch",
    "mesh_worker.py",
    "tpu_slice.sh",
]


def page(html, stem):
    return (html / "notebooks" / f"{stem}.html").read_text()


def test_chapter_10_shows_the_pieces_and_the_training(built_book):
    text = page(built_book, "10_sharded_data_loading")
    assert "rows per read: [8, 8, 8, 8, 8, 8, 8, 8]" in text
    assert "each shard is the piece put there, not a copy: True" in text
    assert text.count("class='bk-dev") >= 8  # the example numbers on every device
    assert "epoch 1: 1024 examples, 1024 distinct" in text
    assert "48 steps, 1152 reads, the largest 8 rows" in text
    # make_array_from_callback: one call per device, replicas included; one for a replicated array.
    assert "4 distinct pieces, calls to the function: 8" in text
    assert "1 distinct piece, calls to the function: 1" in text


def test_chapter_11_shows_the_output_of_every_process(built_book):
    text = page(built_book, "11_multi_controller")
    # The launches of the tour, the training run and the mesh, one column each.
    for i in range(2):
        assert text.count(f">process {i}</div>") >= 3
        assert f"process_index: {i}" in text
        assert f"rows of each batch read here: {32 * i}:{32 * (i + 1)}" in text
    assert "np.asarray(x) raises: RuntimeError: Fetching value" in text
    assert "epoch 1: 512 examples over all processes, each once" in text
    # The same worker under srun and sbatch where the book was built with a cluster up.
    if book.slurm.usable_nodes():
        assert "found its peers through: detected by jax.distributed.initialize()" in text
        assert "JobState=COMPLETED" in text and "SLURM_PROCID=1 SLURM_LOCALID=0" in text
        assert "GPUs it may use: 0" in text
        assert "exit hook, no preemption service: the job ended" in text
        assert "JAX's defaults: still running, stopped by this cell," in text
    else:
        assert "No Slurm cluster answers here" in text
    # The mesh across the nodes: the all-reduce over hosts has a device of each process.
    assert "the processes of each group: [[0, 1], [0, 1], [0, 1], [0, 1]]" in text
    assert "FileNotFoundError: process 1 cannot find its shard of the data" in text
    # The deadlock: each process last printed the collective it waits in.
    assert "still ran after 10 s" in text
    assert "process 1 last printed: process 1: gathering x (an all-gather)" in text
    assert "heartbeat_timeout_seconds: " in text
    assert "[Gloo]" not in text
    # Every script is a %%writefile cell on the page; the notice that the file was written is not.
    for name in SCRIPTS:
        assert f'<span class="o">%%writefile</span> {name}' in text
    assert "#SBATCH --gpus-per-node=4" in text and "#SBATCH --ntasks-per-node=4" in text
    assert "Writing multihost_worker.py" not in text and "Overwriting" not in text
