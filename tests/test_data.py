"""book.data: the sharded loader's row plan, reads and epoch checks, on 8 mock CPU devices."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import book.data
from book.data import Batch, Loader, Source, check_epoch, epoch_order
from book.errors import ReaderError

N, FEATURES = 96, 3


@pytest.fixture
def source(tmp_path):
    x = np.arange(N * FEATURES, dtype=np.float32).reshape(N, FEATURES)
    return book.data.write(tmp_path, x=x, y=np.arange(N, dtype=np.int32) % 5, id=np.arange(N))


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))


def from_callback(batch, sharding):
    return jax.make_array_from_callback(batch.shape, sharding, batch.read)


def from_single_device_arrays(batch, sharding):
    index_map = sharding.addressable_devices_indices_map(batch.shape)
    pieces = [jax.device_put(batch.read(index), d) for d, index in index_map.items()]
    return jax.make_array_from_single_device_arrays(batch.shape, sharding, pieces)


def from_process_local_data(batch, sharding):
    mine = book.data.process_slice(sharding, batch.shape)
    return jax.make_array_from_process_local_data(sharding, batch.read((mine,)), batch.shape)


BUILDERS = [from_callback, from_single_device_arrays, from_process_local_data]


def test_source_reads_only_the_rows_asked_for(source, tmp_path):
    assert source.num_examples == N and set(source.fields) == {"x", "y", "id"}
    assert isinstance(source.fields["x"], np.memmap)
    rows = np.array([5, 0, 7])
    np.testing.assert_array_equal(source.read("id", rows), rows)
    np.testing.assert_array_equal(source.read("x", rows)[:, 0], rows * FEATURES)
    assert source.reads == [3, 3]
    assert "96 examples" in repr(Source(tmp_path))
    many = np.broadcast_to(np.int64(0), (10**12,))  # no memory, but no time to scan it
    with pytest.raises(ReaderError, match="read at most"):
        source.read("id", many)


def test_source_errors_are_one_sentence(tmp_path):
    with pytest.raises(ReaderError, match="no .npy files"):
        Source(tmp_path)
    with pytest.raises(ReaderError, match="different numbers of rows"):
        book.data.write(tmp_path, a=np.zeros(3), b=np.zeros(4))


def test_epoch_order_is_a_seeded_permutation():
    a = epoch_order(N, seed=0, epoch=0)
    np.testing.assert_array_equal(np.sort(a), np.arange(N))
    np.testing.assert_array_equal(a, epoch_order(N, seed=0, epoch=0))
    assert not np.array_equal(a, epoch_order(N, seed=0, epoch=1))
    assert not np.array_equal(a, epoch_order(N, seed=1, epoch=0))


def test_batch_reads_the_piece_an_index_names(source):
    rows = np.array([9, 3, 4, 1])
    batch = Batch(source, "x", rows)
    assert batch.shape == (4, FEATURES) and batch.dtype == np.float32
    np.testing.assert_array_equal(batch.read(), source.fields["x"][rows])
    piece = batch.read((slice(1, 3), slice(0, 2)))
    np.testing.assert_array_equal(piece, source.fields["x"][rows[1:3], :2])
    assert source.reads[-1] == 2


def test_process_slice_of_one_process_is_the_whole_batch(mesh):
    sharding = NamedSharding(mesh, P("data"))
    assert book.data.process_slice(sharding, (16, 3)) == slice(0, 16)
    mesh2 = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    assert book.data.process_slice(NamedSharding(mesh2, P("data")), (6,)) == slice(0, 6)


def test_process_slice_rejects_rows_that_are_not_adjacent():
    class Scattered:
        def addressable_devices_indices_map(self, shape):
            return {"a": (slice(0, 2),), "b": (slice(4, 6),)}

    with pytest.raises(book.data.ScatteredRows):
        book.data.process_slice(Scattered(), (8,))


@pytest.mark.parametrize("build", BUILDERS, ids=lambda f: f.__name__)
def test_every_builder_gives_the_batch_the_rows_name(source, mesh, build):
    sharding = NamedSharding(mesh, P("data"))
    rows = epoch_order(N, 0, 0)[:16]
    x = build(Batch(source, "x", rows), sharding)
    assert x.shape == (16, FEATURES) and x.sharding == sharding
    np.testing.assert_array_equal(np.asarray(x), source.fields["x"][rows])
    for shard in x.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), source.fields["x"][rows][shard.index])


def test_per_device_builders_never_read_a_whole_batch(source, mesh):
    sharding = NamedSharding(mesh, P("data"))
    for build in (from_callback, from_single_device_arrays):
        source.reads.clear()
        batches = list(Loader(source, 32, sharding, build).epoch(0))
        assert len(batches) == N // 32
        assert max(source.reads) == 32 // 8
        assert sum(source.reads) == 3 * N  # three fields, every row once


@pytest.mark.parametrize("build", BUILDERS, ids=lambda f: f.__name__)
def test_every_example_once_per_epoch_from_what_the_devices_hold(source, mesh, build):
    loader = Loader(source, 24, NamedSharding(mesh, P("data")), build, seed=3)
    assert len(loader) == loader.steps_per_epoch == N // 24
    orders = []
    for epoch in range(2):
        ids = [book.data.local_values(batch["id"]) for batch in loader.epoch(epoch)]
        check_epoch(np.concatenate(ids), N)
        orders.append(np.concatenate(ids))
        for batch in loader.epoch(epoch):
            np.testing.assert_array_equal(
                np.asarray(batch["x"]), source.fields["x"][np.asarray(batch["id"])]
            )
    assert not np.array_equal(orders[0], orders[1])
    np.testing.assert_array_equal(loader.batch_rows(1).ravel(), orders[1])


def test_loader_takes_a_sharding_per_field(source, mesh):
    shardings = {
        "x": NamedSharding(mesh, P("data", None)),
        "y": NamedSharding(mesh, P()),
        "id": NamedSharding(mesh, P("data")),
    }
    batch = next(Loader(source, 16, shardings, from_callback).epoch(0))
    assert batch["y"].sharding.is_fully_replicated and not batch["x"].sharding.is_fully_replicated
    np.testing.assert_array_equal(
        book.data.local_values(batch["y"]), source.fields["y"][np.asarray(batch["id"])]
    )


def test_a_batch_size_that_leaves_examples_out_is_refused(source, mesh):
    with pytest.raises(ReaderError, match="do not split into batches of 64"):
        Loader(source, 64, NamedSharding(mesh, P("data")), from_callback)
    with pytest.raises(ReaderError, match="positive whole number"):
        Loader(source, 0, NamedSharding(mesh, P("data")), from_callback)


def test_check_epoch_finds_missing_and_repeated_examples():
    check_epoch(np.array([2, 0, 1]), 3)
    with pytest.raises(AssertionError, match="missed 1 examples and repeated 1"):
        check_epoch(np.array([0, 0, 1]), 3)
    with pytest.raises(AssertionError, match="saw 2 rows"):
        check_epoch(np.array([0, 1]), 3)


def test_local_values_counts_replicated_rows_once(mesh):
    mesh2 = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(np.arange(6), NamedSharding(mesh2, P("data")))
    np.testing.assert_array_equal(book.data.local_values(x), np.arange(6))
    sharded = jax.device_put(np.arange(8), NamedSharding(mesh, P("data")))
    np.testing.assert_array_equal(book.data.local_values(sharded), np.arange(8))


@pytest.mark.parametrize("spec", [P(None, "model"), P("data", "model"), P("model", "data")])
def test_local_values_assembles_blocks_of_every_dimension(spec):
    mesh2 = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    a = np.arange(64.0).reshape(8, 8)
    x = jax.device_put(a, NamedSharding(mesh2, spec))
    np.testing.assert_array_equal(book.data.local_values(x), a)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"global_batch": 12}, "does not split over the 8 devices"),
        ({"global_batch": True}, "positive whole number"),
        ({"global_batch": 8.0}, "positive whole number"),
        ({"global_batch": 10**10000}, "too large"),
        ({"global_batch": 192}, "larger than the 96 examples"),
        ({"seed": None}, "not None"),
        ({"seed": -1}, "at least 0"),
        ({"build": "from_callback"}, "must be a function"),
        ({"sharding": P("data")}, "jax.sharding.Sharding"),
        ({"sharding": {"x": None}}, "no sharding for field"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_the_loader_refuses_what_cannot_work_when_it_is_made(source, mesh, kwargs, words):
    args = {
        "global_batch": 16,
        "sharding": NamedSharding(mesh, P("data")),
        "build": from_callback,
        "seed": 0,
    }
    args.update(kwargs)
    with pytest.raises(ReaderError, match=words) as caught:
        Loader(source, **args)
    assert "\n" not in str(caught.value)


def test_a_sharding_longer_than_a_fields_rank_is_refused(source, mesh):
    shardings = {
        "x": NamedSharding(mesh, P("data", None)),
        "y": NamedSharding(mesh, P("data", None)),  # y has one dimension
        "id": NamedSharding(mesh, P("data")),
    }
    with pytest.raises(ReaderError, match="field 'y' has 2 entries"):
        Loader(source, 16, shardings, from_callback)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"x": np.zeros((0, 3))}, "has no examples"),
        ({"x": np.float32(3.0)}, "a single value"),
        ({"x": np.array(["a", "b"])}, "which a jax.Array cannot hold"),
        ({"x": np.array([object(), 1])}, "which a jax.Array cannot hold"),
        ({"x": np.zeros(4), "y": np.zeros(5)}, "different numbers of rows"),
        ({}, "at least one field"),
    ],
    ids=["empty", "0-d", "strings", "objects", "mismatch", "none"],
)
def test_write_refuses_fields_the_loader_cannot_serve(tmp_path, fields, words):
    with pytest.raises(ReaderError, match=words):
        book.data.write(tmp_path, **fields)
    assert not list(tmp_path.glob("*.npy"))  # nothing written


@pytest.mark.parametrize(
    "dtype, wider", [("bfloat16", "float32"), ("float8_e4m3fn", "float32"), ("int4", "int32")]
)
def test_fields_npy_cannot_store_are_refused_with_the_way_round_it(tmp_path, dtype, wider):
    import jax.numpy as jnp

    with pytest.raises(ReaderError, match=f"cannot store.*write it as {wider}"):
        book.data.write(tmp_path, x=np.asarray(jnp.ones((4, 2), getattr(jnp, dtype))))


def test_check_epoch_counts_ids_outside_the_epoch_as_such():
    with pytest.raises(AssertionError, match="missed 0 examples and repeated 0, and 1 ids"):
        check_epoch(np.array([0, 1, 2, 7]), 3)
    with pytest.raises(AssertionError, match="missed 1 examples and repeated 0, and 1 ids"):
        check_epoch(np.array([0, 1, 9]), 3)
    with pytest.raises(AssertionError, match="missed 1 examples and repeated 0, and 1 ids"):
        check_epoch(np.array([0, -1, 2]), 3)
    with pytest.raises(ReaderError, match="whole numbers"):
        check_epoch(np.array([0.0, 1.0, 2.0]), 3)
    with pytest.raises(ReaderError, match="an epoch holds at most"):  # a view, not a copy
        check_epoch(np.broadcast_to(np.arange(8), (10**10, 8)), 8)
    with pytest.raises(ReaderError, match="masked entries, which are no example numbers"):
        check_epoch(np.ma.array([0, 1, 2], mask=[0, 0, 1]), 3)


def test_batches_and_reads_refuse_what_is_not_theirs(source):
    with pytest.raises(ReaderError, match="is not a field of the source"):
        Batch(source, "z", np.array([0, 1]))
    with pytest.raises(ReaderError, match="example numbers from 0 to 95"):
        Batch(source, "x", np.array([0, 96]))
    with pytest.raises(ReaderError, match="tuple of slices"):
        Batch(source, "x", np.array([0, 1])).read(0)
    with pytest.raises(ReaderError, match="step of 0"):
        Batch(source, "x", np.array([0, 1])).read((slice(0, 2, 0),))
    with pytest.raises(ReaderError, match="slice bound 0.5"):
        Batch(source, "x", np.array([0, 1])).read((slice(0.5, None),))
    with pytest.raises(ReaderError, match="not None"):
        epoch_order(N, None, 0)


@pytest.mark.parametrize(
    "values, words",
    [
        (np.full(8, 2**40 + 7), "beyond int32"),
        (np.full(8, np.iinfo(np.uint64).max), "beyond uint32"),
        (np.full(8, 1e300), "beyond float32"),
        (np.ones(8, np.longdouble), "wider than any float"),
        (np.ma.masked_array(np.arange(8), mask=[0, 1] * 4), "masked array"),
    ],
)
def test_values_jax_would_change_are_refused_when_written(tmp_path, values, words):
    with pytest.raises(ReaderError, match=words):
        book.data.write(tmp_path, x=values)
    assert not list(tmp_path.iterdir())


def test_a_folder_under_home_is_written_there(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    book.data.write("~/fields", x=np.arange(4))
    assert (tmp_path / "fields" / "x.npy").exists() and not (tmp_path / "~").exists()


@pytest.mark.parametrize(
    "values, words",
    [(np.full(8, 1e300 + 1e300j), "beyond float32"), (np.full(8, 1e-50), "beyond float32")],
)
def test_complex_and_vanishing_values_are_refused_when_written(tmp_path, values, words):
    with pytest.raises(ReaderError, match=words):
        book.data.write(tmp_path, x=values)


def test_a_field_of_the_other_byte_order_is_written_in_this_ones(tmp_path):
    source = book.data.write(tmp_path, x=np.arange(8, dtype=">i4" if np.little_endian else "<i4"))
    assert source.fields["x"].dtype.isnative
    np.testing.assert_array_equal(source.read("x", [0, 7]), [0, 7])


def test_a_folder_np_save_wrote_is_checked_as_write_checks(tmp_path):
    np.save(tmp_path / "x.npy", np.full(8, 2**40))
    with pytest.raises(ReaderError, match="beyond int32"):
        book.data.Source(tmp_path)


def test_a_source_opened_with_x64_on_is_checked_when_read_with_it_off(tmp_path):
    np.save(tmp_path / "x.npy", np.full(8, 2**40))
    np.save(tmp_path / "y.npy", np.arange(8, dtype=np.int64))
    with jax.enable_x64(True):
        source = book.data.Source(tmp_path)
        assert source.read("x", [0])[0] == 2**40
    np.testing.assert_array_equal(source.read("y", [1, 2]), [1, 2])  # within int32
    with pytest.raises(ReaderError, match="beyond int32"):
        source.read("x", [0])


def test_a_source_requires_fields_of_ranks_and_a_local_folder(tmp_path):
    source = book.data.write(tmp_path / "d", x=np.ones((8, 2)), y=np.arange(8))
    source.require(x=2, y=1)
    with pytest.raises(ReaderError, match="holds no field 'id'; write x, id with"):
        source.require(x=2, id=1)
    with pytest.raises(ReaderError, match="Field 'y' of .* has 1 dimension"):
        source.require(y=2)
    for url in ("gs://bucket/data", "s3:/b/c"):
        with pytest.raises(ReaderError, match="is a URL"):
            book.data.write(url, x=np.ones((4, 2)))
    assert not (tmp_path / "gs:").exists()


def test_the_loader_refuses_a_deleted_array_from_build(source, mesh):
    sharding = NamedSharding(mesh, P("data"))

    def deleted(batch, sharding):
        array = jax.make_array_from_callback(batch.shape, sharding, batch.read)
        array.delete()
        return array

    loader = book.data.Loader(source, 32, sharding, deleted)
    with pytest.raises(ReaderError, match="build returned a deleted array"):
        next(iter(loader.epoch(0)))


@pytest.mark.parametrize("ranks", [{"x": "2"}, {"x": True}, {"x": None}, {"x": 2.5}, {"": 1}])
def test_require_refuses_a_call_of_odd_ranks(tmp_path, ranks):
    source = book.data.write(tmp_path / "d", x=np.ones((8, 2)))
    with pytest.raises(ReaderError, match="require takes fields and their numbers"):
        source.require(**ranks)


@pytest.mark.parametrize("url", [" gs://bucket/data", "\u200bgs://b"])
def test_a_url_behind_blanks_is_a_url(tmp_path, url, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ReaderError, match="is a URL"):
        book.data.write(url, x=np.ones((4, 2)))
    assert list(tmp_path.iterdir()) == []
