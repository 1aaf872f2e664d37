"""The encoders' cache (``vispos/_cache.py``): bounded memory, no aliasing between calls by
default, thread safety, ``cache_info()``, the off switch, ``cache_size`` changes, ``cached_penc``.

References are cache-free modules (``cache_size=0`` / ``cache=False``) and, for the grid family,
the ``positional-encodings`` package itself.
"""

import copy
import pickle
import random
import threading
import warnings

import numpy as np
import positional_encodings.torch_encodings as peer
import pytest
import torch
from torch.testing import assert_close

import vispos
from vispos import (
    FixEncoding,
    PositionalEncoding2D,
    PositionalEncodingPermute2D,
    PositionEmbeddingSine,
    nested_tensor_from_tensor_list,
)
from vispos._cache import DEFAULT_MAX_BYTES, TensorCache

EXACT = dict(rtol=0, atol=0)


def _entry_bytes(cache: TensorCache) -> int:
    """Bytes the cache holds, counted from its entries' storages (independently of its own sum)."""
    total = 0
    for entry in list(cache._entries.values()):
        total += entry.tensor.untyped_storage().nbytes()
        if entry.content is not None:
            total += entry.content.untyped_storage().nbytes()
    return total


def _arbitrary_mask(batch, h, w, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, h, w, generator=g) > 0.6


# ------------------------------------------------------------------------------ bounds
def test_entry_larger_than_budget_is_not_stored_and_others_are_evicted_to_fit():
    cache = TensorCache(8, max_bytes=1000, admit_at=1)  # bounds alone: every miss admitted
    big = cache.get("big", lambda: torch.zeros(300))  # 1200 bytes
    assert big.shape == (300,) and len(cache) == 0
    for i in range(3):
        cache.get(i, lambda: torch.zeros(100))  # 400 bytes each: the third evicts the first
    assert list(cache._entries) == [1, 2]
    info = cache.info()
    assert (info.currsize, info.currbytes, info.maxbytes) == (2, 800, 1000)
    assert info.currbytes == _entry_bytes(cache)


def test_lru_order_and_entry_bound():
    cache = TensorCache(2, max_bytes=None, admit_at=1)
    for key in ("a", "b"):
        cache.get(key, lambda: torch.zeros(4))
    cache.get("a", lambda: torch.ones(4))  # a hit refreshes "a"
    cache.get("c", lambda: torch.zeros(4))
    assert list(cache._entries) == ["a", "c"]


def test_changing_bounds_evicts_at_once():
    cache = TensorCache(4, max_bytes=None, admit_at=1)
    for i in range(4):
        cache.get(i, lambda: torch.zeros(10))
    cache.max_bytes = 100  # 40 bytes each: two fit
    assert list(cache._entries) == [2, 3] and cache.info().currbytes == 80
    cache.maxsize = 1
    assert list(cache._entries) == [3]
    cache.maxsize = 0
    assert len(cache) == 0
    cache.get("x", lambda: torch.zeros(1))
    assert len(cache) == 0 and cache.info().misses == 4  # disabled: not stored, not counted


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(maxsize=-1), ValueError, r"cache size must be >= 0, got -1"),
        (dict(maxsize=True), TypeError, r"cache size must be a non-negative int, got True \(bool\)"),
        (dict(maxsize=2, max_bytes=-5), ValueError, r"max_bytes must be >= 0, got -5"),
        (dict(maxsize=2, max_bytes=1.5), TypeError, r"max_bytes must be a non-negative int or None, got 1.5"),
    ],
)
def test_bad_bounds(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TensorCache(**kwargs)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: PositionEmbeddingSine(8, cache_bytes=-1), ValueError, r"cache_bytes must be >= 0, got -1"),
        (lambda: PositionEmbeddingSine(8, cache_bytes="8M"), TypeError, r"cache_bytes must be a non-negative int or None, got '8M'"),
        (lambda: PositionEmbeddingSine(8, zero_copy=1), TypeError, r"zero_copy must be a bool, got 1"),
        (lambda: PositionalEncoding2D(8, cache_bytes=-2), ValueError, r"cache_bytes must be >= 0, got -2"),
        (lambda: PositionalEncoding2D(8, zero_copy="yes"), TypeError, r"zero_copy must be a bool, got 'yes'"),
    ],
)
def test_bad_encoder_cache_options(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_bad_assignments():
    pe, enc = PositionEmbeddingSine(8), PositionalEncoding2D(8)
    with pytest.raises(ValueError, match=r"cache_size must be >= 0, got -3"):
        pe.cache_size = -3
    with pytest.raises(TypeError, match=r"cache_bytes must be a non-negative int or None, got 2.0"):
        pe.cache_bytes = 2.0
    with pytest.raises(TypeError, match=r"cache must be a bool, got 0"):
        enc.cache = 0


@pytest.mark.parametrize("repeat", [1, 2], ids=["every size new", "every size twice"])
def test_memory_held_after_100_distinct_sizes_stays_within_budget(repeat):
    """A training loop with multi-scale sizes: 100 batches, every one of a new size (nothing is
    ever stored: each is a first sighting), or each seen twice in a row (each is admitted on its
    second sighting, and the budget holds)."""
    budget = 256 * 1024
    pe = PositionEmbeddingSine(32, normalize=True, cache_bytes=budget)
    reference = PositionEmbeddingSine(32, normalize=True, cache_size=0)
    rng = random.Random(0)
    seen = set()
    for step in range(100):
        while True:
            sizes = [(rng.randint(8, 40), rng.randint(8, 40)) for _ in range(2)]
            if tuple(sizes) not in seen:
                seen.add(tuple(sizes))
                break
        batch = nested_tensor_from_tensor_list([torch.zeros(3, *s) for s in sizes])
        for _ in range(repeat):
            out = pe(batch)
            assert_close(out, reference(batch), **EXACT)
        held = _entry_bytes(pe._cache)
        assert held == pe.cache_info().currbytes <= budget, step
        assert len(pe._cache) <= pe.cache_size
        assert len(pe._cache._seen) <= 4 * pe.cache_size
    info = pe.cache_info()
    assert info.misses == 100 * repeat and info.hits == 0
    assert (info.currsize > 0) == (repeat == 2)


def test_default_budget_bounds_a_loop_and_serves_fixed_size_inference():
    """The default (8 MiB) holds at most 8 MiB whatever the sizes, and still serves a repeated
    DETR C5 batch (4 images 800x1333 at stride 32, 256 channels: 4.1 MiB)."""
    assert DEFAULT_MAX_BYTES == 8 * 2**20
    pe = PositionEmbeddingSine(128, normalize=True)
    for step in range(10):  # every size new: 1.2 to 20 MiB each, seen twice (admitted)
        h, w = 20 + 9 * step, 30 + 7 * step
        mask = torch.rand(2, h, w) > 2  # no padding, a bool mask: the whole batched result
        pe(mask)
        pe(mask)
        assert _entry_bytes(pe._cache) <= DEFAULT_MAX_BYTES
    assert len(pe._cache) > 0
    pe.clear_cache()
    c5 = nested_tensor_from_tensor_list(
        [torch.zeros(3, 800, 1333), torch.zeros(3, 800, 1200), torch.zeros(3, 640, 1333), torch.zeros(3, 700, 1000)],
        size_divisibility=32,
    ).decompose()
    from vispos import NestedTensor

    level = NestedTensor(
        torch.zeros(4, 256, 25, 42),
        torch.nn.functional.interpolate(c5[1][None].float(), size=(25, 42))[0].bool(),
    )
    first = pe(level)
    pe(level)  # the second sighting: stored
    third = pe(level)
    assert pe.cache_info().hits == 1
    assert_close(third, first, **EXACT)
    grid = PositionalEncodingPermute2D(256)
    for _ in range(3):
        grid(torch.zeros(4, 256, 25, 42))
    assert grid.cache_info().hits == 1  # the unbatched grid table is served


# ------------------------------------------------------------------------------ admission
def test_first_sighting_stores_nothing_and_hands_out_the_build_itself():
    cache = TensorCache(4, max_bytes=None)
    assert cache.admit_at == 2
    built = []

    def build():
        built.append(torch.arange(6.0))
        return built[-1]

    first = cache.get("k", build)
    assert first is built[0]  # the build itself: no copy
    assert len(cache) == 0 and cache.info().currbytes == 0 and list(cache._seen) == ["k"]
    second = cache.get("k", build)  # the second sighting: stored, and the caller gets a copy
    assert len(cache) == 1 and list(cache._seen) == [] and second is not built[1]
    third = cache.get("k", build)
    assert len(built) == 2 and cache.info()[:2] == (1, 2)  # a hit: nothing built
    assert third.data_ptr() not in {second.data_ptr(), built[1].data_ptr()}
    assert_close(third, torch.arange(6.0), **EXACT)


def _c5_like():
    return nested_tensor_from_tensor_list(
        [torch.zeros(1, 25, 34), torch.zeros(1, 25, 38), torch.zeros(1, 23, 42), torch.zeros(1, 25, 34)]
    )


ADMISSION_INPUTS = {
    "nested": _c5_like,
    "rectangular mask": lambda: _c5_like().mask,
    "arbitrary mask": lambda: _arbitrary_mask(4, 25, 42, 0),
    "feature map": lambda: torch.zeros(4, 8, 25, 42),
    "feature map, batch 1": lambda: torch.zeros(1, 8, 25, 42),
}


@pytest.mark.parametrize("name", list(ADMISSION_INPUTS))
def test_a_first_sight_miss_costs_what_no_cache_costs(name):
    """A persistent module with the default cache, fed a new input: the same ops as a module
    without a cache (no copy out, no mask copy), and nothing stored or held."""
    from benchmarks.bench_position_embedding import count_ops

    x = ADMISSION_INPUTS[name]()
    pe = PositionEmbeddingSine(128, normalize=True)
    off = PositionEmbeddingSine(128, normalize=True, cache_size=0)
    off(x)  # first-call costs (lazy imports) out of the count
    _, cached_ops = count_ops(lambda: pe(x))
    _, off_ops = count_ops(lambda: off(x))
    assert cached_ops == off_ops
    assert len(pe._cache) == 0 and pe.cache_info().currbytes == 0 and len(pe._cache._seen) == 1
    grid, grid_off = PositionalEncodingPermute2D(256), PositionalEncodingPermute2D(256, cache=False)
    m = torch.zeros(x.shape[0] if isinstance(x, torch.Tensor) else 4, 256, 25, 42)
    grid_off(m)
    assert count_ops(lambda: grid(m))[1] == count_ops(lambda: grid_off(m))[1]
    assert len(grid._tables) == 0


def test_doorkeeper_tells_mask_contents_apart():
    """Masks of one shape are remembered by their content (a hash of it), so a new mask of a
    seen shape is a first sighting; an entry for one content stays while another is missed."""
    a, b = _arbitrary_mask(2, 6, 7, 10), _arbitrary_mask(2, 6, 7, 11)
    pe = PositionEmbeddingSine(8)
    pe(a)
    pe(b)
    assert len(pe._cache) == 0 and len(pe._cache._seen) == 2
    pe(a)  # a's second sighting: stored
    assert len(pe._cache) == 1 and torch.equal(next(iter(pe._cache._entries.values())).content, a)
    pe(b)  # b's second sighting: stored in the place of a (one entry per shape and parameters)
    pe(a)  # a left the doorkeeper when it was admitted: a first sighting, b's entry kept
    out = pe(b)
    assert pe.cache_info()[:2] == (1, 5)
    assert_close(out, PositionEmbeddingSine(8, cache_size=0)(b), **EXACT)
    c = a.clone()  # equal content, another tensor: the same sighting
    pe(c)
    assert torch.equal(next(reversed(pe._cache._entries.values())).content, a)


def test_doorkeeper_is_bounded_and_forgets_the_oldest_keys():
    cache = TensorCache(2, max_bytes=None)
    for key in range(20):
        cache.get(key, lambda: torch.zeros(3))
    assert list(cache._seen) == list(range(12, 20))  # 4 x maxsize keys, the latest
    cache.get(0, lambda: torch.zeros(3))  # forgotten: a first sighting again
    cache.get(19, lambda: torch.zeros(3))  # remembered: stored
    assert list(cache._entries) == [19] and 0 in cache._seen
    cache.maxsize = 1  # shrinking the cache shrinks the doorkeeper with it
    assert len(cache._seen) == 4
    cache.clear()
    assert len(cache._seen) == 0


@pytest.mark.parametrize("admit_at", [1, 2, 3])
def test_admit_at_is_the_sighting_that_stores(admit_at):
    cache = TensorCache(4, max_bytes=None, admit_at=admit_at)
    for sighting in range(1, 5):
        cache.get("k", lambda: torch.zeros(2))
        assert len(cache) == (sighting >= admit_at), sighting
    assert cache.info().hits == 4 - admit_at
    for clone in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert clone.admit_at == admit_at and len(clone) == 0 and len(clone._seen) == 0


@pytest.mark.parametrize(
    "admit_at, exc, match",
    [
        (0, ValueError, r"admit_at must be a positive int, got 0"),
        (1.0, TypeError, r"admit_at must be a positive int, got 1.0"),
        (True, TypeError, r"admit_at must be a positive int, got True"),
    ],
)
def test_bad_admit_at(admit_at, exc, match):
    with pytest.raises(exc, match=match):
        TensorCache(2, admit_at=admit_at)


def test_fix_encoding_stores_its_one_table_at_once():
    enc = FixEncoding(PositionalEncoding2D(12), (5, 6))
    assert len(enc._tables) == 1  # built at construction and kept, whatever its size
    enc(torch.zeros(2, 5, 6, 12))
    assert enc._tables.info().hits == 1


def test_fingerprint_of_content_off_the_host_is_none():
    from vispos._cache import _fingerprint

    mask = _arbitrary_mask(2, 3, 4, 0)
    assert _fingerprint(mask) == _fingerprint(mask.clone()) != _fingerprint(~mask)
    assert _fingerprint(torch.zeros(2, 3, dtype=torch.bool, device="meta")) is None


# ------------------------------------------------------------------------------ aliasing
def _write_in_place(t):
    t.mul_(-3).add_(7)


def _write_data(t):
    t.data.fill_(11.0)


def _write_numpy(t):
    t.numpy()[...] = 13.0


def _write_dlpack(t):
    np.from_dlpack(t)  # a read through DLPack must work too
    torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(t)).fill_(17.0)


WRITES = [_write_in_place, _write_data, _write_numpy, _write_dlpack]
WRITE_IDS = ["in_place", "data", "numpy", "dlpack"]


def _sine_inputs():
    nt = nested_tensor_from_tensor_list([torch.zeros(3, 9, 12), torch.zeros(3, 12, 7)])
    return {
        "nested": nt,
        "mask_b1": _arbitrary_mask(1, 6, 7, 1),
        "mask_b2": _arbitrary_mask(2, 6, 7, 2),
        "rect_mask_b2": nt.mask.clone(),
        "map_b1": torch.randn(1, 4, 5, 6),
        "map_b2": torch.randn(2, 4, 5, 6),
    }


@pytest.mark.parametrize("write", WRITES, ids=WRITE_IDS)
@pytest.mark.parametrize("name", list(_sine_inputs()))
def test_sine_no_write_reaches_another_result(name, write):
    x = _sine_inputs()[name]
    pe = PositionEmbeddingSine(16, normalize=True, offset=-0.5)
    expected = PositionEmbeddingSine(16, normalize=True, offset=-0.5, cache_size=0)(x)
    p0, p1, p2 = pe(x), pe(x), pe(x)  # a first-sight miss, a stored miss, then a hit
    write(p2)
    assert_close(p1, expected, **EXACT)  # an earlier result is untouched
    write(p1)
    write(p0)
    p3 = pe(x)
    assert_close(p3, expected, **EXACT)  # and no later call sees any write
    assert pe.cache_info().hits == 2
    assert p3.untyped_storage().data_ptr() not in {
        p.untyped_storage().data_ptr() for p in (p0, p1, p2)
    }


GRID_CASES = {
    "2d_b1": (lambda **k: PositionalEncoding2D(12, **k), peer.PositionalEncoding2D(12), (1, 5, 6, 12)),
    "2d_b3": (lambda **k: PositionalEncoding2D(12, **k), peer.PositionalEncoding2D(12), (3, 5, 6, 12)),
    "perm_b1": (lambda **k: PositionalEncodingPermute2D(7, **k), peer.PositionalEncodingPermute2D(7), (1, 7, 4, 5)),
    "perm_b3": (lambda **k: PositionalEncodingPermute2D(7, **k), peer.PositionalEncodingPermute2D(7), (3, 7, 4, 5)),
    "fix_b3": (
        lambda **k: FixEncoding(PositionalEncoding2D(12, **k), (5, 6)),
        peer.PositionalEncoding2D(12),
        (3, 5, 6, 12),
    ),
}


@pytest.mark.parametrize("write", WRITES, ids=WRITE_IDS)
@pytest.mark.parametrize("case", list(GRID_CASES))
def test_grid_no_write_reaches_another_result(case, write):
    make, theirs, shape = GRID_CASES[case]
    x = torch.zeros(shape)
    expected = theirs(x).clone()
    enc = make()
    p0, p1, p2 = enc(x), enc(x), enc(x)  # first sight, stored, served (FixEncoding: all served)
    write(p2)
    assert_close(p1, expected, rtol=0, atol=1e-6)
    write(p1)
    write(p0)
    assert_close(enc(x), expected, rtol=0, atol=1e-6)


def test_zero_copy_shares_storage_as_documented():
    x = _arbitrary_mask(2, 6, 7, 3)
    pe = PositionEmbeddingSine(16, zero_copy=True)
    p0, p1, p2 = pe(x), pe(x), pe(x)
    assert p1 is p2 and p0 is not p1  # one stored tensor (from the second sighting on)
    p1.numpy()[...] = 0.0  # the documented hazard: invisible to the version counter
    assert torch.equal(pe(x), torch.zeros_like(p1))
    p1.add_(1)  # an in-place write bumps the version: the entry is rebuilt
    assert_close(pe(x), PositionEmbeddingSine(16, cache_size=0)(x), **EXACT)
    grid = PositionalEncoding2D(8, zero_copy=True)
    grid(torch.zeros(2, 4, 5, 8))
    a, b = grid(torch.zeros(3, 4, 5, 8)), grid(torch.zeros(5, 4, 5, 8))
    assert a.stride(0) == 0 and a.data_ptr() == b.data_ptr()


# ------------------------------------------------------------------------------ threads
@pytest.mark.slow
def test_thread_stress_with_evictions_matches_a_cache_free_module():
    """One module, 8 threads, masks of one shape with different contents and of other shapes,
    a cache of 3 entries and 64 KiB so that lookups, insertions and evictions interleave.
    Every result is compared with a cache-free module's, and every result is written into."""
    pe = PositionEmbeddingSine(16, normalize=True, cache_size=3, cache_bytes=64 * 1024)
    grid = PositionalEncodingPermute2D(16, cache_bytes=16 * 1024)
    free = PositionEmbeddingSine(16, normalize=True, cache_size=0)
    free_grid = PositionalEncodingPermute2D(16, cache=False)
    inputs = [_arbitrary_mask(2, 10, 12, seed) for seed in range(6)]
    inputs += [_arbitrary_mask(1, 8 + k, 9, 100 + k) for k in range(3)]
    inputs += [nested_tensor_from_tensor_list([torch.zeros(3, 6, 9), torch.zeros(3, 8 + k, 5)]) for k in range(3)]
    maps = [torch.zeros(2, 16, 6 + k, 7) for k in range(6)]
    expected = [free(x) for x in inputs]
    expected_maps = [free_grid(m) for m in maps]
    failures: list = []
    barrier = threading.Barrier(8)

    def work(seed):
        rng = random.Random(seed)
        barrier.wait()
        try:
            for _ in range(60):
                i = rng.randrange(len(inputs))
                out = pe(inputs[i])
                if not torch.equal(out, expected[i]):
                    failures.append(("sine", i))
                out.fill_(float(seed))  # every caller writes into its result
                j = rng.randrange(len(maps))
                out = grid(maps[j])
                if not torch.equal(out, expected_maps[j]):
                    failures.append(("grid", j))
                out.numpy()[...] = -1.0
        except Exception as exc:  # noqa: BLE001 - reported below with the thread's seed
            failures.append((seed, repr(exc)))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    for cache in (pe._cache, grid._tables):
        assert len(cache._seen) <= 4 * cache.maxsize
        info = cache.info()
        assert info.hits + info.misses == 8 * 60
        assert info.currbytes == _entry_bytes(cache) <= info.maxbytes
        assert info.currsize == len(cache._entries) <= info.maxsize
    # the structure is intact: single-threaded calls keep working and keep matching
    for x, e in zip(inputs, expected):
        assert_close(pe(x), e, **EXACT)


# ------------------------------------------------------------------------------ info, switch
def test_cache_info_counts_like_lru_cache():
    pe = PositionEmbeddingSine(8, cache_size=2)
    masks = [_arbitrary_mask(1, 4, 5 + s, s) for s in range(3)]
    assert tuple(pe.cache_info()) == (0, 0, 2, 0, DEFAULT_MAX_BYTES, 0)
    for _ in range(3):
        pe(masks[0])  # a miss (remembered), a miss (stored), a hit
    for m in (masks[1], masks[1], masks[2], masks[2]):  # the second store evicts masks[0]
        pe(m)
    pe(masks[0])  # a miss again, and a first sighting again: admitted keys leave the doorkeeper
    info = pe.cache_info()
    assert (info.hits, info.misses, info.maxsize, info.currsize) == (1, 7, 2, 2)
    assert info.currbytes == _entry_bytes(pe._cache) > 0
    assert isinstance(info, vispos.CacheInfo) and info._fields == (
        "hits", "misses", "maxsize", "currsize", "maxbytes", "currbytes",
    )
    pe.clear_cache()
    assert pe.cache_info()[:4] == (1, 7, 2, 0) and len(pe._cache._seen) == 0
    pe._cache.reset_info()
    assert pe.cache_info().hits == 0


def test_off_switch_for_a_whole_model_and_nesting():
    model = torch.nn.ModuleDict({"sine": PositionEmbeddingSine(8), "grid": PositionalEncoding2D(8)})
    mask, x = _arbitrary_mask(2, 4, 5, 0), torch.zeros(2, 4, 5, 8)
    assert vispos.is_caching_enabled()
    with vispos.caching(False):
        assert not vispos.is_caching_enabled()
        for _ in range(2):
            assert_close(model["sine"](mask), PositionEmbeddingSine(8, cache_size=0)(mask), **EXACT)
            model["grid"](x)
        with vispos.caching(True):  # blocks nest
            model["sine"](mask)  # a first sighting: the calls made while off were not seen
            assert len(model["sine"]._cache) == 0
            model["sine"](mask)
        assert not vispos.is_caching_enabled()
    assert vispos.is_caching_enabled()
    assert tuple(model["sine"].cache_info())[:4] == (0, 2, 8, 1)  # only the inner calls counted
    assert tuple(model["grid"].cache_info())[:4] == (0, 0, 8, 0)
    vispos.set_caching(False)
    try:
        model["grid"](x)
        assert len(model["grid"]._tables) == 0
        with vispos.caching(True):
            model["grid"](x)
            model["grid"](x)
        assert len(model["grid"]._tables) == 1
    finally:
        vispos.set_caching(True)
    with pytest.raises(TypeError, match=r"enabled must be a bool, got 'no'"):
        vispos.set_caching("no")
    with pytest.raises(TypeError, match=r"enabled must be a bool, got 0"):
        with vispos.caching(0):
            pass


def test_caching_without_argument_reads_as_written():
    """``with vispos.caching():`` turns the caches ON (issue 32: it used to turn them off, as its
    default was False); for one release it warns that the meaning changed."""
    vispos.set_caching(False)
    try:
        with pytest.warns(DeprecationWarning, match=r"caching\(\) without an argument now turns the caches ON"):
            with vispos.caching():
                assert vispos.is_caching_enabled()
        assert not vispos.is_caching_enabled()
    finally:
        vispos.set_caching(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit argument does not warn
        with vispos.caching(True), vispos.caching(False):
            assert not vispos.is_caching_enabled()


def test_off_switch_is_per_thread():
    pe = PositionEmbeddingSine(8)
    mask = _arbitrary_mask(1, 4, 5, 0)
    inside, go = threading.Event(), threading.Event()

    def other():
        inside.wait()
        pe(mask)  # another thread, outside the block: caches (from the second sighting)
        pe(mask)
        go.set()

    t = threading.Thread(target=other)
    t.start()
    with vispos.caching(False):
        inside.set()
        go.wait()
    t.join()
    assert len(pe._cache) == 1


def test_cache_size_changes_take_effect():
    pe = PositionEmbeddingSine(8)
    masks = [_arbitrary_mask(1, 4, 5 + s, s) for s in range(5)]
    for m in masks:
        pe(m)
        pe(m)
    assert len(pe._cache) == 5
    pe.cache_size = 2
    assert len(pe._cache) == 2 and pe.cache_info().maxsize == 2
    assert "cache_size=2" in repr(pe)
    pe.cache_size = 0
    pe(masks[0])
    assert len(pe._cache) == 0
    pe.cache_bytes = 0
    pe.cache_size = 4
    pe(masks[0])
    assert len(pe._cache) == 0  # a zero budget disables too
    pe.cache_bytes = None
    pe(masks[0])
    pe(masks[0])
    assert len(pe._cache) == 1 and "cache_bytes=None" in repr(pe)
    grid = PositionalEncoding2D(8)
    grid(torch.zeros(1, 3, 4, 8))
    grid(torch.zeros(1, 3, 4, 8))
    assert len(grid._tables) == 1
    grid.cache = False
    assert len(grid._tables) == 0 and "cache=False" in repr(grid)
    grid(torch.zeros(1, 3, 4, 8))
    assert len(grid._tables) == 0
    grid.cache = True
    grid(torch.zeros(1, 3, 4, 8))
    grid(torch.zeros(1, 3, 4, 8))
    assert len(grid._tables) == 1


def test_repr_shows_non_default_cache_options():
    assert repr(PositionEmbeddingSine(8, cache_bytes=1024, zero_copy=True)).endswith(
        "cache_size=8, cache_bytes=1024, zero_copy=True)"
    )
    assert repr(PositionalEncoding2D(8, cache_bytes=None, zero_copy=True)) == (
        "PositionalEncoding2D(channels=8, dtype_override=None, cache_bytes=None, zero_copy=True)"
    )


def test_copies_keep_the_budget_and_start_empty():
    pe = PositionEmbeddingSine(8, cache_size=3, cache_bytes=4096, zero_copy=True)
    pe(_arbitrary_mask(1, 4, 5, 0))
    for clone in (copy.deepcopy(pe), pickle.loads(pickle.dumps(pe))):
        assert tuple(clone.cache_info()) == (0, 0, 3, 0, 4096, 0)
        assert clone.zero_copy


# ------------------------------------------------------------------------------ cached_penc
def test_cached_penc_is_the_last_result_as_in_the_package():
    x = torch.randn(2, 5, 6, 12)
    ours, theirs = PositionalEncoding2D(12), peer.PositionalEncoding2D(12)
    assert ours.cached_penc is None and theirs.cached_penc is None
    out = ours(x)
    theirs(x)
    assert ours.cached_penc is out
    assert_close(ours.cached_penc, theirs.cached_penc, rtol=0, atol=1e-6)
    summer = vispos.Summer(ours)
    summed = summer(x * 2)
    assert_close(summed - x * 2, summer.penc.cached_penc, rtol=0, atol=1e-6)
    assert summer.penc.cached_penc is not out  # the last result, not a shared one
    ours.cached_penc.numpy()[...] = 5.0  # the caller's own tensor: no later call sees it
    assert_close(ours(x), theirs(x), rtol=0, atol=1e-6)
    ours.half()  # a move or cast forgets it (it would be on the old device / dtype)
    assert ours.cached_penc is None
