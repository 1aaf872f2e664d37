"""Tests of ``vispos.keras`` on ONE Keras backend, run by ``tests/test_keras.py``.

Keras picks its backend when it is first imported (``KERAS_BACKEND``), so this module is run in
a subprocess per backend: ``KERAS_BACKEND=jax python -m pytest tests/keras_cases.py``. Its name
does not match ``test_*.py``, so the main pytest run (which keeps TensorFlow out of its process)
does not collect it.
"""

import json
import os

import numpy as np
import pytest
import torch

keras = pytest.importorskip("keras")
from keras import ops  # noqa: E402

import vispos  # noqa: E402
from vispos.keras import (  # noqa: E402
    TFPositionalEncoding1D,
    TFPositionalEncoding2D,
    TFPositionalEncoding3D,
    TFSummer,
)

BACKEND = keras.backend.backend()
KERAS_CLASSES = {1: TFPositionalEncoding1D, 2: TFPositionalEncoding2D, 3: TFPositionalEncoding3D}
TORCH_CLASSES = {
    1: vispos.PositionalEncoding1D,
    2: vispos.PositionalEncoding2D,
    3: vispos.PositionalEncoding3D,
}
# spatial shapes: long axes (large angles), unit axes, non-square
SHAPES = {
    1: [(2, 7), (1, 1000), (3, 1), (4, 257)],
    2: [(2, 5, 9), (1, 64, 33), (1, 1, 1), (2, 128, 3)],
    3: [(2, 3, 4, 5), (1, 17, 9, 24), (1, 1, 2, 1), (1, 40, 2, 3)],
}
CHANNELS = list(range(1, 42)) + [64, 65, 130]
# positional-encodings' TF classes retrace their tf.function for every instance and shape
PEER_CHANNELS = list(range(1, 14)) + [16, 17, 23, 31, 40, 41, 65, 130]
REPORT = os.environ.get("VISPOS_KERAS_REPORT")
# JAX has float64 only with jax_enable_x64 (it truncates to float32 otherwise)
WIDE = [] if BACKEND == "jax" and not __import__("jax").config.jax_enable_x64 else ["float64"]


def _report(kind: str, diff: float) -> None:
    """Appends a max-abs-difference record for the closing note (opt-in, by env var)."""
    if REPORT:
        with open(REPORT, "a") as fh:
            fh.write(json.dumps({"backend": BACKEND, "kind": kind, "max_abs": diff}) + "\n")


def _np(x) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(x))


def _torch_encoding(n: int, channels: int, shape, dtype=torch.float32) -> np.ndarray:
    enc = TORCH_CLASSES[n](channels)
    return enc(torch.zeros(*shape, channels, dtype=dtype)).float().numpy()


# ------------------------------------------------------------------------ parity with torch
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("channels", CHANNELS)
def test_torch_parity(n, channels):
    # one shape per channel count, in turn: each shape meets about 15 channel counts (every
    # backend compiles each op per shape; JAX's eager dispatch makes a full cross costly)
    shape = SHAPES[n][channels % len(SHAPES[n])]
    x = np.zeros((*shape, channels), dtype=np.float32)
    got = _np(KERAS_CLASSES[n](channels)(x))
    want = _torch_encoding(n, channels, shape)
    assert got.shape == x.shape and got.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), rtol=0, atol=1e-5)
    _report(f"torch-{n}d", float(np.abs(got - want).max()))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", *WIDE])
def test_dtype_policy(dtype):
    """``dtype`` is the output dtype; angles stay float32 (as vispos' ``dtype_override``)."""
    layer = TFPositionalEncoding2D(12, dtype=dtype)
    out = layer(np.zeros((2, 6, 5, 12), dtype=np.float32))
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    want = vispos.PositionalEncoding2D(12, dtype_override=getattr(torch, dtype))(
        torch.zeros(2, 6, 5, 12)
    )
    torch.testing.assert_close(
        torch.from_numpy(_np(ops.cast(out, "float32"))), want.float(), rtol=0, atol=1e-5
    )


def test_compiled_predict_and_dynamic_spatial_shape():
    """Inside the backend's compiled function (tf.function / jax.jit) and with unknown sizes."""
    model = keras.Sequential([keras.Input((None, None, 10)), TFPositionalEncoding2D(10)])
    for shape in [(3, 5, 6), (1, 8, 2)]:
        x = np.random.default_rng(0).normal(size=(*shape, 10)).astype(np.float32)
        got = model.predict(x, verbose=0)
        want = _torch_encoding(2, 10, shape)
        torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), rtol=0, atol=1e-5)


def test_input_is_not_modified_and_results_are_fresh():
    x = np.ones((2, 4, 3, 6), dtype=np.float32)
    layer = TFSummer(TFPositionalEncoding2D(6))
    a = _np(layer(x))
    b = _np(layer(x))
    np.testing.assert_array_equal(x, np.ones_like(x))
    assert a is not b
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------ TFSummer
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", *WIDE])
def test_summer_adds_in_input_dtype(dtype):
    rng = np.random.default_rng(1)
    x32 = rng.normal(size=(2, 5, 7, 9)).astype(np.float32)
    x = ops.cast(x32, dtype)
    penc = TFPositionalEncoding2D(9)
    out = TFSummer(penc)(x)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    # the sum is taken in the input's dtype: bit for bit x + cast(encoding, dtype)
    exact = ops.add(x, ops.cast(penc(x), dtype))
    np.testing.assert_array_equal(_np(ops.cast(out, "float32")), _np(ops.cast(exact, "float32")))
    # and it is vispos' torch Summer (which casts the float32 encoding to the input dtype),
    # up to the last bit of sin/cos in float32 and one rounding in the half dtypes
    tdt = getattr(torch, dtype)
    want = vispos.Summer(vispos.PositionalEncoding2D(9))(torch.from_numpy(x32).to(tdt))
    got = torch.from_numpy(_np(ops.cast(out, "float32"))).to(tdt)
    if dtype in ("float32", "float64"):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(got, want)


def test_summer_never_casts_under_a_mixed_policy():
    x = np.zeros((1, 3, 4, 8), dtype=np.float32)
    summer = TFSummer(TFPositionalEncoding2D(8, dtype="mixed_float16"), dtype="mixed_float16")
    out = summer(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    want = _torch_encoding(2, 8, (1, 3, 4)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(_np(out), want)


def test_summer_rejects_integer_input():
    with pytest.raises(TypeError, match=r"TFSummer adds the encoding in the input's dtype.*int32"):
        TFSummer(TFPositionalEncoding1D(4))(np.zeros((1, 3, 4), dtype=np.int32))


def test_summer_rejects_a_non_layer():
    with pytest.raises(TypeError, match=r"penc must be a keras.layers.Layer, got int"):
        TFSummer(42)


def test_summer_rejects_an_encoding_of_another_shape():
    penc = keras.layers.Dense(3)
    with pytest.raises(ValueError, match=r"the encoding has shape \(1, 4, 3\) but the input has shape \(1, 4, 5\)"):
        TFSummer(penc)(np.zeros((1, 4, 5), dtype=np.float32))


# -------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "n, shape",
    [(1, (4, 8)), (1, (1, 4, 4, 8)), (2, (1, 4, 8)), (2, (1, 2, 3, 4, 8)), (3, (1, 2, 3, 8))],
)
def test_wrong_rank(n, shape):
    layer = KERAS_CLASSES[n](8)
    with pytest.raises(ValueError, match=rf"expects a {n + 2}-D input \(B, .*C\), got shape"):
        layer(np.zeros(shape, dtype=np.float32))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_channel_mismatch(n):
    layer = KERAS_CLASSES[n](10)
    x = np.zeros((1, *([3] * n), 12), dtype=np.float32)
    with pytest.raises(ValueError, match=rf"TFPositionalEncoding{n}D\(channels=10\) got an input with 12 channels"):
        layer(x)


def test_channel_mismatch_when_a_model_is_built():
    with pytest.raises(ValueError, match=r"TFPositionalEncoding2D\(channels=8\) got an input with 6 channels"):
        keras.Sequential([keras.Input((4, 4, 6)), TFSummer(TFPositionalEncoding2D(8))])


@pytest.mark.parametrize("channels", ["8", 8.0, True, None])
def test_channels_type(channels):
    with pytest.raises(TypeError, match=r"channels must be a positive int, got"):
        TFPositionalEncoding2D(channels)


@pytest.mark.parametrize("channels", [0, -3])
def test_channels_value(channels):
    with pytest.raises(ValueError, match=rf"channels must be a positive int, got {channels}"):
        TFPositionalEncoding2D(channels)


def test_integer_dtype_rejected():
    with pytest.raises(TypeError, match=r"dtype must be a floating dtype.*got int32"):
        TFPositionalEncoding1D(4, dtype="int32")


def test_input_without_shape():
    with pytest.raises(TypeError, match=r"expected a tensor or numpy array \(B, \*S, C\), got"):
        TFPositionalEncoding1D(4).call([[0.0] * 4])


def test_channels_attributes_follow_the_package():
    for n, per_axis in [(1, 6), (2, 4), (3, 2)]:
        layer = KERAS_CLASSES[n](5)
        assert (layer.org_channels, layer.channels) == (5, per_axis)
        want = 1.0 / (10000.0 ** (np.arange(0, per_axis, 2) / per_axis))
        np.testing.assert_allclose(layer.inv_freq, want, rtol=1e-6)
        assert layer.inv_freq.dtype == np.float32


# ------------------------------------------------------------------------------- serialization
@pytest.mark.parametrize("n", [1, 2, 3])
def test_config_round_trip(n):
    layer = KERAS_CLASSES[n](7, dtype="float16", name=f"pe{n}")
    clone = KERAS_CLASSES[n].from_config(layer.get_config())
    assert (clone.org_channels, clone.name, clone.compute_dtype) == (7, f"pe{n}", "float16")
    summer = TFSummer(layer)
    clone_summer = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(summer))
    assert isinstance(clone_summer, TFSummer) and isinstance(clone_summer.penc, KERAS_CLASSES[n])
    x = np.zeros((2, *range(3, 3 + n), 7))
    np.testing.assert_array_equal(_np(clone_summer(x)), _np(summer(x)))


def test_saved_keras_model_reloads(tmp_path):
    inputs = keras.Input((6, 5, 10))
    h = TFSummer(TFPositionalEncoding2D(10))(inputs)
    h = keras.layers.Dense(4)(h)
    h = TFSummer(TFPositionalEncoding2D(4, dtype="float16"))(h)
    model = keras.Model(inputs, h)
    path = tmp_path / "model.keras"
    model.save(path)
    # registered serializable: no custom_objects needed
    loaded = keras.models.load_model(path)
    x = np.random.default_rng(2).normal(size=(3, 6, 5, 10)).astype(np.float32)
    np.testing.assert_array_equal(_np(loaded(x)), _np(model(x)))
    kinds = [type(layer).__name__ for layer in loaded.layers]
    assert kinds.count("TFSummer") == 2
    assert loaded.layers[-1].penc.compute_dtype == "float16"


# ------------------------------------------------- positional-encodings' TF classes (TF only)
if BACKEND == "tensorflow":
    import tensorflow as tf
    from positional_encodings import tf_encodings as pe_tf

    PEER = {1: pe_tf.TFPositionalEncoding1D, 2: pe_tf.TFPositionalEncoding2D, 3: pe_tf.TFPositionalEncoding3D}

    @pytest.mark.parametrize("n", [1, 2, 3])
    def test_positional_encodings_tf_parity(n):
        worst = 0.0
        for channels in PEER_CHANNELS:
            for shape in SHAPES[n][channels % 2 :: 2]:
                x = tf.zeros((*shape, channels))
                peer = PEER[n](channels)
                want = peer(x)
                got = KERAS_CLASSES[n](channels)(x)
                # the package's shape contract: the input's shape, float32
                assert tuple(got.shape) == tuple(want.shape) == tuple(x.shape)
                assert got.dtype == want.dtype == tf.float32
                # the package rounds w_k from float64, vispos (and the package's torch classes)
                # compute it in float32: one ulp of w_k, times the largest position p, moves an
                # angle by up to p * 2^-23 (the package's own TF and torch classes differ by
                # 6.1e-5 at p = 999)
                atol = 1e-6 + max(shape[1:]) * 2.0**-23
                torch.testing.assert_close(
                    torch.from_numpy(got.numpy()), torch.from_numpy(want.numpy()), rtol=0, atol=atol
                )
                worst = max(worst, float(np.abs(got.numpy() - want.numpy()).max()))
                assert KERAS_CLASSES[n](channels).channels == peer.channels
        _report(f"positional-encodings-tf-{n}d", worst)

    def test_positional_encodings_tf_summer_parity():
        x = tf.random.stateless_normal((2, 5, 6, 11), seed=(1, 2))
        want = pe_tf.TFSummer(pe_tf.TFPositionalEncoding2D(11))(x)
        got = TFSummer(TFPositionalEncoding2D(11))(x)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)

    def test_tf_inputs_and_tf_function():
        layer = TFPositionalEncoding3D(9)
        x = tf.zeros((2, 3, 4, 5, 9))
        eager = layer(x)
        assert isinstance(eager, tf.Tensor)
        traced = tf.function(layer)(x)
        np.testing.assert_array_equal(traced.numpy(), eager.numpy())
        want = _torch_encoding(3, 9, (2, 3, 4, 5))
        np.testing.assert_allclose(eager.numpy(), want, rtol=0, atol=1e-5)

    @pytest.mark.parametrize("n", [1, 2])
    def test_ragged_input_is_refused_with_a_hint(n):
        """Issue 26 item 14: ragged input ended in "Attempt to convert a value (None)"; it is
        refused with a TypeError saying how to pad it, eagerly and at model build."""
        rows = [np.ones((2,) * n + (4,), np.float32), np.ones((3,) * n + (4,), np.float32)]
        x = tf.ragged.constant([r.tolist() for r in rows], ragged_rank=n, inner_shape=(4,))
        for layer in (KERAS_CLASSES[n](4), TFSummer(KERAS_CLASSES[n](4))):
            name = type(layer).__name__
            with pytest.raises(TypeError, match=rf"{name} does not take ragged input .* x.to_tensor\(\)"):
                layer(x)
        symbolic = keras.Input(shape=(None,) * n + (4,), ragged=True)
        with pytest.raises(TypeError, match="does not take ragged input"):
            TFSummer(KERAS_CLASSES[n](4))(symbolic)
        with pytest.raises(TypeError, match="does not take ragged input"):
            KERAS_CLASSES[n](4)(symbolic)
        # the advice works: the padded tensor's valid cells carry each row's own encoding
        dense = x.to_tensor()
        got = KERAS_CLASSES[n](4)(dense).numpy()
        for b, row in enumerate(rows):
            cells = tuple(slice(0, s) for s in row.shape[:-1])
            np.testing.assert_array_equal(got[(b, *cells)], KERAS_CLASSES[n](4)(row[None]).numpy()[0])

    def test_tf_dtype_objects_accepted():
        layer = TFPositionalEncoding1D(6, dtype=tf.float64)
        assert layer(tf.zeros((1, 4, 6))).dtype == tf.float64
