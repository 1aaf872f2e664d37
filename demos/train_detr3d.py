"""``python -m demos.train_detr3d`` in a clone: the 3D DETR training task, the same as
``vispos train --volume``.

The task lives in the package (:mod:`vispos.app.train.task3d`, data in
:mod:`vispos.app.train.volumes3d`), so it also runs from any directory after ``pip install``; this
entry point only calls it, and shows the task's names under the demo's old module for scripts that
import them. See docs/training3d.md.
"""

from vispos.app.train._args import POS_ARMS
from vispos.app.train.task3d import (
    BOX_OPS_3D, TASK, backbone_stride, build_backbone, build_datasets, main, monai_ap,
)
from vispos.app.train.volumes3d import CLASSES

__all__ = ["BOX_OPS_3D", "CLASSES", "POS_ARMS", "TASK", "backbone_stride", "build_backbone", "build_datasets",
           "monai_ap", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
