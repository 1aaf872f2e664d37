"""Keras 3 twins of the grid encoders: ``TFPositionalEncoding{1,2,3}D`` and ``TFSummer``.

The ``positional-encodings`` package serves TensorFlow users with ``TF``-prefixed classes taking
channel-last tensors. This module gives them the same names, arguments and shapes, and the same
numbers as vispos' PyTorch :class:`~vispos.PositionalEncoding2D` and friends, as Keras layers
written with ``keras.ops``: they run on every Keras 3 backend (TensorFlow, JAX, PyTorch)::

    # from positional_encodings.tf_encodings import TFPositionalEncoding2D, TFSummer
    from vispos.keras import TFPositionalEncoding2D, TFSummer

``import vispos`` never imports this module (nor keras, nor tensorflow); install the extra with
``pip install "vispos[keras]"`` and choose the backend as Keras does, with the ``KERAS_BACKEND``
environment variable set before keras is first imported.

Differences from ``positional-encodings`` (each one a fix):

* a channel count that differs from the constructor's raises ``ValueError`` (the package returns
  a tensor of another shape than its input's, silently); a wrong rank raises ``ValueError``
  (the package: ``RuntimeError``);
* ``dtype`` is honoured as a Keras dtype policy: the encodings come out in the layer's compute
  dtype (the package accepts ``dtype`` and ignores it, always returning float32). Angles are
  computed in float32 whatever the output dtype, then cast once;
* no ``cached_penc`` attribute: the package keeps the last output on the layer, which leaks a
  graph tensor out of ``tf.function`` and is keyed on the whole input shape. Here the table is
  rebuilt on each call from ``sum(S_i) * C / n`` sines and cosines (graph compilers fold it into
  a constant); nothing is shared between calls;
* the layers serialize (``get_config`` / ``from_config``, registered under ``vispos>``), so a
  model holding them saves to and loads from a ``.keras`` file.

The inverse frequencies are vispos' own (:func:`vispos._sincos.frequency_divisors`, float32),
stored as the numpy array ``inv_freq`` as in the package.

References:
    Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5); P. Tatkowski,
    ``positional-encodings`` 6.x, ``tf_encodings.py`` (github.com/tatp22/multidim-positional-encoding).
"""

from __future__ import annotations

import sys

try:
    import keras
    from keras import ops
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "vispos.keras needs Keras 3 and a backend: pip install 'vispos[keras]' "
        f"(keras and tensorflow-cpu), or keras with jax or torch. ({exc})"
    ) from exc

from ._checks import check_int
from ._sincos import frequency_divisors

if not str(getattr(keras, "__version__", "0")).startswith("3"):  # pragma: no cover
    raise ImportError(
        f"vispos.keras needs Keras 3 (keras.ops), found keras {keras.__version__}; "
        "pip install 'keras>=3.8'"
    )

__all__ = [
    "TFPositionalEncoding1D",
    "TFPositionalEncoding2D",
    "TFPositionalEncoding3D",
    "TFSummer",
]

_TEMPERATURE = 10000.0
_PACKAGE = "vispos"


class _TFGridEncoding(keras.layers.Layer):
    """Shared body of ``TFPositionalEncoding{1,2,3}D``; subclasses set ``_num_axes``."""

    _num_axes = 1

    def __init__(self, channels: int, dtype=None, **kwargs) -> None:
        channels = check_int(channels, "channels", minimum=1, integral=True)
        super().__init__(dtype=dtype, **kwargs)
        if not _is_floating(self.compute_dtype):  # a dtype of the wrong kind: TypeError (vispos._checks)
            raise TypeError(
                f"dtype must be a floating dtype (the encodings' dtype), got {self.compute_dtype}"
            )
        self.org_channels = channels
        # positional-encodings' rounding: each axis gets ceil(channels / n) rounded up to even;
        # the concatenation is truncated back to ``channels``.
        self.channels = -(-channels // (2 * self._num_axes)) * 2
        # the very float32 table of vispos' torch encoders (same kernel, same bits)
        self.inv_freq = (1.0 / frequency_divisors(self.channels, _TEMPERATURE)).numpy()

    # ------------------------------------------------------------------------------------ api
    def call(self, inputs):
        """The encoding of ``inputs``' positions; only its shape is read.

        Args:
            inputs (Tensor[B, *S, C]): a backend tensor, numpy array or TensorFlow tensor.

        Returns:
            Tensor[B, *S, C]: in the layer's compute dtype.
        """
        _refuse_ragged(inputs, type(self).__name__)
        self._check_shape(_static_shape(inputs))
        return self._table(ops.shape(inputs))

    def compute_output_spec(self, inputs):
        _refuse_ragged(inputs, type(self).__name__)  # keras.Input(ragged=True): at model build
        return super().compute_output_spec(inputs)

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape)
        self._check_shape(shape)
        return shape

    def get_config(self) -> dict:
        config = super().get_config()
        config["channels"] = self.org_channels
        return config

    # -------------------------------------------------------------------------------- helpers
    def _layout(self) -> str:
        axes = ("X", "Y", "Z")[: self._num_axes]
        return f"(B, {', '.join(axes)}, C)"

    def _check_shape(self, shape: tuple) -> None:
        name = type(self).__name__
        if len(shape) != self._num_axes + 2:
            raise ValueError(
                f"{name} expects a {self._num_axes + 2}-D input {self._layout()}, got shape "
                f"{shape}"
            )
        got = shape[-1]
        if got is not None and got != self.org_channels:
            raise ValueError(
                f"{name}(channels={self.org_channels}) got an input with {got} channels "
                f"(shape {shape}, layout {self._layout()}); build it with channels={got} or pass "
                "a matching input"
            )

    def _table(self, shape):
        """``Tensor[B, *S, C]``: block ``i`` holds the interleaved sin/cos of axis ``i``."""
        n = self._num_axes
        batch, spatial = shape[0], tuple(shape[1 : n + 1])
        inv_freq = ops.convert_to_tensor(self.inv_freq, dtype="float32")
        f = self.channels
        blocks = []
        for axis, size in enumerate(spatial):
            keep = min(f, self.org_channels - axis * f)
            if keep <= 0:  # odd or small channel counts: the last blocks are truncated away
                break
            pos = ops.arange(size, dtype="float32")
            angles = ops.multiply(ops.expand_dims(pos, -1), ops.expand_dims(inv_freq, 0))
            emb = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (S_i, F/2, 2)
            emb = ops.reshape(emb, (-1, f))[:, :keep]  # sin w0, cos w0, sin w1, ...
            view = [1] * n + [keep]
            view[axis] = -1
            emb = ops.reshape(emb, view)
            blocks.append(ops.broadcast_to(emb, (*spatial, keep)))
        table = blocks[0] if len(blocks) == 1 else ops.concatenate(blocks, axis=-1)
        table = ops.cast(table, self.compute_dtype)
        return ops.broadcast_to(ops.expand_dims(table, 0), (batch, *spatial, self.org_channels))


def _refuse_ragged(inputs, name: str) -> None:
    """``TypeError`` for a ragged input (``tf.RaggedTensor``, or a ``keras.Input(ragged=True)``
    placeholder): its rows have no common shape for the encoding to follow."""
    tf = sys.modules.get("tensorflow")
    ragged = getattr(inputs, "ragged", False) is True or (
        tf is not None and isinstance(inputs, tf.RaggedTensor)
    )
    if ragged:
        raise TypeError(
            f"{name} does not take ragged input (tf.RaggedTensor or keras.Input(ragged=True)), "
            f"got {type(inputs).__name__} of shape {tuple(inputs.shape)}: pad it to a dense tensor "
            "first, e.g. x.to_tensor() (keep x.row_lengths() to mask the padding). Padding at the "
            "end leaves the encoding of every valid position unchanged (positions are counted "
            "from 0 at the start of each axis)"
        )


def _static_shape(inputs) -> tuple:
    if not hasattr(inputs, "shape"):
        raise TypeError(
            "expected a tensor or numpy array (B, *S, C), got "
            f"{type(inputs).__name__}"
        )
    shape = inputs.shape
    if hasattr(shape, "as_list"):  # tf.TensorShape
        return tuple(shape.as_list()) if shape.rank is not None else ()
    return tuple(None if s is None else int(s) for s in shape)


def _is_floating(dtype) -> bool:
    return "float" in str(keras.backend.standardize_dtype(dtype))


_CLASS_DOC = """Sinusoidal {n}D encoding of a channel-last tensor, as ``positional-encodings``' TF class.

    A Keras 3 layer (``keras.ops``: TensorFlow, JAX and PyTorch backends). The ``channels`` are
    split into {n} block(s) of ``F = 2 * ceil(channels / {two_n})`` channels, one per spatial
    axis in tensor axis order{axes_note}; block ``i`` holds ``sin(p_i w_k), cos(p_i w_k)``
    interleaved, for the 0-based position ``p_i`` along axis ``i`` and ``w_k = 10000^(-2k / F)``.
    The concatenation is truncated to ``channels`` (odd and non-divisible counts work). The same
    numbers as :class:`vispos.{torch_name}` and
    ``positional_encodings.tf_encodings.{name}``.

    Args:
        channels (int): the input's channel count ``C`` (positive).
        dtype (str, dtype or keras.DTypePolicy, optional): the layer's dtype policy; the
            encodings come out in its compute dtype (floating). Default: Keras' global policy
            (float32 unless set otherwise). Angles are computed in float32 either way.
        **kwargs: Keras layer arguments (``name``, ``trainable``).

    Attributes:
        org_channels (int): ``channels`` as given. channels (int): ``F``, per axis (the
        package's names). inv_freq (numpy.ndarray[F // 2], float32): ``w_k``.

    Shape:
        - input: ``Tensor{shape}`` (a backend tensor, a numpy array, or a TensorFlow tensor on
          the TensorFlow backend); only its shape is read.
        - output: ``Tensor{shape}``, the input's shape, in the layer's compute dtype; a new
          tensor per call.

    Raises:
        TypeError: ``channels`` is not an int; ``dtype`` is not floating; the input has no
            ``shape``; the input is ragged (``tf.RaggedTensor``, ``keras.Input(ragged=True)``):
            pad it first (``x.to_tensor()``).
        ValueError: ``channels`` <= 0; the input does not have
            {rank} dims, or has another channel count than ``channels``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5); P. Tatkowski,
        ``positional-encodings`` 6.x (github.com/tatp22/multidim-positional-encoding).
    """


def _doc(name: str, n: int) -> str:
    axes = ("X", "Y", "Z")[:n]
    return _CLASS_DOC.format(
        n=n,
        two_n=2 * n,
        axes_note="" if n == 1 else f" ({', '.join(axes)})",
        name=name,
        torch_name=name[2:],
        shape=f"[B, {', '.join(axes)}, C]",
        rank=n + 2,
    )


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TFPositionalEncoding1D(_TFGridEncoding):
    __doc__ = _doc("TFPositionalEncoding1D", 1)
    _num_axes = 1


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TFPositionalEncoding2D(_TFGridEncoding):
    __doc__ = _doc("TFPositionalEncoding2D", 2)
    _num_axes = 2


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TFPositionalEncoding3D(_TFGridEncoding):
    __doc__ = _doc("TFPositionalEncoding3D", 3)
    _num_axes = 3


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TFSummer(keras.layers.Layer):
    """Adds a position encoding to its input, in the input's dtype: ``x + cast(penc(x))``.

    Args:
        penc (keras.layers.Layer): any layer returning a tensor of its input's shape, typically a
            ``TFPositionalEncoding{1,2,3}D``. Stored as ``self.penc`` (the package's name).
        **kwargs: Keras layer arguments (``name``, ``trainable``). The summer never casts its
            input (``autocast=False``): a float16 or bfloat16 input is summed in float16 or
            bfloat16, whatever the global dtype policy.

    Shape:
        - input: ``Tensor[B, *S, C]`` (floating), as ``penc`` expects.
        - output: the same shape and dtype, a new tensor.

    Raises:
        TypeError: ``penc`` is not a Keras layer; the input is not floating, or ragged (pad it
            first: ``x.to_tensor()``).
        ValueError: the encoding's shape differs from the input's (the package: ``assert``).

    References:
        P. Tatkowski, ``positional-encodings`` 6.x (``TFSummer``).
    """

    def __init__(self, penc, **kwargs) -> None:
        if not isinstance(penc, keras.layers.Layer):
            raise TypeError(f"penc must be a keras.layers.Layer, got {type(penc).__name__}")
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        self.penc = penc

    def call(self, inputs):
        """``inputs + penc(inputs)``, summed in ``inputs``' dtype.

        Args:
            inputs (Tensor[B, *S, C]): floating.

        Returns:
            Tensor[B, *S, C]: in ``inputs``' dtype.
        """
        _refuse_ragged(inputs, "TFSummer")
        inputs = ops.convert_to_tensor(inputs)
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if "float" not in dtype:
            raise TypeError(
                f"TFSummer adds the encoding in the input's dtype, which must be floating; got "
                f"{dtype}. Cast the input first (e.g. keras.ops.cast(x, 'float32'))."
            )
        penc = self.penc(inputs)
        if tuple(penc.shape) != tuple(inputs.shape):
            raise ValueError(
                f"the encoding has shape {tuple(penc.shape)} but the input has shape "
                f"{tuple(inputs.shape)}; they must match to be summed"
            )
        return ops.add(inputs, ops.cast(penc, dtype))

    def build(self, input_shape) -> None:
        if not self.penc.built:
            self.penc.build(input_shape)
        self.built = True

    def compute_output_spec(self, inputs):
        _refuse_ragged(inputs, "TFSummer")
        self.penc.compute_output_spec(inputs)  # validates rank and channels
        return keras.KerasTensor(inputs.shape, dtype=inputs.dtype)

    def get_config(self) -> dict:
        config = super().get_config()
        config["penc"] = keras.saving.serialize_keras_object(self.penc)
        return config

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        config["penc"] = keras.saving.deserialize_keras_object(config["penc"])
        return cls(**config)
