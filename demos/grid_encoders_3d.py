"""3D encoders on a real volume (nilearn's MNI152 T1 template, shipped with nilearn).

Pads the template and a smaller copy into one ``NestedTensor``, embeds it with the mask-aware
3D ``PositionEmbeddingSine`` and the unmasked ``PositionalEncodingPermute3D``, and writes a figure
of a few channels on the middle axial slice.

    python -m demos.grid_encoders_3d --out demo-grid-3d.png
"""

from __future__ import annotations

import argparse

import vispos
from vispos.app.data import mni152_template, resize_volume

from ._figure import save_channels


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-grid-3d.png")
    parser.add_argument("--max-size", type=int, default=48)
    parser.add_argument("--num-pos-feats", type=int, default=16)
    args = parser.parse_args(argv)

    volume = mni152_template(resolution=2, max_size=args.max_size)  # (1, D, H, W)
    small = resize_volume(volume, scale=0.75)
    batch = vispos.nested_tensor_from_tensor_list([volume, small])
    sine = vispos.PositionEmbeddingSine(args.num_pos_feats, normalize=True, offset=-0.5)(batch)
    features = batch.tensors.expand(-1, 3 * args.num_pos_feats, -1, -1, -1)  # stand-in features
    grid = vispos.PositionalEncodingPermute3D(3 * args.num_pos_feats)(features)
    print(f"MNI152 {tuple(volume.shape)} and {tuple(small.shape)} -> batch {tuple(batch.tensors.shape)}, "
          f"padding {float(batch.mask.float().mean()):.1%}")
    print(f"PositionEmbeddingSine (3D, mask-aware) -> {tuple(sine.shape)}")
    print(f"PositionalEncodingPermute3D (no mask) -> {tuple(grid.shape)}")
    f = args.num_pos_feats
    mid = batch.tensors.shape[2] // 2
    path = save_channels(
        batch.tensors[1, 0, mid], sine[1, :, mid], [0, f, f + 1, 2 * f, 2 * f + 1], args.out,
        "PositionEmbeddingSine 3D on the padded smaller volume, middle slice: D, H and W blocks",
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
