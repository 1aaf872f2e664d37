"""Argument checks shared by every constructor and function of vispos.

**The rule**: a value of the wrong *type* raises ``TypeError``; a value of the right type but a
wrong *value* (out of range, odd where even is needed, the wrong length) raises ``ValueError``.
A tensor of the wrong dtype, or a ``dtype`` argument of the wrong kind (an integer dtype where
sines are produced), counts as a wrong type: ``TypeError``, as torch itself does.
Every message names the parameter, the value received and what was expected. ``bool`` is not
accepted where an int or a number is asked for (``True`` is not a size).

**Scalars from NumPy and torch**: an integer argument accepts a Python ``int``, a
NumPy integer (``np.int64(4)``, a 0-d integer array) or a 0-d integer tensor, and a real-number
argument also a NumPy floating scalar (``np.float32(0.5)``, a 0-d float array) or a 0-d
floating tensor; never a bool of any library, and an integer argument never a float (``4.0``).
A bool argument accepts a NumPy ``bool_`` and a 0-d bool tensor (never ``0`` / ``1``), and a
sequence argument a list, a tuple, a ``torch.Size`` or a 1-d NumPy array.

**Messages quote values, never tensors**: :func:`describe` gives a tensor's or an array's type,
shape and dtype (its values could fill a screen), any other value by a bounded repr.
Checks return the validated value **as a Python ``int`` / ``float``**, exactly (a float32 or
float64 scalar is represented exactly by a Python float; a NumPy ``longdouble`` that is not is
refused rather than rounded), so a caller writes ``self.n = check_int(n, "n", minimum=1)`` and
keeps no NumPy or tensor scalar (whose arithmetic could round, e.g. in float32).

References:
    einops and torchvision (validate at construction, one error style for every argument).
"""

from __future__ import annotations

import functools
import math
import operator
import os
import reprlib
import sys
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "MAX_SPATIAL",
    "as_bool",
    "as_sequence",
    "check_bool",
    "check_choice",
    "check_dropout",
    "check_fits",
    "check_output_fits",
    "check_file",
    "check_float_dtype",
    "check_int",
    "check_multiple",
    "check_number",
    "check_sizes",
    "count",
    "describe",
    "is_int",
    "as_int",
    "memory_bytes",
    "as_real",
]

MAX_SPATIAL = 3
"""The most spatial axes any vispos module embeds (``D, H, W``)."""


def _type_name(value: Any) -> str:
    return type(value).__name__


_REPR = reprlib.Repr()  # a bounded repr: its cost does not grow with the value
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def count(n: int, noun: str, plural: str | None = None) -> str:
    """A number and its noun, singular or plural as the number asks: ``count(1, "item")`` is
    ``"1 item"``, ``count(3, "item")`` ``"3 items"`` (``plural`` for an irregular noun). Messages
    say counts through it, never ``f"{n} items"``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def describe(value: Any) -> str:
    """``value`` as an error message quotes it: a tensor or an array by its type, shape and dtype
    (never its values: a message stays one line whatever the size), anything else by its
    ``repr`` (containers and strings cut with ``...``: :mod:`reprlib`) and type.

    Examples: ``"Tensor of shape (2, 5, 5) and dtype torch.bool"``, ``"'7' (str)"``.
    """
    np = sys.modules.get("numpy")
    if isinstance(value, torch.Tensor) or (np is not None and isinstance(value, np.ndarray)):
        kind = "Tensor" if isinstance(value, torch.Tensor) else "ndarray"
        return f"{kind} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"{_REPR.repr(value)} ({_type_name(value)})"


def as_bool(value: Any) -> Any:
    """``value`` as a Python ``bool`` when it is a boolean scalar, else None: ``bool``, a NumPy
    ``bool_`` or 0-d bool array, a 0-d bool tensor (never ``0`` / ``1``)."""
    if isinstance(value, bool):
        return value
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, np.bool_):
            return bool(value)
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.bool:
        try:
            return bool(value.item())
        except (RuntimeError, NotImplementedError):  # meta / fake tensors hold no value
            return None
    return None


def as_sequence(value: Any) -> tuple | None:
    """``value`` as a tuple when it is a sequence of scalars: a list, a tuple, a ``torch.Size``
    or a 1-d NumPy array (its entries as NumPy scalars); else None (a str, a tensor, a scalar)."""
    if isinstance(value, (str, bytes)):
        return None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return tuple(value) if value.ndim == 1 else None
    if isinstance(value, (Sequence, torch.Size)) and not isinstance(value, torch.Tensor):
        return tuple(value)
    return None


def _scalar_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype != torch.bool and not value.is_complex()


def as_int(value: Any) -> Any:
    """``value`` as a Python ``int`` when it is an integer scalar, else None.

    Integer scalars: ``int`` (and ``torch.SymInt``, kept symbolic), NumPy integers and 0-d integer
    arrays, 0-d integer tensors. Not bools (Python, NumPy or torch), not floats of any kind.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, torch.SymInt)):
        return value if type(value) is int or isinstance(value, torch.SymInt) else int(value)
    np = sys.modules.get("numpy")  # a NumPy scalar exists only when NumPy is imported
    if np is not None:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, np.integer):
            return int(value)
    if _scalar_tensor(value) and not value.is_floating_point():
        try:
            return int(value.item())
        except (RuntimeError, NotImplementedError):  # meta / fake tensors hold no value
            return None
    return None


def as_real(value: Any, name: str = "value") -> Any:
    """``value`` as a Python ``int`` or ``float`` when it is a real scalar, else None.

    Real scalars: the integer scalars of :func:`as_int` (returned as ``int``, exactly), ``float``,
    NumPy floating scalars and 0-d floating arrays, 0-d floating
    tensors, each converted to a Python float without rounding.

    Raises:
        ValueError: a NumPy ``longdouble`` that a Python float cannot hold exactly (``name``
            names the argument).
    """
    integer = as_int(value)
    if integer is not None:
        return integer
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return float(value)  # np.float64 is a float subclass: a plain float, the same value
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, np.floating):
            out = float(value)
            if value == value and np.longdouble(out) != np.longdouble(value):
                raise ValueError(
                    f"{name} = {describe(value)} cannot be held by a Python float "
                    "without rounding; pass a float64 (or float32) value"
                )
            return out
    if _scalar_tensor(value) and value.is_floating_point():
        try:
            return float(value.item())  # float16 / bfloat16 / float32 / float64: exact
        except (RuntimeError, NotImplementedError):
            return None
    return None


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer scalar (see :func:`as_int`; not a bool): for arguments that
    take an int *or* something else (one size or a sequence of sizes), before the matching check."""
    return as_int(value) is not None


def check_int(
    value: Any, name: str, *, minimum: int | None = None, optional: bool = False, integral: bool = False
) -> Any:
    """An integer scalar (see :func:`as_int`: Python, NumPy or 0-d tensor; not ``bool``)
    ``>= minimum``, returned as a Python ``int``; ``None`` passes when ``optional``.

    ``integral`` is accepted for older callers and changes nothing (every integer scalar is
    accepted).

    Raises:
        TypeError: not an integer. ValueError: below ``minimum``.
    """
    if value is None and optional:
        return None
    want = {None: "an int", 0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
    converted = as_int(value)
    if converted is None:
        raise TypeError(f"{name} must be {want}{' or None' if optional else ''}, got {describe(value)}")
    if minimum is not None and converted < minimum:
        raise ValueError(f"{name} must be {'a positive int' if minimum == 1 else f'>= {minimum}'}, got {converted}")
    return converted


def check_multiple(value: Any, multiple: int, name: str, why: str = "") -> int:
    """A positive integer scalar divisible by ``multiple`` (``why`` explains the constraint),
    returned as a Python ``int``.

    Raises:
        TypeError: not an int. ValueError: not positive or not a multiple.
    """
    converted = as_int(value)
    if converted is None or isinstance(converted, torch.SymInt):
        raise TypeError(f"{name} must be a positive int, got {describe(value)}")
    value = converted
    if value <= 0 or value % multiple:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name} must be a positive multiple of {multiple}{reason}, got {value}")
    return value


def check_bool(value: Any, name: str, *, optional: bool = False) -> Any:
    """A boolean scalar (see :func:`as_bool`: Python, NumPy or 0-d tensor), returned as a Python
    ``bool`` (``None`` passes when ``optional``).

    Raises:
        TypeError: anything else (``0``/``1`` included).
    """
    if value is None and optional:
        return None
    converted = as_bool(value)
    if converted is None:
        raise TypeError(f"{name} must be a bool{' or None' if optional else ''}, got {describe(value)}")
    return converted


def check_number(
    value: Any, name: str, *, finite: bool = True, positive: bool = False, nonnegative: bool = False
) -> Any:
    """A real number (see :func:`as_real`: Python, NumPy or 0-d tensor; not bool), optionally
    finite / > 0 / >= 0, returned as a Python ``int`` or ``float`` holding the same value.

    Raises:
        TypeError: not a real number. ValueError: not finite, or out of the asked range; a NumPy
            ``longdouble`` a Python float cannot hold exactly.
    """
    converted = as_real(value, name)
    if converted is None:
        want = "a finite number" if finite else "a real number"
        raise TypeError(f"{name} must be {want}, got {describe(value)}")
    value = converted
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def check_dropout(value: Any, name: str = "dropout") -> float:
    """A dropout probability: a real number in ``[0, 1)`` (see :func:`as_real`), returned as
    ``float``.

    The one rule for every module with a ``dropout`` argument (1 would zero everything).

    Raises:
        TypeError: not a real number (``bool`` included). ValueError: outside ``[0, 1)``.
    """
    converted = as_real(value, name)
    if converted is None:
        raise TypeError(f"{name} must be a float in [0, 1), got {describe(value)}")
    value = converted
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value}")
    return float(value)


def check_file(path: Any, what: str, expected: str) -> str:
    """An existing regular file (symbolic links followed), returned as ``str``.

    Args:
        path (str | PathLike): the file.
        what (str): names it in messages, e.g. ``"image file"``.
        expected (str): what a directory should have been, e.g. ``"an image file"``.

    Raises:
        TypeError: ``path`` is not a str or PathLike. IsADirectoryError: it is a directory.
        ValueError: it exists but is not a regular file (a device, FIFO or socket).
        FileNotFoundError: nothing is there.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} {path!r} is a directory, not {expected}")
    if not os.path.isfile(path) and os.path.exists(path):
        raise ValueError(f"{what} {path!r} exists but is not a regular file (a device, pipe or socket), not {expected}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path!r} does not exist")
    return path


def check_choice(value: Any, choices: Sequence[Any], name: str) -> Any:
    """One of ``choices`` (compared with ``==``; types are not coerced, except that integer
    choices accept any integer scalar, see :func:`as_int`, returned as ``int``).

    Raises:
        TypeError: of another type than the choices. ValueError: not among them.
    """
    kinds = tuple({type(c) for c in choices})
    if kinds == (int,) and as_int(value) is not None:
        value = as_int(value)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise TypeError(f"{name} must be one of {tuple(choices)}, got {describe(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {describe(value)}")
    return value


def check_float_dtype(dtype: Any, name: str = "dtype", *, optional: bool = False) -> Any:
    """A floating ``torch.dtype`` (``None`` passes when ``optional``).

    Raises:
        TypeError: not a ``torch.dtype`` (e.g. the string ``"float16"``), or a dtype that is not
            floating (an integer output would hold truncated sines).
    """
    if dtype is None and optional:
        return None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"{name} must be a floating torch.dtype such as torch.float16, got {describe(dtype)}"
        )
    if not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch.dtype (sin/cos values), got {dtype}")
    return dtype


def check_sizes(value: Any, name: str, *, n: int | None = None, ranks: Sequence[int] = (1, 2, 3)) -> tuple[int, ...]:
    """Grid sizes: a sequence of positive ints (a list, tuple, ``torch.Size`` or 1-d array, see
    :func:`as_sequence`), or (when ``n`` is given) one int repeated ``n`` times.

    Integer scalars of any library are accepted (see :func:`as_int`); the result holds Python ints.

    Args:
        value: the sizes.
        name (str): the parameter's name for messages.
        n (int, optional): the required number of entries.
        ranks (sequence of int): allowed lengths when ``n`` is not given.

    Raises:
        TypeError: not an int / sequence of ints. ValueError: wrong length, or a non-positive entry.
    """
    if n is not None and is_int(value):
        value = (as_int(value),) * n
    entries = as_sequence(value)
    if entries is None:
        want = f"an int or a sequence of {count(n, 'int')}" if n is not None else f"a sequence of {' or '.join(map(str, ranks))} ints"
        raise TypeError(f"{name} must be {want}, got {describe(value)}")
    sizes = tuple(as_int(s) for s in entries)
    if any(s is None for s in sizes):
        raise TypeError(f"{name} must hold ints, got {describe(value)}")
    if n is not None and len(sizes) != n:
        raise ValueError(f"{name} must be an int or a sequence of {count(n, 'int')}, got {sizes}")
    if n is None and len(sizes) not in ranks:
        raise ValueError(f"{name} must hold {' or '.join(map(str, ranks))} ints, got {sizes}")
    if any(s <= 0 for s in sizes):
        raise ValueError(f"{name} must hold positive ints, got {sizes}")
    return sizes


#: the most bytes one tensor may span: beyond, torch's size arithmetic overflows int64
_ADDRESSABLE = 2**62


@functools.cache
def _host_memory_bytes() -> int | None:
    """The host's RAM, read once per process (two system calls: every encoder call asks)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def memory_bytes(device: torch.device) -> int | None:
    """Total memory of ``device`` (host RAM for CPU), or None when unknown. Reads no tensor."""
    if device.type == "cpu":
        return _host_memory_bytes()
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def _bytes(nbytes: int) -> str:
    return f"{nbytes / 2**30:.4g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def check_fits(need: int, device: torch.device, what: str, hint: str) -> None:
    """The one allocation guard: refuses, before allocating, ``need`` bytes that no machine of
    this kind could hold (more than ``device``'s total memory, :func:`memory_bytes`, or than a
    tensor can span), instead of torch's allocator error after the work before it.

    Args:
        need (int): bytes the allocation would take.
        device (torch.device): where.
        what (str): the message's start, naming what needs the bytes (``"... of float32"``).
        hint (str): the message's end: what to do instead.

    Raises:
        ValueError: ``"{what} need 87.17 GiB, more than the 23.54 GiB of cpu; {hint}"``.
    """
    limit = memory_bytes(device)
    if need < _ADDRESSABLE and (limit is None or need <= limit):
        return
    where = "the largest tensor torch can address" if limit is None or need >= _ADDRESSABLE else f"the {_bytes(limit)} of {device}"
    raise ValueError(f"{what} need {_bytes(need)}, more than {where}; {hint}")


def check_output_fits(owner: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> None:
    """:func:`check_fits` for an encoder's output ``Tensor[shape]`` of ``dtype``: a grid that no
    machine of this kind holds (``Padding.none(1, (100000, 100000))``) is refused by name
    before anything is computed. Python ints only: call it where host facts may be used.

    Raises:
        ValueError: the output cannot fit (the message names ``owner``, the shape and dtype).
    """
    if torch.compiler.is_compiling():  # a host check of Python ints: not in a graph (shapes may be symbolic)
        return
    need = math.prod(int(s) for s in shape) * dtype.itemsize
    check_fits(need, device, f"{owner}: an output of shape {tuple(int(s) for s in shape)} and dtype {dtype} would",
               "embed a smaller grid or fewer items")


def check_index(index: Any, length: int, name: str = "index") -> int:
    """A sequence index: anything ``operator.index`` accepts (``int``, ``numpy.int64``, a 0-d
    integer tensor), in ``[-length, length)``; returned non-negative.

    Raises:
        TypeError: not an integer. IndexError: out of range (as for any Python sequence).
    """
    if isinstance(index, bool):
        raise TypeError(f"{name} must be an int, got {describe(index)}")
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(
            f"{name} must be an int, got {_type_name(index)} (anything operator.index accepts: int, "
            "numpy integers, 0-d integer tensors)"
        ) from None
    if not -length <= i < length:
        raise IndexError(f"{name} {i} is out of range for a batch of {count(length, 'item')}")
    return i % length
