"""What a detection task hands the shared training core: data, backbone, box geometry, metric.

The 2D task (:mod:`vispos.app.train.task2d`) and the 3D one (:mod:`vispos.app.train.task3d`) each
build one :class:`DetrTask`; the core (:mod:`vispos.app.train.engine`, :mod:`vispos.app.train.cli`)
does everything else: the model around the backbone, matching and losses, the loop, checkpoints,
distributed runs, evaluation and reports.

Data contract: both datasets return ``(Tensor[C, *S], target)`` with ``target["labels"]``
``Tensor[T] int64`` in ``[0, len(classes))`` and ``target["boxes"]`` ``Tensor[T, 2 * num_axes]``
float32 center-size boxes in ``[0, 1]``, normalised by the item's own (unpadded) size, in the
coordinate order of ``box_ops``. Item ``i`` must depend only on ``(args.seed, i)``, so that
every process, every arm and a resumed run see the same data.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from torch import Tensor, nn
from torch.utils.data import Dataset

from ._args import TaskFlags
from .criterion import BoxOps

__all__ = ["DetrTask", "Records"]

#: per image ``{"boxes": Tensor[N, 2n] corners in pixels / voxels, "scores": Tensor[N],
#: "labels": Tensor[N] int64}`` (predictions) or ``{"boxes", "labels"}`` (ground truth)
Records = Sequence[Mapping[str, Tensor]]


@dataclass(frozen=True)
class DetrTask:
    """One detection task for the shared core.

    Attributes:
        name (str): short name, e.g. ``"2d"``; written into ``metrics.json``.
        description (str): the first line of ``--help``.
        classes (tuple of str): object classes.
        box_ops (BoxOps): box geometry (2D: ``torchvision.ops``; 3D: ``monai.data.box_utils``).
        add_arguments (callable): ``(parser)``: adds the task's own flags (data, backbone).
        validate (callable): ``(args, error)``: checks the task's flags; ``error(flag, message)``
            ends the program with argparse's exit status 2.
        build_datasets (callable): ``(args) -> (train_set, held_out_set)`` of lengths
            ``args.train_images`` and ``args.eval_images``.
        build_backbone (callable): ``(args) -> Backbone`` (reports ``num_channels``, ``strides``,
            ``num_axes``).
        metric (callable): ``(predictions, ground_truth) -> {name: float}`` over the held-out set
            (:data:`Records`).
        metric_names (tuple of str): the keys ``metric`` returns, in table order.
        headline (str): the metric the paired comparison of arms is made on.
        defaults (mapping): the task's own defaults for shared flags (e.g. ``{"hidden": 48}`` in
            3D, where the width must be divisible by 6 and 8), applied before ``--tiny``'s.
        tiny_defaults (mapping): ``--tiny``'s defaults (flags given explicitly still win).
        backbone_defaults (mapping): ``{--backbone value: defaults}``, applied before ``--tiny``'s.
        doc (str): the page that documents the task's training (``--help``, ``--tiny``'s hint).
        metric_legend (str): one line saying what the metric names mean, printed at the end of a
            run ("" for names that need no word).
    """

    name: str
    description: str
    classes: tuple[str, ...]
    box_ops: BoxOps
    add_arguments: Callable[[argparse.ArgumentParser], None]
    validate: Callable[[argparse.Namespace, Callable[[str, str], NoReturn]], None]
    build_datasets: Callable[[argparse.Namespace], tuple[Dataset, Dataset]]
    build_backbone: Callable[[argparse.Namespace], nn.Module]
    metric: Callable[[Records, Records], dict[str, float]]
    metric_names: tuple[str, ...]
    headline: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    tiny_defaults: Mapping[str, Any] = field(default_factory=dict)
    backbone_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    doc: str = "docs/training.md"
    metric_legend: str = ""

    @classmethod
    def from_flags(cls, flags: TaskFlags, **parts: Any) -> DetrTask:
        """The task whose command-line fields (``name``, ``description``, ``add_arguments``,
        ``defaults``, ``tiny_defaults``, ``backbone_defaults``, ``doc``) are ``flags``'s, the other
        fields ``parts``."""
        return cls(name=flags.name, description=flags.description, add_arguments=flags.add_arguments,
                   defaults=flags.defaults, tiny_defaults=flags.tiny_defaults,
                   backbone_defaults=flags.backbone_defaults, doc=flags.doc, **parts)
