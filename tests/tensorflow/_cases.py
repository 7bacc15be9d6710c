"""Conformance cases of hora.tensorflow and hora.tensorflow.keras, run inside real ranks.

`run_all()` runs every case on the rank it is called on and returns {case: "ok" | error text};
one hora job per world size runs them all (TensorFlow's import costs seconds per process), and
the tests assert per case. Expected values come from the rank and the world size.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import hora.keras as hkeras
import hora.tensorflow as hvd
import hora.tensorflow.keras as khvd

CASES: dict[str, Callable[[int, int], None]] = {}

# Every dtype Horovod's TF ops take, with what a Sum of ranks' (r + 1) must give.
DTYPES = (
    tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64,
    tf.float16, tf.bfloat16, tf.float32, tf.float64,
)  # fmt: skip


def case(fn: Callable[[int, int], None]) -> Callable[[int, int], None]:
    CASES[fn.__name__] = fn
    return fn


def expect_raises(exc: type[BaseException], fn: Callable[[], object], match: str = "") -> str:
    try:
        fn()
    except exc as e:
        assert match in str(e), f"{type(e).__name__}({e}) lacks {match!r}"
        return str(e)
    raise AssertionError(f"{exc.__name__} not raised")


def close(a: tf.Tensor, b: object, dtype: tf.DType | None = None) -> None:
    a = tf.convert_to_tensor(a)
    if dtype is not None:
        assert a.dtype == dtype, (a.dtype, dtype)
    got = tf.cast(a, tf.float64).numpy()
    want = np.asarray(b, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.allclose(got, want, rtol=1e-2, atol=1e-2), (got, want)


# ----- basics ------------------------------------------------------------------------------------
@case
def basics(r: int, n: int) -> None:
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (r, n)
    assert (hvd.local_rank(), hvd.local_size(), hvd.cross_size()) == (r, n, 1)
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert khvd.size() == n and hkeras.rank() == r and hkeras.callbacks is khvd.callbacks
    assert not hasattr(hvd, "allreduce_async")  # torch-tensor forms stay in hora.torch


# ----- the ops, eagerly and inside tf.function, every dtype ---------------------------------------
@case
def allreduce_every_dtype(r: int, n: int) -> None:
    total = n * (n + 1) / 2
    for dtype in DTYPES:
        x = tf.cast(tf.fill([3, 2], r + 1), dtype)
        close(hvd.allreduce(x, op=hvd.Sum), np.full((3, 2), total), dtype)
        close(hvd.allreduce(x, op=hvd.Max), np.full((3, 2), n), dtype)
        close(hvd.allreduce(x, op=hvd.Min), np.ones((3, 2)), dtype)
    close(hvd.allreduce(tf.fill([4], float(r + 1))), np.full(4, total / n), tf.float32)
    close(hvd.allreduce(tf.constant(float(r))), (n - 1) / 2)  # a scalar
    flag = tf.constant([r == 0, True])
    got = hvd.allreduce(flag, op=hvd.Max)
    assert got.dtype == tf.bool and got.numpy().tolist() == [True, True]
    scaled = hvd.allreduce(tf.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    close(scaled, np.full(2, n))
    fp16 = hvd.allreduce(tf.fill([3], 1.5), compression=hvd.Compression.fp16, op=hvd.Sum)
    close(fp16, np.full(3, 1.5 * n), tf.float32)
    expect_raises(NotImplementedError, lambda: hvd.allreduce(tf.ones(1), op=hvd.Adasum))


@case
def ops_inside_tf_function(r: int, n: int) -> None:
    @tf.function
    def step(x: tf.Tensor) -> list[tf.Tensor]:
        total = hvd.allreduce(x, op=hvd.Sum)
        rows = hvd.allgather(tf.reshape(x, [1, -1]))
        root = hvd.broadcast(x, root_rank=n - 1)
        group = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)
        return [total, rows, root, *group]

    for k in range(3):  # the same traced names every step (and a retrace for k == 2)
        x = tf.fill([2], float(r + k)) if k < 2 else tf.fill([3], float(r + k))
        total, rows, root, g1, g2 = step(x)
        width = 2 if k < 2 else 3
        s = sum(range(n)) + n * k
        close(total, np.full(width, s))
        assert rows.shape == (n, width) and tf.reduce_all(
            rows[:, 0] == tf.range(n, dtype=tf.float32) + k
        )
        close(root, np.full(width, n - 1 + k))
        close(g1, np.full(width, s)) or close(g2, np.full(width, 2 * s))
    assert step.experimental_get_tracing_count() == 2


@case
def allgather_uneven_every_dtype(r: int, n: int) -> None:
    for dtype in DTYPES:
        x = tf.cast(tf.fill([r + 1, 2], r), dtype)
        got = hvd.allgather(x)
        want = np.concatenate([np.full((k + 1, 2), k) for k in range(n)])
        close(got, want, dtype)
    a, b = hvd.grouped_allgather([tf.fill([r + 1], r), tf.fill([1, 3], float(r))])
    close(a, np.concatenate([np.full(k + 1, k) for k in range(n)]))
    close(b, np.repeat(np.arange(n, dtype=float)[:, None], 3, axis=1))
    expect_raises(ValueError, lambda: hvd.allgather(tf.constant(1.0)), "dimension")


@case
def broadcast_every_dtype(r: int, n: int) -> None:
    for dtype in DTYPES:
        for root in range(n):
            got = hvd.broadcast(tf.cast(tf.fill([2, 2], r + 1), dtype), root_rank=root)
            close(got, np.full((2, 2), root + 1), dtype)
    expect_raises(
        tf.errors.InvalidArgumentError, lambda: hvd.broadcast(tf.ones(1), root_rank=n), "root"
    )


@case
def alltoall_and_reducescatter(r: int, n: int) -> None:
    even = hvd.alltoall(tf.fill([2 * n], r))
    close(even, np.repeat(np.arange(n), 2))
    splits = tf.constant([k + 1 for k in range(n)], dtype=tf.int32)  # k + 1 rows to rank k
    rows = sum(k + 1 for k in range(n))
    out, received = hvd.alltoall(tf.fill([rows, 2], float(r)), splits=splits)
    assert received.numpy().tolist() == [r + 1] * n
    close(out, np.repeat(np.arange(n, dtype=float), r + 1)[:, None].repeat(2, axis=1))
    for dtype in (tf.int32, tf.float32, tf.float64):
        x = tf.cast(tf.reshape(tf.range(2 * n), [2 * n, 1]), dtype)
        got = hvd.reducescatter(x, op=hvd.Sum)
        close(got, n * np.arange(2 * r, 2 * r + 2)[:, None], dtype)
    avg = hvd.reducescatter(tf.fill([n, 2], float(r)))
    close(avg, np.full((1, 2), (n - 1) / 2))
    a, b = hvd.grouped_reducescatter([tf.ones([n]), tf.ones([2 * n, 2])], op=hvd.Sum)
    close(a, np.full(1, n)) or close(b, np.full((2, 2), n))


@case
def broadcast_variables_and_objects(r: int, n: int) -> None:
    v = tf.Variable(tf.fill([3], float(r)))
    k = keras.Variable(np.full((2, 2), r, dtype="float32"))
    hvd.broadcast_variables([v, k], root_rank=n - 1)
    close(v, np.full(3, n - 1)) or close(k.value, np.full((2, 2), n - 1))
    assert hvd.broadcast_object({"from": r} if r == 0 else None, root_rank=0) == {"from": 0}
    assert hvd.allgather_object(("rank", r)) == [("rank", k) for k in range(n)]


# ----- gradients (Horovod's TF definitions) ------------------------------------------------------
@case
def gradients(r: int, n: int) -> None:
    x = tf.Variable(tf.fill([r + 1, 2], float(r + 1)))
    with tf.GradientTape(persistent=True) as tape:
        summed = hvd.allreduce(x[:1] * 1.0, op=hvd.Sum)
        avg = hvd.allreduce(x[:1] * 1.0)
        gathered = hvd.allgather(x * 1.0)
        root = hvd.broadcast(x[:1] * 1.0, root_rank=0)
        scattered = hvd.reducescatter(tf.tile(x[:1], [n, 1]), op=hvd.Sum)
    # allreduce -> allreduce of the gradient with the same op: ones * n (Sum), ones (Average)
    close(tape.gradient(summed, x), np.vstack([np.full((1, 2), n), np.zeros((r, 2))]))
    close(tape.gradient(avg, x), np.vstack([np.ones((1, 2)), np.zeros((r, 2))]))
    # allgather -> Average allreduce, this rank's rows (as Horovod's TF gradient and hora.torch)
    close(tape.gradient(gathered, x), np.ones((r + 1, 2)))
    # broadcast -> Average allreduce on the root, zeros elsewhere
    want_root = np.full((1, 2), 1 if r == 0 else 0)
    close(tape.gradient(root, x), np.vstack([want_root, np.zeros((r, 2))]))
    # reducescatter -> allgather (times the set size for Sum), summed over the tiled rows
    close(tape.gradient(scattered, x), np.vstack([np.full((1, 2), n * n), np.zeros((r, 2))]))
    # alltoall -> alltoall back
    y = tf.Variable(tf.fill([n], float(r)))
    with tf.GradientTape() as tape2:
        out = hvd.alltoall(y * tf.range(1.0, n + 1.0))
    close(tape2.gradient(out, y), np.arange(1, n + 1))


@case
def distributed_gradient_tape(r: int, n: int) -> None:
    w = tf.Variable([1.0, 2.0])
    b = tf.Variable(0.0)
    unused = tf.Variable(3.0)

    def loss() -> tf.Tensor:
        return tf.reduce_sum(w * float(r + 1)) + b * float(r)

    with tf.GradientTape() as tape:
        value = loss()
    tape = hvd.DistributedGradientTape(tape)
    assert isinstance(tape, tf.GradientTape)
    gw, gb, gu = tape.gradient(value, [w, b, unused])
    close(gw, np.full(2, (n + 1) / 2)) or close(gb, (n - 1) / 2)
    assert gu is None

    @tf.function
    def step() -> list[tf.Tensor]:
        with tf.GradientTape() as t:
            value = loss()
        t = hvd.DistributedGradientTape(t, op=hvd.Sum, compression=hvd.Compression.fp16)
        return t.gradient(value, {"w": w, "b": b})

    for _ in range(2):
        grads = step()
        close(grads["w"], np.full(2, n * (n + 1) / 2)) or close(grads["b"], n * (n - 1) / 2)
    with tf.GradientTape() as tape:
        value = loss()
    tape = hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0, num_groups=2)
    tape.register_local_source(b)
    gw, gb = tape.gradient(value, [w, b])
    close(gw, np.full(2, (n + 1) / 2)) or close(gb, r / n)  # local: only divided by size
    emb = tf.Variable(tf.ones([4, 2]))
    with tf.GradientTape() as tape:
        value = tf.reduce_sum(tf.gather(emb, [r % 4]))
    sparse = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(value, emb)
    assert isinstance(sparse, tf.IndexedSlices) and sparse.values.shape[0] == n
    with tf.GradientTape() as tape:
        value = tf.reduce_sum(tf.gather(emb, [r % 4]))
    dense = hvd.DistributedGradientTape(tape, op=hvd.Sum, sparse_as_dense=True).gradient(value, emb)
    want = np.zeros((4, 2))
    for k in range(n):
        want[k % 4] += 1
    close(dense, want)


@case
def sparse_scaling_refused(r: int, n: int) -> None:
    """Horovod refuses pre/postscale factors on IndexedSlices (they are gathered, not reduced);
    silently dropping them would give wrong numbers."""
    slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([r % 4]), tf.constant([4, 2]))
    for factors in ({"prescale_factor": 0.5}, {"postscale_factor": 2.0}):
        expect_raises(NotImplementedError, lambda f=factors: hvd.allreduce(slices, **f), "scale")
    got = hvd.allreduce(slices, op=hvd.Sum)
    assert isinstance(got, tf.IndexedSlices) and got.values.shape == (n, 2)


@case
def zero_sized_tensors(r: int, n: int) -> None:
    for dtype in DTYPES:
        got = hvd.alltoall(tf.zeros([n, 0], dtype=dtype))
        assert got.dtype == dtype and got.shape == (n, 0), (dtype, got.shape)
        assert hvd.allgather(tf.zeros([r, 0], dtype=dtype)).shape == (sum(range(n)), 0)
        assert hvd.allreduce(tf.zeros([0], dtype=dtype), op=hvd.Sum).shape == (0,)
        assert hvd.broadcast(tf.zeros([2, 0], dtype=dtype), 0).shape == (2, 0)
    close(hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, n))  # still healthy


# ----- name-keyed matching, mismatches, process sets ----------------------------------------------
@case
def name_keyed_matching(r: int, n: int) -> None:
    """Two threads submit named allreduces; each rank starts them in a different order."""
    names = ["first", "second"] if r % 2 == 0 else ["second", "first"]
    results: dict[str, tf.Tensor] = {}
    go = threading.Barrier(2)

    def submit(name: str) -> None:
        go.wait()
        if name == names[1]:
            threading.Event().wait(0.05)
        results[name] = hvd.allreduce(tf.fill([2], float(r)), op=hvd.Sum, name=name)

    threads = [threading.Thread(target=submit, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name in names:
        close(results[name], np.full(2, sum(range(n))))


@case
def mismatches(r: int, n: int) -> None:
    """Horovod's TF ops raise FailedPreconditionError when the ranks disagree."""
    odd = r == n - 1
    refused = tf.errors.FailedPreconditionError
    msgs = [
        expect_raises(
            refused,
            lambda: hvd.allreduce(tf.ones([2 + odd]), name="mm.shape"),
            "shape",
        ),
        expect_raises(
            refused,
            lambda: hvd.allreduce(tf.ones([2], dtype=tf.float64 if odd else tf.float32),
                                  name="mm.dtype"),
            "type",
        ),
        expect_raises(
            refused,
            lambda: hvd.allreduce(tf.ones([2]), op=hvd.Max if odd else hvd.Sum, name="mm.op"),
            "op",
        ),
        expect_raises(
            refused,
            lambda: hvd.broadcast(tf.ones([2]), 1 if odd else 0, name="mm.root"),
            "root",
        ),
    ]  # fmt: skip
    assert all(f"rank {n - 1}" in m for m in msgs), msgs
    close(hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, n))  # still healthy


@case
def mismatches_in_a_session(r: int, n: int) -> None:
    """TF1-style graph mode, ops run by a Session (as Horovod's test_tensorflow.py evaluates
    them without eager execution): FailedPreconditionError too; main returned empty tensors."""
    odd = r == n - 1
    assert hvd._executing_eagerly()

    def in_session(make: Callable[[], tf.Tensor]) -> object:
        with tf.Graph().as_default():  # a test of tf.test.TestCase gets a fresh graph
            assert not hvd._executing_eagerly()
            result = make()
            with tf.compat.v1.Session() as session:
                return session.run(result)

    refused = tf.errors.FailedPreconditionError
    for make, match in (
        (lambda: hvd.allreduce(tf.ones([2 + odd]), name="session.shape"), "shape"),
        (lambda: hvd.allgather(tf.ones([1, 2 + odd]), name="session.gather"), "shape"),
        (lambda: hvd.broadcast(tf.ones([2]), 1 if odd else 0, name="session.root"), "root"),
    ):
        expect_raises(refused, lambda make=make: in_session(make), match)
    summed = in_session(lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="session.ok"))
    np.testing.assert_array_equal(summed, np.full(2, n, dtype=np.float32))  # still healthy


@case
def broadcasts_in_a_session(r: int, n: int) -> None:
    """TF1-style graph mode: broadcast_'s values, and the ops broadcast_variables and
    broadcast_global_variables return, assign the root's values when a Session runs them (main
    built the assignments and never ran them: the values read were the rank's own, as Horovod's
    test_horovod_broadcast_inplace_cpu found); eagerly, broadcast_global_variables raises."""
    expect_raises(RuntimeError, lambda: hvd.broadcast_global_variables(0), "eager")
    with tf.Graph().as_default():
        ref = tf.compat.v1.Variable(tf.fill([3], float(r)), use_resource=False)
        resource = tf.compat.v1.Variable(tf.fill([2], r), use_resource=True)
        some = tf.compat.v1.Variable(float(r))
        mine = tf.compat.v1.Variable(float(r) + 10)
        new_ref, new_resource = hvd.broadcast_([ref, resource], n - 1)
        some_op = hvd.broadcast_variables([some], root_rank=n - 1)
        all_op = hvd.broadcast_global_variables(0)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got = session.run([new_ref, new_resource])
            np.testing.assert_array_equal(got[0], np.full(3, n - 1, dtype=np.float32))
            np.testing.assert_array_equal(got[1], np.full(2, n - 1, dtype=np.int32))
            assert session.run([ref, resource, some])[2] == r  # only the op assigns
            session.run(some_op)
            assert session.run(some) == n - 1
            session.run(all_op)  # rank 0's: the broadcast ones, and its own 10
            assert session.run([some, mine]) == [n - 1, 10]
            np.testing.assert_array_equal(session.run(ref), np.full(3, n - 1, dtype=np.float32))


@case
def tensorflow_state(r: int, n: int) -> None:
    """hvd.elastic.TensorFlowState (Horovod's test_elastic_state, and in a TF1 Session): sync
    gives every rank rank 0's variables and values, restore the last commit's."""

    def check(state: hvd.elastic.TensorFlowState, read: Callable[[], list]) -> None:
        state.sync()
        assert [v.tolist() for v in read()] == [[0.0, 0.0], 10.0] and state.epoch == 0
        state.epoch = 1
        state.commit()
        state.restore()
        assert [v.tolist() for v in read()] == [[0.0, 0.0], 10.0] and state.epoch == 1

    pair, one = tf.Variable([float(r)] * 2), tf.Variable(float(r) + 10)
    state = hvd.elastic.TensorFlowState([pair, one], epoch=r)
    check(state, lambda: [pair.numpy(), one.numpy()])
    pair.assign([5.0, 5.0])
    state.epoch = 2
    state.restore()
    assert pair.numpy().tolist() == [0.0, 0.0] and state.epoch == 1
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        pair, one = tf.compat.v1.Variable([float(r)] * 2), tf.compat.v1.Variable(float(r) + 10)
        session.run(tf.compat.v1.global_variables_initializer())
        state = hvd.elastic.TensorFlowState(epoch=r)  # the graph's variables, the session
        check(state, lambda: session.run([pair, one]))
        pair.load([5.0, 5.0], session)
        state.restore()
        assert session.run(pair).tolist() == [0.0, 0.0]


@case
def process_sets(r: int, n: int) -> None:
    members = [0, n - 1] if n > 2 else [n - 1]
    ps = hvd.add_process_set(members)
    if r in ps.ranks:
        got = hvd.allreduce(tf.fill([2], float(r)), op=hvd.Sum, process_set=ps)
        close(got, np.full(2, sum(ps.ranks)))
        got = hvd.allgather(tf.fill([1], r), process_set=ps)
        assert got.numpy().tolist() == ps.ranks
        v = tf.Variable(float(r))
        hvd.broadcast_variables([v], root_rank=n - 1, process_set=ps)
        close(v, n - 1)
    else:
        not_member = tf.errors.InvalidArgumentError
        expect_raises(not_member, lambda: hvd.allreduce(tf.ones(1), process_set=ps), "member")
    assert hvd.remove_process_set(ps)


# ----- Keras 3 -----------------------------------------------------------------------------------
def _model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(96, 5)).astype("float32"), rng.normal(size=(96, 1)).astype("float32")


def _shard(a: np.ndarray, r: int, n: int, batch: int) -> np.ndarray:
    """Rank r's rows: the r-th `batch` rows of every global batch of `n * batch` rows."""
    steps = len(a) // (n * batch)
    return a[: steps * n * batch].reshape(steps, n, batch, -1)[:, r].reshape(-1, a.shape[1])


def _weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([v.numpy().ravel() for v in model.weights])


class _RecordLR(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        self.seen.append(float(self.model.optimizer.learning_rate.numpy()))


@case
def keras_fit_equals_one_process(r: int, n: int) -> None:
    """model.fit + DistributedOptimizer on n ranks (different initial weights: the broadcast
    callback makes them rank 0's) equals one process on the concatenated batches."""
    x, y = _data()
    batch = 8
    model = _model(seed=r)  # every rank starts elsewhere
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(
        _shard(x, r, n, batch), _shard(y, r, n, batch), batch_size=batch, epochs=2,
        shuffle=False, verbose=0, callbacks=[khvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )  # fmt: skip
    mine = _weights(model)
    every = hvd.allgather_object(mine)
    assert all(np.array_equal(every[0], w) for w in every), "ranks ended apart"
    reference = _model(seed=0)
    reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    steps = len(x) // (n * batch)
    reference.fit(
        x[: steps * n * batch], y[: steps * n * batch], batch_size=n * batch, epochs=2,
        shuffle=False, verbose=0,
    )  # fmt: skip
    assert np.allclose(_weights(reference), mine, atol=1e-5), np.abs(_weights(reference) - mine)


@case
def keras_backward_passes_per_step(r: int, n: int) -> None:
    """Two local batches summed, then one reduction: as Horovod, the update uses the sum."""
    x, y = _data()
    model = _model(seed=0)
    opt = khvd.DistributedOptimizer(keras.optimizers.SGD(0.01), backward_passes_per_step=2)
    assert type(opt).__name__ == "SGD" and isinstance(opt, keras.optimizers.SGD)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x[:32], y[:32], batch_size=8, epochs=1, shuffle=False, verbose=0)
    every = hvd.allgather_object(_weights(model))
    assert all(np.array_equal(every[0], w) for w in every)
    expect_raises(ValueError, lambda: khvd.DistributedOptimizer(opt, op=hvd.Max), "Average")
    expect_raises(TypeError, lambda: khvd.DistributedOptimizer(object()), "Keras 3 optimizer")


@case
def keras_callbacks(r: int, n: int) -> None:
    x, y = _data()
    model = _model(seed=r)
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    record = _RecordLR()
    history = model.fit(
        _shard(x, r, n, 8), y[: len(_shard(x, r, n, 8))] * (r + 1), batch_size=8, epochs=3,
        shuffle=False, verbose=0,
        callbacks=[
            khvd.callbacks.BroadcastGlobalVariablesCallback(0),
            khvd.callbacks.MetricAverageCallback(),
            khvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2),
            record,
        ],
    )  # fmt: skip
    steps = len(_shard(x, r, n, 8)) // 8
    want = []
    for epoch in range(3):
        for b in range(steps):
            if epoch < 2:
                e = epoch + b / steps + 1 / steps
                want.append(0.1 / n * (e * (n - 1) / 2 + 1))
            else:
                want.append(want[-1])
    assert np.allclose(record.seen, want, rtol=1e-5), (record.seen, want)
    losses = hvd.allgather_object(history.history["loss"])
    assert all(np.allclose(losses[0], h) for h in losses), losses  # averaged: the same
    every = hvd.allgather_object(_weights(model))
    assert all(np.array_equal(every[0], w) for w in every)
    # Schedule: a constant multiplier is m ** (epoch - start_epoch), applied on each epoch start
    model2 = _model(seed=0)
    model2.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss="mse")
    rec2 = _RecordLR()
    model2.fit(
        x[:16], y[:16], batch_size=8, epochs=3, verbose=0, shuffle=False,
        callbacks=[khvd.callbacks.LearningRateScheduleCallback(0.2, 0.5, start_epoch=1), rec2],
    )  # fmt: skip
    assert np.allclose(rec2.seen, [1.0, 1.0, 0.2, 0.2, 0.1, 0.1]), rec2.seen


@case
def keras_save_and_load_model(r: int, n: int) -> None:
    import tempfile

    model = _model(seed=0)
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    x, y = _data()
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.keras")
        model.save(path)
        loaded = khvd.load_model(path)
    assert type(loaded.optimizer).__name__ == "Adam" and hasattr(loaded.optimizer, "_hora")
    assert int(loaded.optimizer.iterations.numpy()) == 2  # its state came back
    loaded.fit(_shard(x, r, n, 8), _shard(y, r, n, 8), batch_size=8, epochs=1, verbose=0)
    every = hvd.allgather_object(_weights(loaded))
    assert all(np.array_equal(every[0], w) for w in every)
    khvd.broadcast_global_variables(0, model)
    expect_raises(ValueError, lambda: khvd.broadcast_global_variables(0), "model")


def run_all() -> dict[str, str]:
    """Run every case on this rank; never raise, so that every outcome comes back."""
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    outcomes: dict[str, str] = {}
    for name, fn in CASES.items():
        try:
            fn(r, n)
            outcomes[name] = "ok"
        except Exception:
            outcomes[name] = traceback.format_exc(limit=8)
        hvd.init(process_sets="dynamic")
    hvd.shutdown()
    return outcomes
