"""The shared core of the DETR training demos (2D ``demos.train_detr``, 3D ``demos.train_detr3d``).

A task (:class:`DetrTask`: datasets, backbone, box geometry, metric) plugs into one loop
(:mod:`.engine`), one model (:class:`DetrModel` with DETR's decoder, :mod:`.decoder`), one
matcher and criterion (:mod:`.criterion`), checkpoints (:mod:`.checkpoint`), torchrun support
(:mod:`.distributed`), metrics (:mod:`.metrics`), reports (:mod:`.report`) and command line
(:mod:`.cli`, :func:`run`).
"""

from .checkpoint import load_checkpoint, save_checkpoint
from .cli import run
from .criterion import BOX_OPS_2D, BoxOps, SetCriterion, hungarian_match
from .decoder import DetrDecoder, DetrDecoderLayer
from .distributed import DistContext, init_distributed
from .engine import build_model, evaluate, train_arm
from .metrics import coco_map, matched_ious
from .model import POS_ARMS, DetrModel, MaskBlindGrid, ZeroPosition, make_position_embedding
from .task import DetrTask

__all__ = [
    "BOX_OPS_2D", "BoxOps", "DetrDecoder", "DetrDecoderLayer", "DetrModel", "DetrTask", "DistContext",
    "MaskBlindGrid", "POS_ARMS", "SetCriterion", "ZeroPosition", "build_model", "coco_map", "evaluate",
    "hungarian_match", "init_distributed", "load_checkpoint", "make_position_embedding", "matched_ious",
    "run", "save_checkpoint", "train_arm",
]
