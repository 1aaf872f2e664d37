"""The app side of vispos: file loaders, all-or-nothing writes, figures, training, the command.

Everything here depends on the library core (``vispos.nested_tensor``, ``vispos.padding``,
``vispos.encodings``, ``vispos.backbones``, ``vispos.config``) and nothing in the core imports
it (``tests/test_layout.py`` checks both). ``import vispos`` does not load it.

* :mod:`vispos.app.data`: images and volumes from files or shipped samples, as tensors;
* :mod:`vispos.app.figures`: figures returned as ``matplotlib.figure.Figure`` (no file I/O);
* :mod:`vispos.app.png`: figures written as PNGs through :mod:`vispos.app._io`;
* :mod:`vispos.app._io`: all-or-nothing writes of several files (signals, rollback);
* :mod:`vispos.app.train`: DETR training on padded batches (2D and 3D tasks, one core);
* :mod:`vispos.app.cli`: the ``vispos`` command (it owns the terminal): its parser, built from
  the torch-free argument modules :mod:`vispos.app._run_args` (``demo``, ``run``),
  :mod:`vispos.app._plot_args` (``plot``), :mod:`vispos.app._config_command` (``config``) and
  :mod:`vispos.app._train_args` (``train``), and the work of each subcommand, imported only when
  it runs: :mod:`vispos.app._run_command`, :mod:`vispos.app._plot_command`,
  :mod:`vispos.app._train_command`; :mod:`vispos.app._errors`: their error type.

``vispos.data``, ``vispos.viz`` and ``vispos.cli`` stay importable as thin aliases.
"""
