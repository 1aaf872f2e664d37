"""The rewriter: walks a traced graph, asks the rule book for every node and writes the result.

:mod:`._rewrite` and :mod:`._rewrite_base` hold the walk and the operations a rule may ask of it
(:class:`~vispos.invariance.rules.RewriteStep`); :mod:`._values` follows what a graph computes
besides feature maps (sizes, per-item values); :mod:`._ops` is what the rewritten graph calls.
The rewriter decides nothing itself: every choice is a row of the rule book.
"""
