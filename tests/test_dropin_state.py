"""Drop-ins keep trainability: what the peer trains stays a parameter, what it buffers stays a buffer.

A drop-in swapped into a peer's model must not freeze what the peer trains (fine-tuning would
silently skip it, and optimizer state saved from the peer's model would no longer line up) nor
train what the peer keeps fixed. For every drop-in whose peer is installed, the peer's module
and vispos' are listed side by side:

- the **trainable parameters** (``requires_grad``, in ``parameters()``): the same names (up to
  the documented renames), shapes and count;
- the peer's **persistent buffers**: buffers in vispos' module too (never parameters). vispos
  keeps derived tables non-persistent (DESIGN.md, "State"), so persistence is not compared;
- the peer's **frozen parameters** (MONAI's sin-cos table, rotary-embedding-torch's frequencies):
  never trainable in vispos' module.

Tiny configs, no weights are downloaded.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import vispos


def _kinds(module: nn.Module, rename: dict[str, str] | None = None) -> dict[str, set]:
    rename = rename or {}

    def name(n):
        for old, new in rename.items():
            n = n.replace(old, new)
        return n

    persistent = set()
    for mod_name, mod in module.named_modules():
        for b in mod._buffers:
            if b not in mod._non_persistent_buffers_set and mod._buffers[b] is not None:
                persistent.add(f"{mod_name}.{b}" if mod_name else b)
    return {
        "trainable": {(name(n), tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad},
        "frozen": {name(n) for n, p in module.named_parameters() if not p.requires_grad},
        "buffers": {name(n) for n, _ in module.named_buffers()},
        "persistent": {name(n) for n in persistent},
    }


def _assert_same_kinds(peer: nn.Module, ours: nn.Module, rename: dict[str, str] | None = None) -> None:
    theirs, mine = _kinds(peer, rename), _kinds(ours)
    assert mine["trainable"] == theirs["trainable"], (mine["trainable"], theirs["trainable"])
    assert theirs["persistent"] <= mine["buffers"], (theirs["persistent"], mine["buffers"])
    trained = {n for n, _ in mine["trainable"]}
    assert not theirs["frozen"] & trained, theirs["frozen"] & trained


# ------------------------------------------------------------------------ transformers' SAM
def _sam_configs():
    pytest.importorskip("transformers")
    from transformers.models.sam.configuration_sam import (
        SamMaskDecoderConfig,
        SamPromptEncoderConfig,
        SamVisionConfig,
    )

    vision = SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=1, num_attention_heads=2,
                             image_size=64, patch_size=8, mlp_dim=32, num_pos_feats=8, global_attn_indexes=[0],
                             window_size=0)
    prompt = SamPromptEncoderConfig(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=4)
    decoder = SamMaskDecoderConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, mlp_dim=32,
                                   iou_head_hidden_dim=16)
    return vision, prompt, decoder


def _tiny_sam():
    from transformers import SamConfig, SamModel

    vision, prompt, decoder = _sam_configs()
    torch.manual_seed(0)
    return SamModel(SamConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)).eval()


def test_sam_positional_embedding_is_trainable_as_transformers():
    pytest.importorskip("transformers")
    from transformers.models.sam.modeling_sam import SamPositionalEmbedding as Peer

    vision, _, _ = _sam_configs()
    peer = Peer(vision)
    assert isinstance(peer.positional_embedding, nn.Parameter) and peer.positional_embedding.requires_grad
    for ours in (vispos.SamPositionalEmbedding.from_module(peer), vispos.SamPositionalEmbedding(8)):
        _assert_same_kinds(peer, ours)
        assert isinstance(ours.positional_embedding, nn.Parameter)
    # a frozen peer stays frozen
    peer.positional_embedding.requires_grad_(False)
    assert not vispos.SamPositionalEmbedding.from_module(peer).positional_embedding.requires_grad


def test_swapped_sam_model_trains_the_same_tensors():
    """The documented swap into a SamModel: the same trainable tensors, in the same order, and
    a step of SGD moves the embedding's matrix in both models alike."""
    pytest.importorskip("transformers")
    model = _tiny_sam()
    swapped = copy.deepcopy(model)
    twin = vispos.SamPositionalEmbedding.from_module(model.shared_image_embedding)
    swapped.shared_image_embedding = swapped.prompt_encoder.shared_embedding = twin
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names == [n for n, p in swapped.named_parameters() if p.requires_grad]
    assert [n for n, _ in model.named_buffers()] == [n for n, _ in swapped.named_buffers()]
    assert model.state_dict().keys() == swapped.state_dict().keys()
    pixels, points = torch.rand(1, 3, 64, 64), torch.rand(1, 1, 2, 2) * 64
    for m in (model, swapped):
        m.zero_grad()
        m(pixel_values=pixels, input_points=points).pred_masks.square().sum().backward()
    g1, g2 = model.shared_image_embedding.positional_embedding.grad, twin.positional_embedding.grad
    assert g1 is not None and g2 is not None and g1.abs().sum() > 0
    torch.testing.assert_close(g2, g1, rtol=1e-4, atol=1e-6)


def test_sam2_positional_embedding_stays_a_buffer():
    pytest.importorskip("transformers")
    try:
        from transformers.models.sam2.configuration_sam2 import Sam2PromptEncoderConfig
        from transformers.models.sam2.modeling_sam2 import Sam2PositionalEmbedding as Peer
    except ImportError:
        pytest.skip("transformers without SAM 2")
    peer = Peer(Sam2PromptEncoderConfig(hidden_size=16))
    ours = vispos.SamPositionalEmbedding.from_module(peer)
    _assert_same_kinds(peer, ours)
    assert "positional_embedding" in dict(ours.named_buffers())
    assert "trainable=False" in repr(ours)


def test_segment_anything_matrix_stays_a_buffer():
    sam = pytest.importorskip("segment_anything.modeling.prompt_encoder")
    peer = sam.PositionEmbeddingRandom(8)
    for ours in (vispos.PositionEmbeddingRandom(8), vispos.PositionEmbeddingRandom.from_module(peer)):
        _assert_same_kinds(peer, ours)
        assert "trainable" not in repr(ours)


def test_trainable_is_a_choice():
    pe = vispos.PositionEmbeddingRandom(8, trainable=True)
    assert isinstance(pe.positional_encoding_gaussian_matrix, nn.Parameter)
    assert "trainable=True" in repr(pe)
    frozen = vispos.SamPositionalEmbedding(8, trainable=False)
    assert "positional_embedding" in dict(frozen.named_buffers()) and not list(frozen.parameters())
    with pytest.raises(TypeError, match=r"trainable must be a bool or None, got 1"):
        vispos.PositionEmbeddingRandom(8, trainable=1)
    # the state-dict key and values are the same either way, and load into each other
    a, b = vispos.PositionEmbeddingRandom(8, trainable=True), vispos.PositionEmbeddingRandom(8)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.positional_encoding_gaussian_matrix.detach(), b.positional_encoding_gaussian_matrix)


# ------------------------------------------------------------------- DETR, timm, RoPE, ...
def _detr_learned():
    from transformers.models.detr.modeling_detr import DetrLearnedPositionEmbedding

    return DetrLearnedPositionEmbedding(8), vispos.PositionEmbeddingLearned(8), {
        "row_embeddings": "row_embed", "column_embeddings": "col_embed"}


def _detr_sine():
    from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

    return DetrSinePositionEmbedding(8, normalize=True), vispos.PositionEmbeddingSine(8, normalize=True), None


def _timm_mixed():
    from timm.layers.pos_embed_sincos import RotaryEmbeddingMixed

    return RotaryEmbeddingMixed(32, depth=2, num_heads=2, feat_shape=[4, 5]), vispos.MixedRotaryEmbedding(
        32, 2, 2, feat_shape=[4, 5]), None


def _timm_dinov3():
    from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3

    return RotaryEmbeddingDinoV3(32, feat_shape=[4, 5]), vispos.DinoV3RotaryEmbedding(32, feat_shape=[4, 5]), None


def _positional_encodings(name):
    def build():
        import positional_encodings.torch_encodings as peer

        return getattr(peer, name)(8), getattr(vispos, name)(8), {"penc.": ""}

    return build


def _rotary_embedding_torch():
    from rotary_embedding_torch import RotaryEmbedding

    return RotaryEmbedding(8), vispos.RotaryEmbedding(8), None


def _monai_vit(pos_embed_type):
    def build():
        from monai.networks.nets import ViT

        from vispos.monai import AnySizeViT

        torch.manual_seed(0)
        vit = ViT(1, (16, 16, 16), (8, 8, 8), hidden_size=24, mlp_dim=48, num_layers=1, num_heads=2,
                  pos_embed_type=pos_embed_type)
        return vit, AnySizeViT.from_monai(copy.deepcopy(vit)), None

    return build


DROPINS = {
    "detr_learned": ("transformers", _detr_learned),
    "detr_sine": ("transformers", _detr_sine),
    "timm_mixed_rope": ("timm", _timm_mixed),
    "timm_dinov3_rope": ("timm", _timm_dinov3),
    **{f"pe_{n}": ("positional_encodings", _positional_encodings(n)) for n in (
        "PositionalEncoding1D", "PositionalEncoding2D", "PositionalEncoding3D",
        "PositionalEncodingPermute1D", "PositionalEncodingPermute2D", "PositionalEncodingPermute3D")},
    "rotary_embedding_torch": ("rotary_embedding_torch", _rotary_embedding_torch),
    **{f"monai_vit_{t}": ("monai", _monai_vit(t)) for t in ("learnable", "sincos", "fourier")},
}


@pytest.mark.parametrize("case", list(DROPINS))
def test_dropin_parameters_and_buffers_match_the_peer(case):
    package, build = DROPINS[case]
    pytest.importorskip(package)
    peer, ours, rename = build()
    _assert_same_kinds(peer, ours, rename)
