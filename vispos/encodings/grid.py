"""Drop-in replacements for the ``positional-encodings`` package's 1D/2D/3D sinusoidal encodings.

``PositionalEncoding{1,2,3}D`` take channel-last tensors ``(B, *S, C)``, their ``Permute`` twins
channels-first ``(B, C, *S)``; both return the encoding in the input's layout and shape, with
the same numbers as ``positional_encodings.torch_encodings`` 6.x (0-based positions, interleaved
``sin, cos`` per frequency, one block of channels per axis in tensor axis order, frequencies
``w_k = 10000^(-2k / F)`` multiplied in as an inverse-frequency table, angles in float32, the
result cast once to the output dtype). Switching is one import::

    # from positional_encodings.torch_encodings import PositionalEncoding2D, Summer
    from vispos import PositionalEncoding2D, Summer

What differs from the package, on purpose:

* One unbatched table per (spatial shape, device, dtype) is cached (LRU, 8 tables, 8 MiB by
  default) and every call writes a new ``(B, ...)`` result from it, which the caller owns: no
  write into a result, by any route (in place, ``.data``, ``.numpy()``, DLPack), reaches another
  call's result. ``zero_copy=True`` opts in to the package's sharing: a broadcast view of the
  cached table (no copy; results share storage and must be treated as read-only).
  ``cached_penc`` is kept: the last returned encoding (that call's own result, never served to
  another call; it holds one output's memory until the next call, or ``cached_penc = None``).
* An input whose channel count differs from ``channels`` raises ``ValueError`` (the package
  silently returned fewer channels); the cache is keyed on dtype and device too (the package
  returned a tensor of the wrong dtype or device); the inverse-frequency table is a
  non-persistent buffer, kept out of ``state_dict`` (a checkpoint holding the package's
  ``inv_freq`` still loads); ``module.half()`` cannot lower the angles' precision.
* Wrong ranks raise ``ValueError`` (the package: ``RuntimeError``); a non-float input needs
  ``dtype_override`` (``TypeError``; the package returned an integer-truncated encoding).

References:
    Vaswani et al., Attention Is All You Need, NeurIPS 2017 (section 3.5);
    P. Tatkowski, ``positional-encodings`` (github.com/tatp22/multidim-positional-encoding),
    the 2D/3D extension and the channel layout reproduced here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .. import _deprecation
from .._cache import DEFAULT_MAX_BYTES, TensorCache, check_max_bytes
from .._cache_owner import CacheOwner, expand_batch
from .._derived import DerivedBuffers
from .._tracing import tracing
from .._checks import check_bool, check_float_dtype, check_int, check_sizes
from .._sincos import frequency_divisors, sincos_embed

__all__ = [
    "PositionalEncoding1D",
    "PositionalEncoding2D",
    "PositionalEncoding3D",
    "PositionalEncodingPermute1D",
    "PositionalEncodingPermute2D",
    "PositionalEncodingPermute3D",
    "Summer",
    "FixEncoding",
]

_TEMPERATURE = 10000.0
_CACHE_SIZE = 8  # tables kept per module (LRU); variable-size inputs evict the oldest


class _GridEncoding(CacheOwner, DerivedBuffers, _deprecation.RenamedAttributes, nn.Module):
    """Shared base of the ``positional-encodings``-compatible classes; see the module docstring.

    Subclasses set only ``num_axes`` (1, 2 or 3) and ``_channels_first``.
    """

    num_axes: int = 0
    _renamed = {"n_spatial": "num_axes"}
    _channels_first: bool = False
    _cache_attr = "_tables"

    def __init__(
        self,
        channels: int,
        dtype_override: torch.dtype | None = None,
        *,
        cache: bool = True,
        cache_bytes: int | None = DEFAULT_MAX_BYTES,
        zero_copy: bool = False,
    ) -> None:
        super().__init__()
        channels = check_int(channels, "channels", minimum=1)
        cache = check_bool(cache, "cache")
        zero_copy = check_bool(zero_copy, "zero_copy")
        self._dtype_override = check_float_dtype(dtype_override, "dtype_override", optional=True)
        budget = check_max_bytes(cache_bytes, "cache_bytes")
        self._tables = TensorCache(_CACHE_SIZE if cache else 0, budget)
        self.zero_copy = zero_copy
        #: the last returned encoding (``positional-encodings``' attribute; None before the
        #: first call). It is that call's result itself: it holds one output's memory until the
        #: next call or ``cached_penc = None``, and is never handed to another call.
        self.cached_penc: Tensor | None = None
        self.register_buffer("inv_freq", None, persistent=False)
        self.org_channels = channels

    @property
    def dtype_override(self) -> torch.dtype | None:
        """The output dtype (None: the input's); assigning it is checked as in the constructor."""
        return self._dtype_override

    @dtype_override.setter
    def dtype_override(self, dtype: torch.dtype | None) -> None:
        self._dtype_override = check_float_dtype(dtype, "dtype_override", optional=True)
        self.cached_penc = None

    @property
    def org_channels(self) -> int:
        """The requested output channels. Setting it re-derives ``channels_per_axis`` and the
        frequencies and empties the cache, so no table built for the old width is returned."""
        return self._org_channels

    @org_channels.setter
    def org_channels(self, channels: int) -> None:
        channels = check_int(channels, "org_channels", minimum=1)
        self._org_channels = channels
        # positional-encodings' rounding: each axis gets ceil(channels / n) rounded up to even;
        # the concatenation is truncated back to ``channels``.
        per_axis = -(-channels // (2 * self.num_axes)) * 2
        self.channels_per_axis = per_axis
        self.channels = per_axis  # the package's name for the per-axis count
        old = self.inv_freq
        device = None if old is None else old.device
        if old is None or not old.is_meta:
            self.inv_freq = self._inverse_frequencies(device)
        self._tables.clear()
        self.cached_penc = None

    # ------------------------------------------------------------------------------------ api
    def forward(self, tensor: Tensor) -> Tensor:
        """The encoding of ``tensor``'s positions, in its layout; see the class docstring.

        Args:
            tensor (Tensor): ``(B, *S, C)`` (channel-last classes) or ``(B, C, *S)`` (Permute).
        """
        spatial, batch, out_dtype = self._parse(tensor)
        device = tensor.device
        table, shared = self._tables.lookup(
            (spatial, device, out_dtype), lambda: self._table(spatial, device, out_dtype)
        )
        out = expand_batch(table, batch, shared=shared, zero_copy=self.zero_copy)
        if not tracing():
            self.cached_penc = out
        return out

    @property
    def channels_first(self) -> bool:
        """bool: True for the ``Permute`` classes (input and output ``(B, C, *S)``), False for
        the channel-last ones (``(B, *S, C)``)."""
        return self._channels_first

    @property
    def cache(self) -> bool:
        """bool: whether tables are cached; assigning False empties and disables the cache."""
        return self._tables.maxsize > 0

    @cache.setter
    def cache(self, value: bool) -> None:
        value = check_bool(value, "cache")
        self._tables.maxsize = _CACHE_SIZE if value else 0

    def _refresh_derived(self) -> None:
        """Rebuilds ``inv_freq`` (float32, on its device), empties the cache and forgets
        ``cached_penc`` (built before the move or cast)."""
        self._tables.clear()
        self.cached_penc = None
        if not self.inv_freq.is_meta:
            self.inv_freq = self._inverse_frequencies(self.inv_freq.device)

    def extra_repr(self) -> str:
        text = f"channels={self.org_channels}, dtype_override={self.dtype_override}"
        if not self.cache:
            text += ", cache=False"
        if self.cache_bytes != DEFAULT_MAX_BYTES:
            text += f", cache_bytes={self.cache_bytes}"
        return text + (", zero_copy=True" if self.zero_copy else "")

    # -------------------------------------------------------------------------------- helpers
    def _layout(self) -> str:
        s = ("L",) if self.num_axes == 1 else ("X", "Y", "Z")[: self.num_axes]
        dims = ", ".join(s)
        return f"(B, C, {dims})" if self._channels_first else f"(B, {dims}, C)"

    def _inverse_frequencies(self, device: torch.device | None) -> Tensor:
        return 1.0 / frequency_divisors(self.channels_per_axis, _TEMPERATURE, device=device)

    def _parse(self, tensor: Tensor) -> tuple[tuple[int, ...], int, torch.dtype]:
        name = type(self).__name__
        if not isinstance(tensor, Tensor):
            raise TypeError(
                f"{name} expects a torch.Tensor {self._layout()}, got {type(tensor).__name__}"
            )
        if tensor.dim() != self.num_axes + 2:
            raise ValueError(
                f"{name} expects a {self.num_axes + 2}-D tensor {self._layout()}, got shape "
                f"{tuple(tensor.shape)}"
            )
        ch_dim = 1 if self._channels_first else -1
        if tensor.shape[ch_dim] != self.org_channels:
            raise ValueError(
                f"{name}(channels={self.org_channels}) got an input with {tensor.shape[ch_dim]} "
                f"channels (shape {tuple(tensor.shape)}, layout {self._layout()}); build it "
                f"with channels={tensor.shape[ch_dim]} or pass a matching input"
            )
        spatial = tuple(tensor.shape[2:]) if self._channels_first else tuple(tensor.shape[1:-1])
        out_dtype = self.dtype_override
        if out_dtype is None:
            if not tensor.dtype.is_floating_point:
                raise TypeError(
                    f"{name} got an input of dtype {tensor.dtype}; the encoding takes the input's "
                    "dtype, which must be floating. Pass dtype_override (e.g. torch.float32)."
                )
            out_dtype = tensor.dtype
        return spatial, tensor.shape[0], out_dtype

    def _table(self, spatial: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
        """Builds the encoding ``Tensor[1, *S, C]`` (or ``[1, C, *S]``) through the N-D core."""
        inv_freq = self.inv_freq
        if inv_freq.device != device or inv_freq.dtype != torch.float32:
            # another device, or a module cast by .half() / .double(): rebuild in float32
            inv_freq = self._inverse_frequencies(device)
        n = len(spatial)
        positions = []
        for axis, size in enumerate(spatial):
            view = [1] * (n + 1)
            view[axis + 1] = size
            positions.append(torch.arange(size, device=device, dtype=torch.float32).view(view))
        # written in the class's own layout, so results are filled by a plain copy
        channel_dim = 1 if self._channels_first else -1
        table = sincos_embed(
            positions, self.channels_per_axis, shape=(1, *spatial), reciprocal=True,
            channel_dim=channel_dim, dtype=dtype, divisors=[inv_freq] * n,
        )
        if table.shape[channel_dim] != self.org_channels:
            table = table.narrow(channel_dim, 0, self.org_channels).contiguous()
        return table

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # positional-encodings saved its inverse frequencies (as "inv_freq", or "penc.inv_freq"
        # in the Permute classes); they are derived here, so such checkpoints load and drop them.
        for key in (prefix + "inv_freq", prefix + "penc.inv_freq"):
            state_dict.pop(key, None)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


_CLASS_DOC = """Sinusoidal {n}D encoding of a {layout_word} tensor, as ``positional-encodings``.

    The ``channels`` are split into {n} block(s) of ``2 * ceil(channels / {two_n})`` channels,
    one per spatial axis in tensor axis order{axes_note}; block ``i`` holds
    ``sin(p_i w_k), cos(p_i w_k)`` interleaved, for the 0-based position ``p_i`` along axis ``i``
    and ``w_k = 10000^(-2k / F)``. The concatenation is truncated to ``channels`` (so odd and
    non-divisible counts work). Equal, in float32, to
    ``positional_encodings.torch_encodings.{name}``.

    Args:
        channels (int): the input's channel count ``C`` (positive).
        dtype_override (torch.dtype, optional): output dtype (floating); default: the input's
            dtype, which must then be floating.
        cache (bool, keyword-only): keep the last {cache_size} unbatched tables, keyed on
            (spatial shape, device, dtype). Default True. Assigning ``module.cache`` later
            takes effect.
        cache_bytes (int, optional, keyword-only): byte budget of the cache; a table larger
            than it is not stored. Default 8 MiB; None: no byte bound.
        zero_copy (bool, keyword-only): False (default): every call returns a new tensor the
            caller owns. True: a broadcast view of the cached table (as the package does):
            results of equal shapes share storage and must be treated as read-only.

    Shape:
        - input: ``Tensor{shape}``; only its shape, dtype and device are read.
        - output: ``Tensor{shape}``, the same shape, in ``dtype_override`` or the input's dtype
          (angles are computed in float32 either way and cast once). A new contiguous tensor
          owned by the caller; with ``zero_copy=True`` a broadcast view of the cached table.

    Raises:
        TypeError: ``channels`` is not an int; ``dtype_override`` is not a floating torch.dtype;
            the input is not a tensor, or is not floating and ``dtype_override`` is not given;
            ``cache`` or ``zero_copy`` is not a bool; ``cache_bytes`` is not an int or None.
        ValueError: ``channels`` <= 0; ``cache_bytes`` < 0; the input does not have {rank}
            dims or has another channel count than ``channels``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5); P. Tatkowski,
        ``positional-encodings`` 6.x (github.com/tatp22/multidim-positional-encoding).
    """


def _doc(name: str, n: int, channels_first: bool) -> str:
    axes = ("L",) if n == 1 else ("X", "Y", "Z")[:n]
    shape = f"[B, C, {', '.join(axes)}]" if channels_first else f"[B, {', '.join(axes)}, C]"
    return _CLASS_DOC.format(
        n=n,
        layout_word="channels-first" if channels_first else "channel-last",
        two_n=2 * n,
        axes_note="" if n == 1 else f" ({', '.join(axes)})",
        name=name,
        cache_size=_CACHE_SIZE,
        shape=shape,
        rank=n + 2,
    )


class PositionalEncoding1D(_GridEncoding):
    __doc__ = _doc("PositionalEncoding1D", 1, False)
    num_axes = 1


class PositionalEncoding2D(_GridEncoding):
    __doc__ = _doc("PositionalEncoding2D", 2, False)
    num_axes = 2


class PositionalEncoding3D(_GridEncoding):
    __doc__ = _doc("PositionalEncoding3D", 3, False)
    num_axes = 3


class PositionalEncodingPermute1D(_GridEncoding):
    __doc__ = _doc("PositionalEncodingPermute1D", 1, True)
    num_axes = 1
    _channels_first = True


class PositionalEncodingPermute2D(_GridEncoding):
    __doc__ = _doc("PositionalEncodingPermute2D", 2, True)
    num_axes = 2
    _channels_first = True


class PositionalEncodingPermute3D(_GridEncoding):
    __doc__ = _doc("PositionalEncodingPermute3D", 3, True)
    num_axes = 3
    _channels_first = True


class Summer(nn.Module):
    """Adds a position encoding to its input: ``tensor + encoding(tensor)``.

    Args:
        encoding (nn.Module): any module returning a tensor of its input's shape, typically a
            ``PositionalEncoding{1,2,3}D``, a Permute twin, or a :class:`FixEncoding`. Stored as
            ``self.penc`` (the package's name, so its checkpoints' keys match).

    Shape:
        - input: ``Tensor[B, *S, C]`` or ``Tensor[B, C, *S]``, as ``encoding`` expects.
        - output: the same shape, a new tensor, in the promoted dtype of the input and the
          encoding (e.g. int64 input + ``dtype_override=torch.float32`` -> float32).

    Raises:
        TypeError: ``encoding`` is not an ``nn.Module``.
        ValueError: the encoding's shape differs from the input's (the package: ``assert``).

    References:
        P. Tatkowski, ``positional-encodings`` 6.x (``Summer``).
    """

    def __init__(self, encoding: nn.Module) -> None:
        super().__init__()
        if not isinstance(encoding, nn.Module):
            raise TypeError(f"encoding must be an nn.Module, got {type(encoding).__name__}")
        self.penc = encoding

    def forward(self, tensor: Tensor) -> Tensor:
        penc = self.penc(tensor)
        if penc.shape != tensor.shape:
            raise ValueError(
                f"the encoding has shape {tuple(penc.shape)} but the input has shape "
                f"{tuple(tensor.shape)}; they must match to be summed"
            )
        return tensor + penc


class FixEncoding(nn.Module):
    """A grid encoding computed once for a fixed spatial shape, as ``positional-encodings``.

    The table is built at construction (on the CPU, in ``encoding.dtype_override`` or float32 —
    the package's behaviour: it does not follow the input's dtype) and rebuilt once per other
    device it meets, and once after ``encoding.org_channels``, ``encoding.dtype_override`` or
    ``shape`` is assigned (the package kept the table of the old settings). ``forward`` only checks
    the input and broadcasts the table over the batch.

    Args:
        encoding (PositionalEncoding{1,2,3}D or PositionalEncodingPermute{1,2,3}D): the
            encoding to fix. Stored as ``self.pos_encoder`` (the package's name).
        shape (sequence of int): the spatial shape ``S`` (batch and channel dims excluded), one
            positive int per axis of ``encoding``.

    Shape:
        - input: ``Tensor[B, *S, C]`` (or ``[B, C, *S]`` for a Permute encoding) with exactly
          this ``S`` and ``C = encoding.org_channels``; any dtype.
        - output: ``Tensor`` of the input's shape, in ``encoding.dtype_override`` or float32: a
          new tensor owned by the caller, or a broadcast view of the table when the encoding
          was built with ``zero_copy=True``.

    Raises:
        TypeError: ``encoding`` is not one of the grid encodings above; ``shape`` is not a
            sequence of ints; the input is not a tensor.
        ValueError: ``shape`` has the wrong length or a non-positive entry; the input's rank,
            spatial shape or channel count differs from the fixed ones.

    References:
        P. Tatkowski, ``positional-encodings`` 6.x (``FixEncoding``).
    """

    def __init__(self, encoding: nn.Module, shape: Sequence[int]) -> None:
        super().__init__()
        if not isinstance(encoding, _GridEncoding):
            raise TypeError(
                "encoding must be a PositionalEncoding{1,2,3}D or "
                f"PositionalEncodingPermute{{1,2,3}}D, got {type(encoding).__name__}"
            )
        self.pos_encoder = encoding
        # one table per (device, shape, channels, dtype), whatever its size (the caller fixed
        # the shape): settings assigned later are followed, never answered from a stale table
        self._tables = TensorCache(4, max_bytes=None, admit_at=1)
        self.shape = shape
        self._lookup(torch.device("cpu"))

    @property
    def shape(self) -> tuple[int, ...]:
        """tuple[int, ...]: the fixed spatial shape ``S``; assignments are checked."""
        return self._shape

    @shape.setter
    def shape(self, shape: Sequence[int]) -> None:
        n = self.pos_encoder.num_axes
        self._shape = check_sizes(shape, "shape", ranks=(n,))  # the spatial shape only
        self.dim = n

    def _lookup(self, device: torch.device) -> tuple[Tensor, bool]:
        enc = self.pos_encoder
        dtype = enc.dtype_override or torch.float32
        key = (device, self._shape, enc.org_channels, dtype)
        return self._tables.lookup(key, lambda: enc._table(self._shape, device, dtype))

    def forward(self, tensor: Tensor) -> Tensor:
        enc = self.pos_encoder
        if not isinstance(tensor, Tensor):
            raise TypeError(
                f"FixEncoding expects a torch.Tensor {enc._layout()}, got {type(tensor).__name__}"
            )
        if enc._channels_first:
            expected = (self.pos_encoder.org_channels, *self.shape)
            got = tuple(tensor.shape[1:])
        else:
            expected = (*self.shape, self.pos_encoder.org_channels)
            got = tuple(tensor.shape[1:])
        if tensor.dim() != self.dim + 2 or got != expected:
            raise ValueError(
                f"FixEncoding was built for inputs (B, {', '.join(map(str, expected))}) "
                f"(layout {enc._layout()}), got shape {tuple(tensor.shape)}"
            )
        table, shared = self._lookup(tensor.device)
        return expand_batch(table, tensor.shape[0], shared=shared, zero_copy=enc.zero_copy)

    def extra_repr(self) -> str:
        return f"shape={self.shape}"
