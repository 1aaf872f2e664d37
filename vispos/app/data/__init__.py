"""Images and volumes from files or from shipped samples, as tensors ready to batch.

Nothing is downloaded: the sample photos are the ones scikit-image installs with itself, the
sample volume is the MNI152 T1 template nilearn installs with itself; user volumes are NIfTI files
read by nibabel (``pip install 'vispos[medical]'``). Images: :mod:`vispos.app.data.images`;
volumes: :mod:`vispos.app.data.volumes`.
"""

from ... import _lazy

__all__ = [
    "IMAGE_FORMATS",
    "MAX_IMAGE_PIXELS",
    "MAX_VOLUME_VOXELS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SAMPLE_IMAGES",
    "imagenet_normalize",
    "load_image",
    "load_images",
    "sample_images",
    "VOLUME_NORMALIZATIONS",
    "normalize_intensity",
    "resize_volume",
    "load_volume",
    "load_volumes",
    "mni152_template",
    "sample_volumes",
]

# the loaders import torch: they are imported on first use of a name (PEP 562), so the command's
# parser can read ``_args`` without them
__getattr__, __dir__ = _lazy.load_on_first_use(globals(), [".images", ".volumes"])
