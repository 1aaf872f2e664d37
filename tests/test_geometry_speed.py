"""The fast host path of a padding-invariant call (:meth:`Geometry.boxes` a column at a time,
:func:`_box_paddings`, :func:`boxes_masks`) against the item-by-item algorithms it replaced, kept
here as the references: the same boxes, the same errors (type and text, the same item and axis
named first), the same paddings and masks."""

import random

import numpy as np
import pytest
import torch

from vispos import Padding, _tracing
from vispos.invariance.geometry import _run
from vispos.invariance.geometry._geometry import Geometry, TransposedWindow, Window
from vispos.padding import _masks


# ------------------------------------------------------------------------------- the references
def reference_boxes(geometry: Geometry, starts, sizes, canvas):
    """:meth:`Geometry.boxes` as it was written first: item by item, axis by axis."""
    out = [(tuple(starts), tuple(sizes), tuple(canvas))]
    for geometry_id in range(1, len(geometry.parents)):
        parent, window = geometry.parents[geometry_id], geometry.windows[geometry_id]
        layer = geometry.layers[geometry_id]
        p_starts, p_sizes, p_canvas = out[parent]
        new_starts, new_sizes = [], []
        for b, (start, size) in enumerate(zip(p_starts, p_sizes)):
            item_start, item_size = [], []
            for axis in range(geometry.num_axes):
                s = window.stride[axis]
                out_start = window.start_of(start[axis], axis)
                if out_start is None and size[axis] > 0:
                    raise ValueError(
                        f"padding_invariant=True: item {b} starts at {start[axis]} on axis {axis} of "
                        f"the input to {layer} (stride {s}); a padded item gives what it gives alone "
                        "only when it starts at a multiple of every stride (pad at the end, DETR's "
                        "layout, or with MONAI's symmetric padding choose sizes so each item's offset "
                        "is a multiple of the backbone's total stride)"
                    )
                n_out = window.out_size(size[axis], axis)
                if n_out < 1 and size[axis] > 0:
                    raise ValueError(
                        f"padding_invariant=True: item {b} is {size[axis]} cells long on axis {axis} "
                        f"at {layer}, too small for its window (kernel {window.kernel[axis]}, padding "
                        f"{window.pad_lo[axis] if hasattr(window, 'pad_lo') else window.padding[axis]}): the item alone cannot run through the backbone either"
                    )
                item_start.append(out_start if size[axis] > 0 else 0)
                item_size.append(max(n_out, 0))
            new_starts.append(tuple(item_start))
            new_sizes.append(tuple(item_size))
        new_canvas = tuple(window.out_size(c, a) for a, c in enumerate(p_canvas))
        out.append((tuple(new_starts), tuple(new_sizes), new_canvas))
    for a, b, layer in geometry.equal:
        if out[a][1] != out[b][1]:
            raise ValueError(
                f"padding_invariant=True: the two inputs of {layer} cover different cells for some "
                f"item ({out[a][1]} against {out[b][1]}): that item alone would fail with a shape "
                "mismatch there"
            )
        if out[a][2] != out[b][2]:
            raise ValueError(
                f"padding_invariant=True: the two inputs of {layer} are {out[a][2]} and {out[b][2]} "
                f"cells on the padded canvas {tuple(canvas)}: the batch fails with a shape mismatch "
                "there; pad the batch to a canvas every stride of the network divides"
            )
        if out[a] != out[b]:
            raise ValueError(
                f"padding_invariant=True: the two inputs of {layer} place some item at different "
                f"cells ({out[a][0]} against {out[b][0]}): the padded batch does not line them up"
            )
    return out


def reference_box_paddings(padding: Padding, boxes: list, device) -> list[Padding]:
    """:func:`_run._box_paddings` as it was written first."""
    def box_padding(starts, sizes, canvas):
        empty = tuple(0 for _ in canvas)
        box_starts, box_stops = [], []
        for start, size in zip(starts, sizes):
            if 0 in size:
                box_starts.append(empty)
                box_stops.append(empty)
            else:
                box_starts.append(tuple(start))
                box_stops.append(tuple(s + n for s, n in zip(start, size)))
        return Padding._make("rectangular", len(box_starts), tuple(canvas), device, tuple(box_starts),
                             tuple(box_stops))

    distinct: dict = {}
    own = (padding.starts, padding.sizes, padding.spatial)
    for key in boxes:
        if key not in distinct and key != own:
            distinct[key] = box_padding(*key)
    if distinct and _tracing.host_facts(device):
        masks = reference_boxes_masks([(p.starts, p.stops, p.spatial) for p in distinct.values()], device)
        for key, mask in zip(distinct, masks):
            p = distinct[key]
            distinct[key] = Padding._make("rectangular", p.batch, p.spatial, device, p.starts, p.stops, mask)
    return [padding] + [distinct[key] if key in distinct else padding for key in boxes]


def reference_boxes_masks(boxes, device):
    """:func:`_masks.boxes_masks` as it was written first (NumPy tables, torch ``|``)."""
    tables, shapes = [], []
    for starts, stops, spatial in boxes:
        spatial = tuple(int(s) for s in spatial)
        batch = len(starts)
        lo = np.asarray(starts, dtype=np.int64).reshape(batch, len(spatial))
        hi = np.asarray(stops, dtype=np.int64).reshape(batch, len(spatial))
        for axis, size in enumerate(spatial):
            cells = np.arange(size)
            tables.append((cells < lo[:, axis : axis + 1]) | (cells >= hi[:, axis : axis + 1]))
        shapes.append((batch, spatial))
    sent = iter([torch.from_numpy(t).to(device) for t in tables])
    masks = []
    for batch, spatial in shapes:
        axes = [next(sent) for _ in spatial]
        if len(spatial) == 1:
            masks.append(axes[0])
            continue
        mask = None
        for i, table in enumerate(axes):
            view = table.view((batch,) + tuple(size if j == i else 1 for j, size in enumerate(spatial)))
            mask = view if mask is None else torch.logical_or(mask, view)
        masks.append(mask)
    return masks


# ------------------------------------------------------------------------------- random cases
def random_window(rng: random.Random, n: int):
    """A random window over ``n`` axes: a convolution / pooling (some keeping the size: stride 1,
    padding filling the kernel's reach), or a transposed one (some the identity on sizes)."""
    kind = rng.random()
    if kind < 0.25:  # stride 1, size kept ("same")
        kernel = tuple(rng.choice([1, 3, 5]) for _ in range(n))
        dilation = tuple(rng.choice([1, 2]) for _ in range(n))
        lo = tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilation))
        hi = lo
        if rng.random() < 0.2:  # the same total padding shifted before the item (not torch's, but a Window)
            lo, hi = tuple(v - 1 for v in lo), tuple(v + 1 for v in hi)
        return Window(kernel, (1,) * n, lo, hi, dilation, rng.random() < 0.3)
    if kind < 0.8:
        kernel = tuple(rng.randint(1, 7) for _ in range(n))
        stride = tuple(rng.choice([1, 1, 2, 2, 3, 4]) for _ in range(n))
        dilation = tuple(rng.choice([1, 1, 2, 3]) for _ in range(n))
        lo = tuple(rng.randint(0, k // 2 + 1) for k in kernel)
        hi = tuple(v + rng.choice([0, 0, 1]) for v in lo)
        return Window(kernel, stride, lo, hi, dilation, rng.random() < 0.4)
    kernel = tuple(rng.randint(1, 4) for _ in range(n))
    stride = tuple(rng.choice([1, 2, 2, 3]) for _ in range(n))
    padding = tuple(rng.randint(0, 2) for _ in range(n))
    output_padding = tuple(rng.randint(0, s - 1) for s in stride)
    dilation = tuple(rng.choice([1, 1, 2]) for _ in range(n))
    if rng.random() < 0.2:  # kernel 3, stride 1, padding 1: sizes kept
        kernel, stride, padding, output_padding, dilation = (3,) * n, (1,) * n, (1,) * n, (0,) * n, (1,) * n
    return TransposedWindow(kernel, stride, padding, output_padding, dilation)


def random_geometry(rng: random.Random, n: int) -> Geometry:
    g = Geometry(n)
    for i in range(rng.randint(0, 12)):
        g.child(rng.randrange(len(g)), random_window(rng, n), f"layer{i}")
    for i in range(rng.randint(0, 3)):
        a, b = rng.randrange(len(g)), rng.randrange(len(g))
        g.require_equal(a, b, f"sum{i}")
    return g


def random_boxes(rng: random.Random, n: int):
    """Per-item starts and sizes, and a canvas: mostly DETR's layout, some symmetric (on multiples
    of strides or not), some empty items (a size 0 on some axis, at a start that is not 0 too)."""
    batch = rng.choice([0, 1, 2, 3, 5, 8])
    unit = rng.choice([1, 2, 4, 8, 16])
    starts, sizes = [], []
    for _ in range(batch):
        size = tuple(rng.choice([0, 1, 2, 3, 5, 8, 13, 16, 24, 31, 32, 40]) if rng.random() < 0.15
                     else rng.randint(1, 48) for _ in range(n))
        if rng.random() < 0.5:
            start = (0,) * n
        else:
            start = tuple(rng.randint(0, 3) * unit + (rng.random() < 0.1) for _ in range(n))
        starts.append(start)
        sizes.append(size)
    canvas = tuple(max([1] + [s[axis] + z[axis] for s, z in zip(starts, sizes)]) + rng.choice([0, 0, 1, 7])
                   for axis in range(n))
    if rng.random() < 0.3:  # the empty items' canonical box, as a Padding gives it
        starts = [(0,) * n if 0 in z else s for s, z in zip(starts, sizes)]
    return tuple(starts), tuple(sizes), canvas


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as error:  # noqa: BLE001 - the type and text are compared
        return type(error).__name__, str(error)


# ------------------------------------------------------------------------------- Geometry.boxes
#: a phrase of each ValueError of Geometry.boxes: an offset, a size, the three sums
KINDS = ("starts at", "cells long on axis", "cover different cells", "cells on the padded canvas", "place some item")


@pytest.mark.parametrize("seed", range(8))
def test_boxes_equal_the_item_by_item_replay(seed):
    rng = random.Random(seed)
    seen = set()
    for _ in range(400):
        n = rng.randint(1, 3)
        g = random_geometry(rng, n)
        for _ in range(4):
            starts, sizes, canvas = random_boxes(rng, n)
            want = outcome(reference_boxes, g, starts, sizes, canvas)
            got = outcome(g.boxes, starts, sizes, canvas)
            assert got == want, (g.windows, g.parents, g.equal, starts, sizes, canvas)
            seen.add(want[0] if want[0] != "ValueError" else next(
                (w for w in KINDS if w in want[1]), want[1]))
    # every outcome is met (lining up differently only by the offsets: rarer, met below)
    assert {"ok", *KINDS[:-1]} <= seen and "AttributeError" not in seen, seen


def test_boxes_errors_name_the_first_item_and_axis():
    """Several items refused at one layer: the first item, then its first axis, is the one named,
    the offset before the size; an earlier layer before a later one."""
    g = Geometry(2)
    conv = g.child(0, Window((3, 3), (2, 2), (1, 1), (1, 1), (1, 1)), "conv")
    g.child(conv, Window((5, 5), (2, 2), (0, 0), (0, 0), (1, 1)), "pool")
    cases = [
        (((0, 0), (0, 1), (1, 0)), ((9, 9), (9, 9), (9, 9))),  # item 1 axis 1, not item 2 axis 0
        (((0, 0), (0, 0), (1, 0)), ((9, 9), (9, 1), (9, 9))),  # item 1 too small at pool
        (((0, 0), (0, 0), (1, 1)), ((9, 9), (3, 3), (9, 9))),  # item 2 off the stride at conv first
        (((0, 0), (2, 2), (0, 0)), ((9, 9), (2, 2), (9, 0))),  # item 1's offset at pool
        (((0, 0), (3, 0), (0, 0)), ((9, 9), (0, 9), (9, 9))),  # empty along axis 0: its offset is moot
    ]
    for starts, sizes in cases:
        want = outcome(reference_boxes, g, starts, sizes, (20, 20))
        assert outcome(g.boxes, starts, sizes, (20, 20)) == want
    assert outcome(g.boxes, *cases[0], (20, 20))[1].startswith(
        "padding_invariant=True: item 1 starts at 1 on axis 1 of the input to conv (stride 2)")


def test_boxes_require_equal_messages():
    g = Geometry(1)
    a = g.child(0, Window((3,), (2,), (1,), (1,), (1,)), "conv a")
    b = g.child(0, Window((2,), (2,), (0,), (0,), (1,)), "conv b")
    g.require_equal(a, b, "add")
    t = g.child(a, TransposedWindow((2,), (2,), (0,), (0,), (1,)), "up")
    g.require_equal(t, 0, "skip")
    for starts, sizes, canvas in [(((0,),), ((8,),), (8,)), (((0,),), ((9,),), (9,)), (((0,),), ((8,),), (9,)),
                                  (((2,), (0,)), ((8,), (8,)), (10,)), (((0,),), ((7,),), (8,))]:
        assert outcome(g.boxes, starts, sizes, canvas) == outcome(reference_boxes, g, starts, sizes, canvas)
    g = Geometry(1)  # 8 cells at 4 on a canvas of 9: 4 cells at 2 (stride 2) or at 4 (kernel 5)
    a = g.child(0, Window((1,), (2,), (0,), (0,), (1,)), "subsample")
    b = g.child(0, Window((5,), (1,), (0,), (0,), (1,)), "valid conv")
    g.require_equal(a, b, "skip")
    got = outcome(g.boxes, ((0,), (4,)), ((8,), (8,)), (9,))
    assert got == outcome(reference_boxes, g, ((0,), (4,)), ((8,), (8,)), (9,))
    assert got[0] == "ValueError" and "the two inputs of skip place some item at different cells" in got[1]


def test_boxes_off_the_common_form():
    """Inputs the column path hands to the item-by-item one: lists, negative sizes, unequal
    numbers of starts and sizes, items with more entries than axes, an empty batch."""
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 3)
        g = random_geometry(rng, n)
        starts, sizes, canvas = random_boxes(rng, n)
        variants = [
            ([list(s) for s in starts], [list(z) for z in sizes], list(canvas)),
            (starts, tuple(tuple(-v if rng.random() < 0.2 else v for v in z) for z in sizes), canvas),
            (starts, sizes[:-1], canvas),
            (tuple(s + (5,) for s in starts), tuple(z + (3,) for z in sizes), canvas),
            ((), (), canvas),
        ]
        for args in variants:
            assert outcome(g.boxes, *args) == outcome(reference_boxes, g, *args), args


def test_boxes_follow_new_children():
    """Steps derived for one tree are derived again after :meth:`Geometry.child` adds a window."""
    g = Geometry(2)
    g.child(0, Window((3, 3), (2, 2), (1, 1), (1, 1), (1, 1)), "conv")
    args = (((0, 0), (0, 0)), ((9, 7), (4, 5)), (9, 7))
    assert g.boxes(*args) == reference_boxes(g, *args)
    g.child(1, Window((3, 3), (2, 2), (0, 0), (0, 0), (1, 1), True), "pool")
    assert len(g.boxes(*args)) == 3 and g.boxes(*args) == reference_boxes(g, *args)


# ------------------------------------------------------------------------------- paddings, masks
def same_paddings(got: list[Padding], want: list[Padding]) -> None:
    assert len(got) == len(want)
    for p, q in zip(got, want):
        assert (p.kind, p.batch, p.spatial, p.device) == (q.kind, q.batch, q.spatial, q.device)
        assert (p.starts, p.stops) == (q.starts, q.stops)
        assert (p._mask is None) == (q._mask is None)
        assert torch.equal(p.mask, q.mask) and p.mask.is_contiguous()
    # the same object where the reference shares one (the input's padding, equal boxes)
    assert [[a is b for b in got] for a in got] == [[a is b for b in want] for a in want]


@pytest.mark.parametrize("seed", range(4))
def test_paddings_equal_the_reference(seed, device):
    rng = random.Random(100 + seed)
    checked = 0
    for _ in range(400):
        n = rng.randint(1, 3)
        g = random_geometry(rng, n)
        g.equal.clear()
        starts, sizes, canvas = random_boxes(rng, n)
        try:
            want = reference_boxes(g, starts, sizes, canvas)
        except ValueError:
            continue
        if any(c < 0 for _, _, level in want for c in level):
            continue  # a canvas below 0 (only empty items fit it): no mask to compare
        if any(z < 1 for size in sizes for z in size) and rng.random() < 0.5:
            starts = tuple((0,) * n if 0 in z else s for s, z in zip(starts, sizes))
        padding = Padding.from_sizes(sizes, canvas, starts=starts, device=device)
        runner = _run.InvariantRunner(g, {"any": []})
        got = runner.paddings(padding)
        boxes = reference_boxes(g, padding.starts, padding.sizes, padding.spatial)
        same_paddings(got, reference_box_paddings(padding, boxes[1:], device))
        checked += 1
    assert checked > 80


def test_paddings_of_a_backbone_equal_the_reference():
    """A ResNet-like graph (the benchmark's) on a batch of mixed sizes, DETR's and MONAI's layouts."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import host_overhead

    import vispos

    torch.manual_seed(0)
    runner = vispos.make_padding_invariant(host_overhead.SlimResNet50().train())._runner
    assert isinstance(runner, _run.InvariantRunner) and len(runner.geometry) > 10
    sizes = tuple((64 - 8 * (i % 3), 64 - 8 * (i % 2)) for i in range(8))
    for starts in (None, "symmetric"):
        padding = Padding.from_sizes(sizes, (64, 64), starts=starts)
        try:
            boxes = reference_boxes(runner.geometry, padding.starts, padding.sizes, padding.spatial)
        except ValueError as error:
            with pytest.raises(ValueError, match=str(error)[:60]):
                runner.paddings(padding)
            continue
        same_paddings(runner.paddings(padding), reference_box_paddings(padding, boxes[1:], padding.device))


def random_spans(rng: random.Random, n: int, spatial):
    batch = rng.choice([0, 1, 3, 8])
    starts, stops = [], []
    for _ in range(batch):
        if rng.random() < 0.15:
            starts.append((0,) * n)
            stops.append((0,) * n)
            continue
        start = tuple(rng.randint(-2, s + 1) for s in spatial)
        starts.append(start)
        stops.append(tuple(rng.randint(v - 2, s + 2) for v, s in zip(start, spatial)))
    return tuple(starts), tuple(stops)


@pytest.mark.parametrize("seed", range(4))
def test_boxes_masks_equal_the_reference(seed, device):
    """Several masks at once, 1 to 3 axes, spans out of range or reversed, empty batches and axes,
    small (combined on the host) and large (combined by torch) masks."""
    rng = random.Random(200 + seed)
    for _ in range(60):
        boxes = []
        for _ in range(rng.randint(1, 5)):
            n = rng.randint(1, 3)
            big = rng.random() < 0.15
            spatial = tuple(rng.choice([0, 1, 5, 17, 32]) if not big else rng.randint(40, 70) for _ in range(n))
            if rng.random() < 0.1:
                spatial = list(spatial)
            boxes.append((*random_spans(rng, n, spatial), spatial))
        got = _masks.boxes_masks(boxes, device)
        want = reference_boxes_masks(boxes, device)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == torch.bool and g.device.type == device.type
            assert g.shape == w.shape and g.is_contiguous() and torch.equal(g, w)
        # fresh masks: writing one leaves the others as they were
        copies = [m.clone() for m in got]
        for m in got:
            m.fill_(True)
            for other, copy in zip(got, copies):
                if other is not m:
                    assert torch.equal(other, copy)
            copies = [x.clone() for x in got]


def test_boxes_masks_through_one_transfer(monkeypatch):
    """Off the CPU every table (or small mask) travels in one :func:`_tracing.host_arrays` call,
    packed as it is for an accelerator (here replayed on the CPU)."""
    calls = []

    def packed(arrays, device):
        calls.append(len(arrays))
        return _tracing._packed(arrays, torch.device("cpu"))

    monkeypatch.setattr(_masks._tracing, "host_arrays", packed)

    class Accelerator:
        type = "accelerator"

    rng = random.Random(5)
    for _ in range(40):
        boxes = []
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(1, 3)
            spatial = tuple(rng.choice([1, 5, 17, 40]) for _ in range(n))
            boxes.append((*random_spans(rng, n, spatial), spatial))
        calls.clear()
        got = _masks.boxes_masks(boxes, Accelerator())
        assert calls == [sum(len(spatial) for _, _, spatial in boxes)]
        for g, w in zip(got, reference_boxes_masks(boxes, "cpu"), strict=True):
            assert g.shape == w.shape and g.is_contiguous() and torch.equal(g, w)


def test_boxes_masks_refuses_ragged_spans_as_numpy_did():
    with pytest.raises(ValueError):
        _masks.boxes_masks([(((0, 0), (0,)), ((1, 1), (1, 1)), (2, 2))], torch.device("cpu"))
    with pytest.raises(ValueError):
        _masks.boxes_masks([(((0, 0, 0), (0,)), ((1, 1), (1, 1)), (2, 2))], torch.device("cpu"))
    with pytest.raises(ValueError):
        _masks.boxes_masks([(((0, 0), (0, 0)), ((1, 1),), (2, 2))], torch.device("cpu"))
