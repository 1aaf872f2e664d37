"""Where each item lies on every feature map, and the runners that carry a batch's paddings.

:mod:`._geometry` replays convolution arithmetic per item (:class:`Window`, the transposed
window, :class:`Geometry`); :mod:`._run` runs a rewritten graph (each batch's paddings in, each
map's padding out); :mod:`._projection` traces, rewrites and runs one submodule of an owner.
"""
