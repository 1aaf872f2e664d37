"""Sweep: timm architectures nobody named, each either exact with padding_invariant=True or refused
at construction with vispos' ValueError; never silently inexact.

For every model (pretrained=False, trained-like normalisation statistics and affine weights, since
timm zero-initialises some last norms, which hides leaks; float64; eval) two images of different
sizes, each padded along one axis in the batch (sizes that are not multiples
of 32, or multiples for models whose stock forward needs them), are compared with themselves alone on their own
cells, on every level. Run ``python tests/test_invariance_sweep.py [N]`` for the counts (exact /
refused / by reason) over the first N selected models.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import pytest
import torch
from trained_norms import trained_like

if __name__ == "__main__":  # run as a script: the repository root, for benchmarks/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._coverage_cases import TOO_LARGE, timm_models  # the model selection, shared
from benchmarks._coverage_report import refusal_reason  # the refusal reasons, shared

#: the relative tolerance (of the level's standard deviation) for "exact" in float64
TOL = 1e-9
#: transformer families beyond the representatives kept (ViT, DeiT-style test_vit, EVA, Swin, PVT,
#: MaxViT, Hiera, MobileViT, EdgeNeXt, EfficientViT, FastViT, PiT, Visformer, hybrid ViT, LeViT,
#: MetaFormer, MLP-Mixer: every one must come out refused or exact, and the skipped ones are refused
#: for the same reasons), beside the modules too large to build here
_SKIP_MODULES = TOO_LARGE | frozenset({
    "cait", "coat", "convit", "crossvit", "davit", "efficientformer_v2", "efficientvim", "gcvit", "mvitv2", "nest",
    "nextvit", "sequencer", "shvit", "swiftformer", "swin_transformer_v2", "swin_transformer_v2_cr", "twins",
    "vitamin", "volo", "xcit", "tiny_vit", "focalnet", "hieradet_sam2", "lowformer", "efficientvit_msra",
    "vision_transformer_relpos",
})


def sweep_models() -> list[str]:
    """One model per timm module (its smallest by name), then the extra CNN picks; deterministic
    (``benchmarks/_coverage_cases.py`` picks them, for the coverage sweep too)."""
    return timm_models(_SKIP_MODULES)


def _levels(bb, images, pad_value=2.0):
    from vispos import NestedTensor, nested_tensor_from_tensor_list

    with torch.no_grad():
        alone = [bb(NestedTensor(x[None], None)) for x in images]
        batch = bb(nested_tensor_from_tensor_list(images, pad_value=pad_value))
    return alone, batch


_ODD, _ALIGNED = ((66, 90), (94, 62)), ((96, 128), (128, 96))


def check_model(name: str, sizes=_ODD) -> dict:
    """``{"model", "status", "reason", "max_rel", "seconds"}``; status: ``"exact"``, ``"refused"``
    (ValueError at construction), ``"silent"`` (accepted, then different in a batch), ``"crash"``
    (another error from vispos), ``"n/a"`` (timm cannot build or run the stock feature model)."""
    import timm

    from vispos.backbones import TimmBackbone

    start = time.perf_counter()
    out = {"model": name, "status": "", "reason": "", "max_rel": 0.0}
    try:
        n_levels = len(timm.create_model(name, features_only=True, pretrained=False).feature_info)
    except Exception as exc:  # noqa: BLE001 - timm's own limits: not vispos' promise
        out.update(status="n/a", reason=f"timm features_only: {type(exc).__name__}")
        return out | {"seconds": time.perf_counter() - start}
    indices = tuple(range(n_levels))
    g = torch.Generator().manual_seed(0)
    images = [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in sizes]
    try:
        torch.manual_seed(0)
        bb = TimmBackbone(name, out_indices=indices, padding_invariant=True)
    except ValueError as exc:
        if "are not available for" in str(exc):  # timm cannot build these out_indices by name
            out.update(status="n/a", reason="timm out_indices")
        else:
            out.update(status="refused", reason=refusal_reason(str(exc)))
        return out | {"seconds": time.perf_counter() - start}
    except Exception as exc:  # noqa: BLE001 - the promise: a refusal is vispos' ValueError
        out.update(status="crash", reason=f"{type(exc).__name__}: {str(exc)[:200]}")
        return out | {"seconds": time.perf_counter() - start}
    bb = trained_like(bb).double().eval()
    try:
        alone, batch = _levels(bb, images)
    except Exception as exc:  # noqa: BLE001
        stock = TimmBackbone(name, out_indices=indices).double().eval()
        try:
            _levels(stock, images)
        except Exception:  # noqa: BLE001 - the stock model cannot run these sizes either
            if sizes != _ALIGNED:  # models that need sizes divisible by their stride
                return check_model(name, _ALIGNED)
            out.update(status="n/a", reason="the stock model cannot run these sizes")
        else:
            out.update(status="crash", reason=f"forward {type(exc).__name__}: {str(exc)[:200]}")
        return out | {"seconds": time.perf_counter() - start}
    worst, where = 0.0, ""
    for i, levels in enumerate(alone):
        for level, (a, p) in enumerate(zip(levels, batch)):
            ref = a.tensors[0]
            got = p.tensors[(i, slice(None), *(slice(0, s) for s in ref.shape[1:]))]
            scale = float(ref.std()) or 1.0
            rel = float((got - ref).abs().max()) / scale if torch.isfinite(got).all() else float("inf")
            if rel > worst:
                worst, where = rel, f"level {level} ({tuple(ref.shape)}), image {i}"
    out.update(max_rel=worst, status="exact" if worst <= TOL else "silent", reason="" if worst <= TOL else where)
    return out | {"seconds": time.perf_counter() - start}


def summarise(results: list[dict]) -> str:
    counts = Counter(r["status"] for r in results)
    reasons = Counter(r["reason"] for r in results if r["status"] == "refused")
    lines = [f"{len(results)} models: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    lines += [f"  refused, {reason}: {n}" for reason, n in reasons.most_common()]
    lines += [f"  {r['status']}: {r['model']} {r['reason']} max_rel={r['max_rel']:.3g}"
              for r in results if r["status"] in ("silent", "crash", "n/a")]
    return "\n".join(lines)


#: a fast subset of the sweep (exact families, one refused, one hook-based, one NF-Net)
FAST = ("resnet18", "tf_efficientnet_b0", "legacy_xception", "regnetx_002", "test_nfnet")


@pytest.mark.parametrize("name", FAST)
def test_fast_subset_exact_or_refused(name):
    result = check_model(name)
    assert result["status"] in ("exact", "refused"), result


@pytest.mark.slow
@pytest.mark.exhaustive
def test_sweep_exact_or_refused_never_silent():
    models = sweep_models()
    assert len(models) >= 60
    results = [check_model(name) for name in models]
    print("\n" + summarise(results))
    bad = [r for r in results if r["status"] in ("silent", "crash")]
    assert sum(r["status"] in ("exact", "refused") for r in results) >= 60
    assert not bad, summarise(bad)


if __name__ == "__main__":  # python tests/test_invariance_sweep.py [N]: the counts, one line per model
    import json

    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    results = []
    for name in sweep_models()[:limit]:
        results.append(check_model(name))
        print(json.dumps(results[-1]), flush=True)
    print(summarise(results))
