"""Derived buffers of a module: tables rebuilt in float32 on their device after every move.

References:
    ``torch.nn.Module._apply`` (the hook every ``.to()`` / ``.cuda()`` / ``.half()`` /
    ``.to_empty()`` goes through).
"""

from __future__ import annotations

import torch

__all__ = ["DerivedBuffers"]


class DerivedBuffers:
    """Mixin for ``nn.Module``s whose non-persistent buffers are *derived* tables (frequency
    divisors, sinusoid rows): after every ``_apply`` (``.to()``, ``.cuda()``, ``.half()``,
    ``.to_empty()`` after meta-device construction, ...) the tables are rebuilt in float32 on
    their new device and the module's caches are emptied. So a ``.half()`` does not degrade the
    frequencies, ``to_empty`` does not leave uninitialised memory in them, and no cache hands
    out a tensor built before the move. On the meta device nothing is computed.

    Subclasses implement :meth:`_refresh_derived` (and list their caches in it).
    """

    def _refresh_derived(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        out = super()._apply(fn, recurse)  # type: ignore[misc]
        with torch.no_grad():
            self._refresh_derived()
        return out
