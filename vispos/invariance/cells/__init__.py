"""Maths over each item's valid cells: fills, global and windowed pools, masked norms, up-sampling.

The operations a rewritten graph calls on a padded batch's feature maps; each takes the map and its
:class:`~vispos.Padding` and gives every item what it gets alone. The fused kernels they call live
in :mod:`vispos.ops` (one file per op), never here.
"""
