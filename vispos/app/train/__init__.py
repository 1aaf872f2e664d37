"""DETR training on padded batches (``vispos train``): one shared core, a 2D and a 3D task.

A task (:class:`DetrTask`: datasets, backbone, box geometry, metric; 2D photographs in
:mod:`.task2d` with data from :mod:`.shapes2d`, 3D volumes in :mod:`.task3d` with data from
:mod:`.volumes3d`) plugs into one loop (:mod:`.engine`), one model (:class:`DetrModel` with DETR's
decoder, :mod:`.decoder`), one matcher and criterion (:mod:`.criterion`), checkpoints
(:mod:`.checkpoint`), torchrun support (:mod:`.distributed`), metrics (:mod:`.metrics`), reports
(:mod:`.report`, :mod:`.compare`), the ViT's attention diagnostics from checkpoints
(:mod:`.attention`, :mod:`.diagnose`) and command line (:mod:`._args` and :mod:`._task_args`, the
flags, torch-free; :mod:`.cli`, their checks and :func:`run`).

The names below are imported on first use (PEP 562), so ``vispos train --help`` parses its flags
without torch.
"""

from ... import _lazy

__all__ = [
    "BOX_OPS_2D", "BoxOps", "DetrDecoder", "DetrDecoderLayer", "DetrModel", "DetrTask", "DistContext",
    "MaskBlindGrid", "POS_ARMS", "SetCriterion", "ZeroPosition", "build_model", "coco_map", "evaluate",
    "hungarian_match", "init_distributed", "load_checkpoint", "make_position_embedding", "matched_ious",
    "run", "save_checkpoint", "train_arm",
]

__getattr__, __dir__ = _lazy.load_on_first_use(globals(), [
    "._args", ".checkpoint", ".cli", ".criterion", ".decoder", ".distributed", ".engine", ".metrics", ".model",
    ".task",
])
