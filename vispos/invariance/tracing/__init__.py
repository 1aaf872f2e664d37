"""The FX tracer: a model traced into a train / eval pair of graphs, and what it patches to trace.

:mod:`._trace` is the tracer (which modules it keeps whole is asked of the rule book);
:mod:`._mode_graphs` keeps one graph per mode and follows the model's hooks and modes.
"""
