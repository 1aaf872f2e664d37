"""``python -m demos.train_detr`` in a clone: the 2D DETR training task, the same as ``vispos train``.

The task lives in the package (:mod:`vispos.app.train.task2d`, data in
:mod:`vispos.app.train.shapes2d`), so it also runs from any directory after ``pip install``; this
entry point only calls it, and shows the task's names under the demo's old module for scripts that
import them. See docs/training.md.
"""

from vispos.app.train._args import POS_ARMS
from vispos.app.train.shapes2d import CLASSES, HELDOUT_PHOTOS, TRAIN_PHOTOS, ShapesOnPhotos, draw_objects, load_photos
from vispos.app.train.task2d import TASK, build_backbone, build_datasets, main

__all__ = ["CLASSES", "TRAIN_PHOTOS", "HELDOUT_PHOTOS", "POS_ARMS", "TASK", "ShapesOnPhotos", "draw_objects",
           "load_photos", "build_backbone", "build_datasets", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
