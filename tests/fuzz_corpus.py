"""Corrupted-file corpus and child-process reader for ``tests/test_data_fuzz.py``.

``build_corpus(folder, seed)`` writes valid seed files in every format ``load_image`` and
``load_volume`` accept, then damaged copies of each: truncations, flipped bytes, zeroed holes,
appended garbage, and forged structure fields (chunk and segment lengths, header dimensions,
bit depths, colour types, offsets, NIfTI ``dim`` / ``datatype`` / ``vox_offset`` / scaling),
with checksums recomputed where a decoder would otherwise stop at the checksum. Everything is
drawn from one seeded ``numpy.random.Generator``, so a failure names a file that the same seed
rebuilds.

Run as a script, it is the child process: ``python fuzz_corpus.py LIST.json`` reads each listed
file with vispos' loader and prints one JSON line per file, ``{"i": k, "start": true}`` before the
read and ``{"i": k, "status": ..., ...}`` after it (flushed), so the parent can tell which file a
crash or a hang happened in, and time each read on its own. Its data segment is limited
(``RLIMIT_DATA``, 3 GiB): a decoder asking a forged header's size of memory fails the read.

Its name does not match ``test_*.py``: pytest does not collect it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

# ------------------------------------------------------------------------------------ seeds


def _photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A small RGB uint8 picture: smooth gradients plus noise (compresses like a photo)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([xx / max(w - 1, 1), yy / max(h - 1, 1), (xx + yy) / (h + w)], -1)
    noisy = base * 200 + rng.normal(0, 20, (h, w, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def _save(im, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_raw(width: int, height: int, depth: int, colour: int, rows: bytes, interlace=0) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    return (
        b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(rows))
        + _png_chunk(b"IEND", b"")
    )


def _png_rgb16(arr: np.ndarray) -> bytes:
    h, w, _ = arr.shape
    rows = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))
    return _png_raw(w, h, 16, 2, rows)


def image_seeds(rng: np.random.Generator) -> dict[str, bytes]:
    """Valid files of every image format and variant ``load_image`` reads, keyed by a name
    whose suffix is the file extension."""
    from PIL import Image

    rgb = _photo(rng, 19, 26)
    grey = rgb[..., 0].copy()
    rgba = np.dstack([rgb, grey[..., None]])
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the orientation path is exercised too
    exif_bytes = exif.tobytes()
    pal = Image.fromarray(rgb).convert("P")
    seeds = {
        "rgb.png": _save(Image.fromarray(rgb), "PNG"),
        "grey.png": _save(Image.fromarray(grey), "PNG"),
        "grey_alpha.png": _save(Image.fromarray(grey).convert("LA"), "PNG"),
        "rgba.png": _save(Image.fromarray(rgba), "PNG"),
        "palette.png": _save(pal, "PNG", transparency=3),
        "bilevel.png": _save(Image.fromarray(grey).convert("1"), "PNG"),
        "grey16.png": _save(Image.fromarray(grey.astype(np.uint16) * 257 + 3), "PNG"),
        "rgb16.png": _png_rgb16(rgb.astype(np.uint16) * 257),
        "interlaced.png": _save(Image.fromarray(rgb), "PNG", interlace=1),
        "exif.png": _save(Image.fromarray(rgb), "PNG", exif=exif_bytes),
        "baseline.jpg": _save(Image.fromarray(rgb), "JPEG", quality=90),
        "progressive.jpg": _save(Image.fromarray(rgb), "JPEG", progressive=True),
        "grey.jpg": _save(Image.fromarray(grey), "JPEG"),
        "cmyk.jpg": _save(Image.fromarray(rgb).convert("CMYK"), "JPEG"),
        "exif.jpg": _save(Image.fromarray(rgb), "JPEG", exif=exif_bytes),
        "lossless.webp": _save(Image.fromarray(rgb), "WEBP", lossless=True),
        "lossy.webp": _save(Image.fromarray(rgb), "WEBP", quality=80),
        "alpha.webp": _save(Image.fromarray(rgba), "WEBP", quality=80),
        "exif.webp": _save(Image.fromarray(rgb), "WEBP", lossless=True, exif=exif_bytes),
        "still.gif": _save(pal, "GIF"),
        "rgb.tif": _save(Image.fromarray(rgb), "TIFF"),
        "lzw.tif": _save(Image.fromarray(rgb), "TIFF", compression="tiff_lzw"),
        "grey16.tif": _save(Image.fromarray(grey.astype(np.uint16) * 250), "TIFF"),
        "float.tif": _save(Image.fromarray(grey.astype(np.float32) / 255, mode="F"), "TIFF"),
        "exif.tif": _save(Image.fromarray(rgb), "TIFF", exif=exif_bytes),
        "rgb.bmp": _save(Image.fromarray(rgb), "BMP"),
        "palette.bmp": _save(pal, "BMP"),
        "rgb.ppm": _save(Image.fromarray(rgb), "PPM"),
        "grey16.pgm": _save(Image.fromarray(grey.astype(np.uint16) * 200), "PPM"),
    }
    frames = [pal, Image.fromarray(255 - rgb).convert("P")]
    seeds["animated.gif"] = _save(frames[0], "GIF", save_all=True, append_images=frames[1:])
    seeds["multi.mpo"] = _save(frames[0].convert("RGB"), "MPO", save_all=True, append_images=[frames[1].convert("RGB")])
    seeds["animated.webp"] = _save(
        Image.fromarray(rgb), "WEBP", save_all=True, append_images=[Image.fromarray(255 - rgb)],
        lossless=True,
    )
    try:
        seeds["still.avif"] = _save(Image.fromarray(rgb), "AVIF", quality=60)
    except (KeyError, OSError, ValueError):  # a Pillow built without libavif
        pass
    return seeds


def volume_seeds(rng: np.random.Generator) -> dict[str, bytes]:
    """Valid NIfTI-1 / NIfTI-2 files (``.nii``, ``.nii.gz``), float32 and scaled int16."""
    import nibabel as nib

    affine = np.diag([1.5, 1.5, 2.0, 1.0])
    vol = rng.normal(100, 30, (7, 6, 5)).astype(np.float32)
    vol[0] = 0  # background, as MRI has
    seeds = {}
    img = nib.Nifti1Image(vol, affine)
    seeds["float.nii"] = img.to_bytes()
    seeds["float.nii.gz"] = gzip.compress(img.to_bytes(), mtime=0)
    scaled = nib.Nifti1Image((vol * 10).astype(np.int16), affine)
    scaled.header.set_slope_inter(0.1, -5.0)
    seeds["scaled.nii"] = scaled.to_bytes()
    four = nib.Nifti1Image(rng.normal(0, 1, (5, 4, 3, 2)).astype(np.float32), affine)
    seeds["four.nii.gz"] = gzip.compress(four.to_bytes(), mtime=0)
    seeds["nifti2.nii"] = nib.Nifti2Image(vol, affine).to_bytes()
    return seeds


def nifti_pair(rng: np.random.Generator) -> tuple[bytes, bytes]:
    """A valid NIfTI-1 ``.hdr`` / ``.img`` pair (int16 voxels): (header bytes, voxel bytes)."""
    import nibabel as nib

    vol = rng.integers(-200, 900, (6, 5, 4)).astype(np.int16)
    img = nib.Nifti1Pair(vol, np.diag([1.0, 1.2, 3.0, 1.0]))
    files = nib.Nifti1Pair.make_file_map({"header": io.BytesIO(), "image": io.BytesIO()})
    img.to_file_map(files)
    return files["header"].fileobj.getvalue(), files["image"].fileobj.getvalue()


# -------------------------------------------------------------------------------- mutations


def _generic(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """Truncations, flipped bytes, zeroed holes and appended garbage, anywhere in the file."""
    n = len(data)
    out = [("empty", b""), ("trunc1", data[:1]), ("trunc8", data[:8]), ("trunc_last", data[:-1])]
    for frac in (0.1, 0.25, 0.5, 0.75, 0.9):
        out.append((f"trunc{int(frac * 100)}", data[: int(n * frac)]))
    for k in range(6):
        cut = int(rng.integers(9, n - 1))
        out.append((f"trunc_at{cut}", data[:cut]))
    for k in range(8):
        buf = bytearray(data)
        for pos in rng.integers(0, n, size=1 if k < 5 else 6):
            buf[pos] ^= int(rng.integers(1, 256))
        out.append((f"flip{k}", bytes(buf)))
    for k in range(3):
        buf = bytearray(data)
        start = int(rng.integers(0, n))
        buf[start : start + int(rng.integers(8, 65))] = b"\0" * len(buf[start : start + 64])
        out.append((f"hole{k}", bytes(buf[:n])))
    out.append(("garbage_tail", data + rng.bytes(97)))
    return out


def _set(data: bytes, offset: int, fmt: str, value) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


def _png_chunks(data: bytes) -> list[tuple[int, int, bytes]]:
    """(offset of the length field, data length, type) of every chunk."""
    chunks, pos = [], 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunks.append((pos, length, kind))
        pos += 12 + length
    return chunks


def _png_replace(data: bytes, kind: bytes, payload: bytes, *, fix_crc: bool = True) -> bytes:
    for pos, length, k in _png_chunks(data):
        if k == kind:
            crc = zlib.crc32(kind + payload) if fix_crc else zlib.crc32(kind + payload) ^ 0xFFFF
            return (
                data[:pos] + struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", crc) + data[pos + 12 + length :]
            )
    return data


def _png(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    chunks = _png_chunks(data)
    out = []
    for pos, length, kind in chunks:  # forged lengths, CRC left alone
        name = kind.decode("latin-1")
        for forged in (0, 1, length + 1, max(length - 1, 0), 0x7FFFFFFF, 0xFFFFFFFF):
            out.append((f"len_{name}_{forged}", _set(data, pos, ">I", forged)))
    pos, length, _ = chunks[0]
    ihdr = data[pos + 8 : pos + 8 + length]
    w, h, depth, colour, comp, filt, inter = struct.unpack(">IIBBBBB", ihdr)
    forged_ihdr = {
        "w0": (0, h, depth, colour, comp, filt, inter),
        "h0": (w, 0, depth, colour, comp, filt, inter),
        "wide": (w * 3, h, depth, colour, comp, filt, inter),
        "tall": (w, h + 5, depth, colour, comp, filt, inter),
        "narrow": (max(w // 2, 1), h, depth, colour, comp, filt, inter),
        "huge": (0x7FFFFFFF, 0x7FFFFFFF, depth, colour, comp, filt, inter),
        "bomb": (60000, 60000, depth, colour, comp, filt, inter),
        "depth3": (w, h, 3, colour, comp, filt, inter),
        "depth16": (w, h, 16 if depth != 16 else 8, colour, comp, filt, inter),
        "colour1": (w, h, depth, 1, comp, filt, inter),
        "colour7": (w, h, depth, 7, comp, filt, inter),
        "colour3": (w, h, depth, 3, comp, filt, inter),
        "comp1": (w, h, depth, colour, 1, filt, inter),
        "filter1": (w, h, depth, colour, comp, 1, inter),
        "interlace": (w, h, depth, colour, comp, filt, 1 - inter),
        "interlace2": (w, h, depth, colour, comp, filt, 2),
    }
    for name, fields in forged_ihdr.items():
        out.append((f"ihdr_{name}", _png_replace(data, b"IHDR", struct.pack(">IIBBBBB", *fields))))
    idats = [(p, n) for p, n, k in chunks if k == b"IDAT"]
    stream = b"".join(data[p + 8 : p + 8 + n] for p, n in idats)
    first = idats[0][0]
    rest_start = idats[-1][0] + 12 + idats[-1][1]

    def with_idat(payload: bytes, fix_crc: bool = True) -> bytes:
        crc = zlib.crc32(b"IDAT" + payload) ^ (0 if fix_crc else 0x5A5A)
        return (
            data[:first] + struct.pack(">I", len(payload)) + b"IDAT" + payload
            + struct.pack(">I", crc) + data[rest_start:]
        )

    raw = zlib.decompress(stream)
    stride = max(len(raw) // max(h, 1), 1)
    bad_filter = bytearray(raw)
    for row in range(0, len(raw), stride):
        bad_filter[row] = 7
    out += [
        ("idat_empty", with_idat(b"")),
        ("idat_short", with_idat(stream[: len(stream) // 2])),
        ("idat_badcrc", with_idat(stream, fix_crc=False)),
        ("idat_garbage", with_idat(rng.bytes(len(stream)))),
        ("idat_filter7", with_idat(zlib.compress(bytes(bad_filter)))),
        ("idat_filter7_first", with_idat(zlib.compress(b"\x07" + raw[1:]))),
        ("idat_too_little", with_idat(zlib.compress(raw[: len(raw) // 3]))),
        ("idat_too_much", with_idat(zlib.compress(raw + raw))),
        ("idat_stored_garbage", with_idat(zlib.compress(rng.bytes(len(raw)), 0))),
        ("no_iend", data[:rest_start]),
        ("no_idat", data[:first] + data[rest_start:]),
    ]
    return out


def _jpeg_segments(data: bytes) -> list[tuple[int, int, int]]:
    """(offset of the marker, marker byte, segment length) up to the first scan."""
    segs, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        segs.append((pos, marker, length))
        if marker == 0xDA:
            break
        pos += 2 + length
    return segs


def _jpeg(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    out = []
    segs = _jpeg_segments(data)
    for pos, marker, length in segs:
        for forged in (0, 2, length - 1, length + 7, 0xFFFF):
            out.append((f"seg{marker:02X}_len{forged}", _set(data, pos + 2, ">H", forged)))
    for pos, marker, length in segs:
        if marker in (0xC0, 0xC1, 0xC2):  # SOF: precision, height, width, components
            for name, off, fmt, value in (
                ("h0", 5, ">H", 0), ("w0", 7, ">H", 0), ("h65535", 5, ">H", 65535),
                ("w65535", 7, ">H", 65535), ("hbig", 5, ">H", 4000), ("prec12", 4, ">B", 12),
                ("prec0", 4, ">B", 0), ("ncomp0", 9, ">B", 0), ("ncomp9", 9, ">B", 9),
            ):
                out.append((f"sof_{name}", _set(data, pos + off, fmt, value)))
            # sampling factors of the first component: 0 and out-of-range
            out.append(("sof_sampling0", _set(data, pos + 11, ">B", 0x00)))
            out.append(("sof_sampling_big", _set(data, pos + 11, ">B", 0xFF)))
            out.append(("sof_qtable9", _set(data, pos + 12, ">B", 9)))
        if marker == 0xC4:  # DHT: garbage table
            buf = bytearray(data)
            buf[pos + 5 : pos + 2 + length] = rng.bytes(length - 3)
            out.append(("dht_garbage", bytes(buf)))
        if marker == 0xDA:  # the scan: damage inside the entropy-coded data
            start = pos + 2 + length
            scan = data[start:-2]
            out.append(("scan_garbage", data[:start] + rng.bytes(len(scan)) + data[-2:]))
            out.append(("scan_zero", data[:start] + bytes(len(scan)) + data[-2:]))
            out.append(("scan_half", data[: start + len(scan) // 2] + b"\xff\xd9"))
            out.append(("no_eoi", data[:-2]))
    return out


def _webp(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    out = [(f"riff_{v}", _set(data, 4, "<I", v)) for v in (0, 4, len(data), 0xFFFFFFF0)]
    pos = 12
    while pos + 8 <= len(data):
        kind = data[pos : pos + 4]
        size = struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        name = kind.decode("latin-1").strip()
        for v in (0, 1, size + 1, 0x7FFFFFFF):
            out.append((f"{name}_size{v}", _set(data, pos + 4, "<I", v)))
        if kind == b"VP8X":  # canvas width - 1 and height - 1 (24 bits each)
            buf = bytearray(data)
            buf[pos + 12 : pos + 18] = b"\xff\xff\xff\xff\xff\xff"
            out.append(("vp8x_canvas_huge", bytes(buf)))
            buf = bytearray(data)
            buf[pos + 12 : pos + 18] = b"\x00\x00\x00\x00\x00\x00"
            out.append(("vp8x_canvas_1", bytes(buf)))
        if kind == b"VP8L":  # 14-bit width - 1 and height - 1 after the signature byte
            out.append(("vp8l_dims_max", _set(data, pos + 9, "<I", 0x0FFFFFFF)))
            out.append(("vp8l_dims_0", _set(data, pos + 9, "<I", 0)))
        if kind == b"VP8 ":  # key frame: 3-byte tag, start code, then 14-bit dims
            out.append(("vp8_dims_max", _set(data, pos + 14, "<I", 0xFFFFFFFF)))
            out.append(("vp8_dims_0", _set(data, pos + 14, "<I", 0)))
        pos += 8 + size + (size & 1)
    return out


def _gif(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    out = [
        ("screen_0", _set(data, 6, "<HH", 0) if False else _set(_set(data, 6, "<H", 0), 8, "<H", 0)),
        ("screen_max", _set(_set(data, 6, "<H", 0xFFFF), 8, "<H", 0xFFFF)),
        ("screen_small", _set(_set(data, 6, "<H", 3), 8, "<H", 2)),
    ]
    flags = data[10]
    table = 3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0
    pos = 13 + table
    while pos < len(data) and data[pos] == 0x21:  # extensions before the first image
        pos += 2
        while pos < len(data) and data[pos]:
            pos += data[pos] + 1
        pos += 1
    if pos + 10 < len(data) and data[pos] == 0x2C:  # image descriptor
        out += [
            ("frame_offset_max", _set(_set(data, pos + 1, "<H", 0xFFFF), pos + 3, "<H", 0xFFFF)),
            ("frame_size_max", _set(_set(data, pos + 5, "<H", 0xFFFF), pos + 7, "<H", 0xFFFF)),
            ("frame_size_0", _set(_set(data, pos + 5, "<H", 0), pos + 7, "<H", 0)),
            ("frame_bigger", _set(data, pos + 5, "<H", data[6] + 40)),
            ("frame_local_table", _set(data, pos + 9, "<B", 0x87)),
        ]
        lzw = pos + 10 + (3 * 2 ** ((data[pos + 9] & 7) + 1) if data[pos + 9] & 0x80 else 0)
        for v in (0, 1, 11, 12, 255):
            out.append((f"lzw_min{v}", _set(data, lzw, "<B", v)))
        out.append(("lzw_block_max", _set(data, lzw + 1, "<B", 255)))
        buf = bytearray(data)
        end = min(len(buf) - 1, lzw + 2 + data[lzw + 1])
        buf[lzw + 2 : end] = rng.bytes(end - lzw - 2)
        out.append(("lzw_garbage", bytes(buf)))
    return out


_TIFF_TYPES = {3: ("H", 2), 4: ("I", 4)}


def _tiff(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    order = "<" if data[:2] == b"II" else ">"
    ifd = struct.unpack(order + "I", data[4:8])[0]
    count = struct.unpack(order + "H", data[ifd : ifd + 2])[0]
    out = [
        ("ifd_past_end", _set(data, 4, order + "I", len(data) + 1000)),
        ("ifd_zero", _set(data, 4, order + "I", 0)),
        ("ifd_inside_header", _set(data, 4, order + "I", 2)),
        ("ifd_count_max", _set(data, ifd, order + "H", 0xFFFF)),
        ("ifd_count_0", _set(data, ifd, order + "H", 0)),
        ("next_ifd_loop", _set(data, ifd + 2 + 12 * count, order + "I", ifd)),
    ]
    forged = {
        256: [0, 1, 0xFFFF, 0x7FFFFFFF],  # ImageWidth
        257: [0, 1, 0xFFFF, 0x7FFFFFFF],  # ImageLength
        258: [0, 1, 3, 12, 64],  # BitsPerSample
        259: [0, 2, 6, 7, 0xFFFF],  # Compression
        262: [5, 9, 0xFFFF],  # PhotometricInterpretation
        273: [0, len(data), 0x7FFFFFFF],  # StripOffsets
        277: [0, 2, 9, 0xFFFF],  # SamplesPerPixel
        278: [0, 1, 0x7FFFFFFF],  # RowsPerStrip
        279: [0, 1, 0x7FFFFFFF],  # StripByteCounts
        284: [0, 2, 9],  # PlanarConfiguration
        339: [0, 3, 9],  # SampleFormat
    }
    for k in range(count):
        entry = ifd + 2 + 12 * k
        tag, typ, n = struct.unpack(order + "HHI", data[entry : entry + 8])
        if tag in forged and typ in _TIFF_TYPES:
            code, size = _TIFF_TYPES[typ]
            for value in forged[tag]:
                if value >= 2 ** (8 * size):
                    continue
                if n * size <= 4:
                    out.append((f"tag{tag}_{value}", _set(data, entry + 8, order + code, value)))
                else:  # the values live elsewhere: forge the first one
                    where = struct.unpack(order + "I", data[entry + 8 : entry + 12])[0]
                    if where + size <= len(data):
                        out.append((f"tag{tag}_{value}", _set(data, where, order + code, value)))
            out.append((f"tag{tag}_count_max", _set(data, entry + 4, order + "I", 0x3FFFFFFF)))
            out.append((f"tag{tag}_type_bad", _set(data, entry + 2, order + "H", 99)))
    return out


def _bmp(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    return [
        ("file_size_0", _set(data, 2, "<I", 0)),
        ("offbits_past_end", _set(data, 10, "<I", len(data) + 10)),
        ("offbits_0", _set(data, 10, "<I", 0)),
        ("header_size_bad", _set(data, 14, "<I", 7)),
        ("header_size_huge", _set(data, 14, "<I", 0x7FFFFFFF)),
        ("width_0", _set(data, 18, "<i", 0)),
        ("width_neg", _set(data, 18, "<i", -5)),
        ("width_huge", _set(data, 18, "<i", 0x7FFFFFFF)),
        ("width_bigger", _set(data, 18, "<i", 400)),
        ("height_0", _set(data, 22, "<i", 0)),
        ("height_neg", _set(data, 22, "<i", -struct.unpack("<i", data[22:26])[0])),
        ("height_min", _set(data, 22, "<i", -(2**31))),
        ("height_bigger", _set(data, 22, "<i", 300)),
        ("planes_0", _set(data, 26, "<H", 0)),
        *[(f"bits_{v}", _set(data, 28, "<H", v)) for v in (0, 1, 3, 4, 16, 32, 64, 0xFFFF)],
        *[(f"compression_{v}", _set(data, 30, "<I", v)) for v in (1, 2, 3, 4, 5, 99)],
        ("colours_used_huge", _set(data, 46, "<I", 0x7FFFFFFF)),
        ("colours_used_257", _set(data, 46, "<I", 257)),
    ]


def _pnm(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    head, _, body = data.partition(b"\n")
    magic = head  # P5 / P6, then "W H\nMAXVAL\n"
    parts = body.split(b"\n", 2)
    dims, maxval, pixels = parts[0], parts[1], parts[2] if len(parts) > 2 else b""

    def make(d=dims, m=maxval, p=pixels, g=magic):
        return g + b"\n" + d + b"\n" + m + b"\n" + p

    return [
        ("dims_0", make(d=b"0 0")), ("dims_huge", make(d=b"2147483647 2147483647")),
        ("dims_bomb", make(d=b"60000 60000")), ("dims_neg", make(d=b"-3 4")),
        ("dims_text", make(d=b"abc def")), ("dims_bigger", make(d=b"90 90")),
        ("maxval_0", make(m=b"0")), ("maxval_70000", make(m=b"70000")),
        ("maxval_1", make(m=b"1")), ("maxval_text", make(m=b"x")),
        ("magic_p4", make(g=b"P4")), ("magic_p7", make(g=b"P7")), ("magic_pf", make(g=b"Pf")),
        ("magic_p2", make(g=b"P2")),
    ]


def _avif(data: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    out = []
    for box in (b"ftyp", b"meta", b"iloc", b"ispe", b"mdat", b"av1C", b"ipma", b"iprp"):
        at = data.find(box)
        if at >= 4:
            for v in (0, 1, 7, 0xFFFFFFFF):
                out.append((f"{box.decode()}_size{v}", _set(data, at - 4, ">I", v)))
    at = data.find(b"ispe")
    if at >= 0:  # version/flags, then width and height
        out.append(("ispe_huge", _set(_set(data, at + 8, ">I", 0xFFFFFFFF), at + 12, ">I", 0xFFFFFFFF)))
        out.append(("ispe_0", _set(_set(data, at + 8, ">I", 0), at + 12, ">I", 0)))
        out.append(("ispe_bomb", _set(_set(data, at + 8, ">I", 60000), at + 12, ">I", 60000)))
    return out


def _nifti(data: bytes, rng: np.random.Generator, version: int) -> list[tuple[str, bytes]]:
    """Forged NIfTI header fields (offsets from the NIfTI-1 / NIfTI-2 standards)."""
    if version == 1:
        dim, dim_fmt, dtype_off, bitpix_off = 40, "<h", 70, 72
        pixdim, vox, vox_fmt, slope, inter, slope_fmt = 76, 108, "<f", 112, 116, "<f"
        magic_at, size_fmt = 344, "<i"
    else:
        dim, dim_fmt, dtype_off, bitpix_off = 16, "<q", 12, 14
        pixdim, vox, vox_fmt, slope, inter, slope_fmt = 104, 168, "<q", 176, 184, "<d"
        magic_at, size_fmt = 4, "<i"
    step = struct.calcsize(dim_fmt)
    out = [
        ("sizeof_hdr_0", _set(data, 0, size_fmt, 0)),
        ("sizeof_hdr_big", _set(data, 0, size_fmt, 1 << 20)),
        ("magic_bad", _set(data, magic_at, "4s", b"xyz\0")),
        ("magic_pair", _set(data, magic_at, "4s", b"ni1\0" if version == 1 else b"ni2\0")),
    ]
    for value in (0, 1, 2, 5, 7, 8, 9, -1):
        out.append((f"dim0_{value}", _set(data, dim, dim_fmt, value)))
    for axis in (1, 2, 3, 4):
        for value in (0, -1, 1, 100, 32767):
            out.append((f"dim{axis}_{value}", _set(data, dim + axis * step, dim_fmt, value)))
    out.append(("dims_bomb", _set(_set(_set(data, dim + step, dim_fmt, 30000), dim + 2 * step, dim_fmt, 30000), dim + 3 * step, dim_fmt, 30000)))
    for value in (0, 1, 32, 128, 255, 511, 1024, 1280, 1536, 1792, 2048, 2304, 99):
        out.append((f"datatype_{value}", _set(data, dtype_off, "<h", value)))
    for value in (0, 1, 7, 64, -8):
        out.append((f"bitpix_{value}", _set(data, bitpix_off, "<h", value)))
    for value in (0, 4, 200, 352 if version == 1 else 544, 10**7, -16):
        out.append((f"vox_offset_{value}", _set(data, vox, vox_fmt, value)))
    if vox_fmt == "<f":
        out.append(("vox_offset_nan", _set(data, vox, vox_fmt, float("nan"))))
        out.append(("vox_offset_inf", _set(data, vox, vox_fmt, float("inf"))))
    for value in (float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1e-45, 0.0):
        out.append((f"scl_slope_{value}", _set(data, slope, slope_fmt, value)))
        out.append((f"scl_inter_{value}", _set(data, inter, slope_fmt, value)))
    for value in (float("nan"), 0.0, -1.0, 1e30):
        out.append((f"pixdim1_{value}", _set(data, pixdim + 4 * (2 if version == 2 else 1), "<f" if version == 1 else "<d", value)))
    return out


def _nifti_voxels(rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """Valid headers around extreme voxels: finite values near float32's limit, inf, NaN."""
    import nibabel as nib

    out = []
    base = rng.normal(0, 1, (6, 5, 4)).astype(np.float32)
    for name, values in (
        ("near_max", [3.0e38, -3.0e38]),
        ("max_one", [np.finfo(np.float32).max]),
        ("max_pair", [np.finfo(np.float32).max, np.finfo(np.float32).max]),
        ("min_pair", [-np.finfo(np.float32).max, -np.finfo(np.float32).max]),
        ("inf", [np.inf, -np.inf]),
        ("nan", [np.nan]),
        ("subnormal", [1e-45, -1e-45]),
    ):
        vol = base.copy()
        vol.flat[: len(values)] = values
        out.append((f"voxels_{name}", nib.Nifti1Image(vol, np.eye(4)).to_bytes()))
    big = np.full((4, 3, 3), 3.0e38, np.float32)
    out.append(("voxels_all_near_max", nib.Nifti1Image(big, np.eye(4)).to_bytes()))
    wide = np.array([1e30, -1e30, 0, 2e38], np.float64).reshape(2, 2, 1)
    out.append(("voxels_float64_wide", nib.Nifti1Image(wide, np.eye(4)).to_bytes()))
    ints = np.array([-32768, 32767, 0, 1] * 6, np.int16).reshape(2, 3, 4)
    img = nib.Nifti1Image(ints, np.eye(4))
    img.header.set_slope_inter(1e34, 0)
    out.append(("voxels_int16_slope_1e34", img.to_bytes()))
    return out


def _gz_mutations(raw: bytes, packed: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """Damage to a ``.nii.gz``: to the gzip stream, and forged headers inside a valid stream."""
    out = [(f"gz_{n}", d) for n, d in _generic(packed, rng)]
    out += [(f"inner_{n}", gzip.compress(d, mtime=0)) for n, d in _nifti(raw, rng, 1)[::3]]
    out.append(("gz_inner_truncated", gzip.compress(raw[: len(raw) // 2], mtime=0)))
    out.append(("gz_two_members", packed + gzip.compress(b"junk", mtime=0)))
    out.append(("gz_bad_crc", packed[:-8] + bytes(8)))
    return out


_STRUCTURED = {
    ".png": _png, ".jpg": _jpeg, ".mpo": _jpeg, ".webp": _webp, ".gif": _gif, ".tif": _tiff, ".bmp": _bmp,
    ".ppm": _pnm, ".pgm": _pnm, ".avif": _avif,
}


#: every normalisation ``load_volume`` takes: each volume is read with each
NORMALIZATIONS = ("zscore", "minmax", "percentile", None)


def build_corpus(folder: Path, seed: int = 0) -> list[dict]:
    """Writes the seeds and their damaged copies under ``folder``; returns one record per read,
    ``{"path", "kind": "image" | "volume", "seed": name}`` (volumes: one record per
    normalisation, with ``"normalize"``)."""
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    records = []

    def write(name: str, data: bytes, kind: str, seed_name: str) -> None:
        path = folder / name
        path.write_bytes(data)
        if kind == "image":
            records.append({"path": str(path), "kind": kind, "seed": seed_name})
        else:
            for mode in NORMALIZATIONS:
                records.append({"path": str(path), "kind": kind, "seed": seed_name, "normalize": mode})

    for seed_name, data in image_seeds(rng).items():
        stem, ext = os.path.splitext(seed_name)
        write(seed_name, data, "image", seed_name)
        mutations = _generic(data, rng) + _STRUCTURED.get(ext, lambda d, r: [])(data, rng)
        for mname, mdata in mutations:
            write(f"{stem}.{mname}{ext}", mdata, "image", seed_name)
    for seed_name, data in volume_seeds(rng).items():
        stem, ext = seed_name.split(".", 1)
        ext = "." + ext
        write(seed_name, data, "volume", seed_name)
        if ext == ".nii.gz":
            raw = gzip.decompress(data)
            mutations = _gz_mutations(raw, data, rng)
        else:
            version = 2 if stem == "nifti2" else 1
            mutations = _generic(data, rng) + _nifti(data, rng, version)
        for mname, mdata in mutations:
            write(f"{stem}.{mname}{ext}", mdata, "volume", seed_name)
    header, voxels = nifti_pair(rng)
    pairs = [("pair", header, voxels)]
    pairs += [(f"pair.hdr_{n}", h, voxels) for n, h in _generic(header, rng) + _nifti(header, rng, 1)]
    pairs += [(f"pair.img_{n}", header, v) for n, v in _generic(voxels, rng)]
    for k, (stem, hdr, img) in enumerate(pairs):  # read by the .img name and the .hdr name in turn
        (folder / f"{stem}.img").write_bytes(img)
        write(f"{stem}.hdr", hdr, "volume", "pair.hdr")
        if k % 2:
            for record in records[-len(NORMALIZATIONS):]:
                record["path"] = str(folder / f"{stem}.img")
    for mname, mdata in _nifti_voxels(rng):
        write(f"{mname}.nii", mdata, "volume", f"{mname}.nii")
    return records


# ------------------------------------------------------------------------------ child process


def _check_result(kind: str, value) -> str | None:
    """Why a loader's return value breaks its documented contract (None: it keeps it)."""
    import torch

    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        return f"returned {type(value).__name__} {getattr(value, 'dtype', '')}, not float32"
    if kind == "image":
        if value.dim() != 3 or value.shape[0] != 3 or value.shape[1] < 1 or value.shape[2] < 1:
            return f"returned shape {tuple(value.shape)}, not (3, H, W)"
        if not bool(torch.isfinite(value).all()):
            return "returned non-finite values"
        lo, hi = float(value.min()), float(value.max())
        if lo < 0.0 or hi > 1.0:
            return f"returned values in [{lo}, {hi}], not [0, 1]"
    else:
        if value.dim() != 4 or min(value.shape) < 1:
            return f"returned shape {tuple(value.shape)}, not (C, D, H, W)"
        if not bool(torch.isfinite(value).all()):
            return "returned non-finite values"
    return None


def _child(list_file: str) -> None:
    import resource
    import warnings

    limit = int(os.environ.get("VISPOS_FUZZ_MEMORY", str(3 << 30)))
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))  # a decoder asking for more: MemoryError
    jobs = json.loads(Path(list_file).read_text())
    vdata = None
    for job in jobs:
        i = job["i"]
        if vdata is None and not job["kind"].startswith("selftest"):
            # imported before the first real read (not before a self-test: those children start
            # fast); an import failure is the harness', not a file's
            import torch

            from vispos.app import data as vdata

            torch.set_num_threads(1)
        print(json.dumps({"i": i, "start": True}), flush=True)
        record = {"i": i}
        if job["kind"].startswith("selftest"):  # the harness' own test, without torch
            if job["kind"] == "selftest-crash":
                os.abort()
            if job["kind"] == "selftest-hang":
                import time

                time.sleep(3600)
            if job["kind"] == "selftest-raise":
                record.update(status="raised", type="FileNotFoundError", message=job["path"])
            else:
                record.update(status="ok", problem=None)
            print(json.dumps(record), flush=True)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if job["kind"] == "image":
                    value = vdata.load_image(job["path"])
                else:
                    value = vdata.load_volume(job["path"], intensity=job["normalize"])
        except Exception as exc:  # noqa: BLE001 - the parent judges the type
            record.update(status="raised", type=type(exc).__name__, message=str(exc)[:500])
        else:
            problem = _check_result(job["kind"], value)
            if problem is None:  # the header the CLI bounds batches with must tell the truth
                if job["kind"] == "image":
                    told = vdata.images.displayed_size(job["path"])
                    got = tuple(value.shape[1:])
                else:
                    told = vdata.volumes.volume_shape(job["path"])
                    got = tuple(value.shape)
                if told != got:
                    problem = f"the header says {told} but the loader returned {got}"
            record.update(status="bad" if problem else "ok", problem=problem)
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1])
