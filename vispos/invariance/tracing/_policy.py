"""The tracer's built-in policy, as entries of the rule book: which modules it traces through,
which packages' modules it keeps whole, and which module it traces as another function.

* traced through (their insides are layers the rule book knows): torchvision's
  ``Conv2dNormActivation`` and its subclasses (RegNet's ``SimpleStemIN``), ``SqueezeExcitation``,
  and timm's ``NormFreeBlock`` (NF-Nets: weight-standardised convolutions, activations, a gain and
  a residual sum), which timm lists as "do not trace";
* kept whole: every other module of ``torchvision.ops`` (as torchvision's feature extraction keeps
  them);
* traced as another function: torchvision's ``StochasticDepth`` in training (torch.fx keeps its
  function whole), written with operations the rule book knows: one Bernoulli factor per item
  (``"row"``) or per batch (``"batch"``), the same on every cell;
* patched while any network is traced: ``torch.jit.isinstance(value, torch.Tensor)`` answers True
  for a traced value (a ``torch.fx.Proxy``), as it does for the tensor the value stands for (MONAI's
  ``UpCat`` guards its skip concatenation with it: without this the trace drops it). This one
  patch stays process-wide while the trace runs (code calls it through the ``torch.jit`` module,
  which torch.fx cannot scope), under :data:`TRACE_LOCK`; another thread calling it meanwhile gets
  the same answers for anything but a traced value.

:data:`TRACE_LOCK` is held while a network is traced with its patches (and while
:func:`~vispos.make_padding_invariant` checks a trace), so patches of two threads never interleave.

References:
    torchvision ``models/feature_extraction.py`` (leaf modules) and ``ops/stochastic_depth.py``;
    timm ``models/_features_fx.py`` (``register_notrace_module``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
import torch.fx as fx
from torch import nn

__all__ = ["TRACE_LOCK", "jit_isinstance_of_traced_values", "register", "stochastic_depth"]

#: held while a network is traced with its tracing patches (torch.fx itself patches
#: ``nn.Module.__call__`` process-wide while it traces)
TRACE_LOCK = threading.RLock()


def stochastic_depth(module: nn.Module, x: Any, num_axes: int) -> Any:
    """torchvision's ``StochasticDepth`` ``module`` on ``x`` as traced: ``x`` itself in eval (or with
    ``p == 0``), else one Bernoulli factor per item (``"row"``) or per batch (``"batch"``)."""
    if not module.training or module.p == 0.0:
        return x
    survival = 1.0 - module.p
    size = [x.shape[0]] + [1] * (1 + num_axes) if module.mode == "row" else [1] * (2 + num_axes)
    noise = torch.empty(size, dtype=x.dtype, device=x.device).bernoulli_(survival)
    if survival > 0.0:
        noise = noise.div_(survival)
    return x * noise


@contextlib.contextmanager
def jit_isinstance_of_traced_values(root: nn.Module, num_axes: int) -> Iterator[None]:
    """While tracing: ``torch.jit.isinstance(proxy, torch.Tensor)`` is True (restored on exit)."""
    real = torch.jit.isinstance

    def isinstance_(obj: Any, target_type: Any) -> bool:
        if isinstance(obj, fx.Proxy) and target_type is torch.Tensor:
            return True
        return real(obj, target_type)

    torch.jit.isinstance = isinstance_
    try:
        yield
    finally:
        torch.jit.isinstance = real


def register(book: Any) -> None:
    """Registers the tracer's built-in policy in ``book`` (a :class:`~vispos.invariance.RuleBook`)."""
    why = "its insides are layers the rule book knows"
    for name in ("torchvision.ops.misc.ConvNormActivation", "torchvision.ops.misc.SqueezeExcitation",
                 "timm.models.nfnet.NormFreeBlock"):
        book.trace_through(name, why)
    book.keep_whole_package("torchvision.ops", "torchvision's feature extraction keeps its ops whole")
    book.trace_as("torchvision.ops.stochastic_depth.StochasticDepth", stochastic_depth)
    book.tracing_patch_all("torch.jit.isinstance", jit_isinstance_of_traced_values)
