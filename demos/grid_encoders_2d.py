"""2D grid encoders on a real photo (scikit-image's astronaut).

Shows the one-line switch from ``positional-encodings`` (``PositionalEncodingPermute2D`` and
``Summer``), DETR's learned embedding and the sine embedding on the same feature map, and writes
a figure of a few encoding channels (x block first, as positional-encodings lays them out).

    python -m demos.grid_encoders_2d --out demo-grid-2d.png
"""

from __future__ import annotations

import argparse


import vispos
from vispos.app.data import sample_images

from ._figure import save_channels


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-grid-2d.png")
    parser.add_argument("--max-size", type=int, default=256)
    parser.add_argument("--channels", type=int, default=64)
    args = parser.parse_args(argv)

    (name, image), = sample_images(["astronaut"], max_size=args.max_size)
    x = image.mean(0, keepdim=True).expand(args.channels, -1, -1)[None]  # (1, C, H, W) "features"
    enc = vispos.PositionalEncodingPermute2D(args.channels)
    summed = vispos.Summer(enc)(x)
    pos = enc(x)[0]
    learned = vispos.PositionEmbeddingLearned(args.channels // 2, num_embeddings=64, interpolate=True)(x)
    sine = vispos.PositionEmbeddingSine(args.channels // 2, normalize=True)(x)
    half = args.channels // 2
    print(f"{name}: image {tuple(image.shape)}, features {tuple(x.shape)}")
    print(f"PositionalEncodingPermute2D -> {tuple(pos.shape)}; Summer -> {tuple(summed.shape)}")
    print(f"PositionEmbeddingLearned (tables resized 64 -> {tuple(x.shape[2:])}) -> {tuple(learned.shape)}")
    print(f"PositionEmbeddingSine(normalize=True) -> {tuple(sine.shape)}")
    path = save_channels(
        image.mean(0), pos, [0, 1, 10, half, half + 1, half + 10], args.out,
        f"PositionalEncodingPermute2D({args.channels}) on {name}: x channels 0, 1, 10; y channels {half}, ...",
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
