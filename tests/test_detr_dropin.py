"""vispos' embeddings as drop-ins for DETR's ``models/position_encoding.py``.

In DETR-family code the Joiner hands the position embedding DETR's own
``util.misc.NestedTensor`` (``.tensors``, ``.mask``, ``.decompose()``). ``_DetrNestedTensor``
below is that class's whole interface, written from DETR; the model around it (backbone ->
DETR's Joiner -> transformer encoder) is DETR's structure. Swapping only the position
embedding for vispos' must give the same outputs as the model built with a reference
embedding written from DETR's formula.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn
from torch.testing import assert_close

from vispos import PositionEmbeddingLearned, PositionEmbeddingSine
from vispos.encodings.presets import dino_sine


class _DetrNestedTensor:
    """DETR ``util/misc.py``: ``NestedTensor`` (the attributes and methods DETR's modules use)."""

    def __init__(self, tensors, mask):
        self.tensors = tensors
        self.mask = mask

    def to(self, device):
        mask = None if self.mask is None else self.mask.to(device)
        return _DetrNestedTensor(self.tensors.to(device), mask)

    def decompose(self):
        return self.tensors, self.mask


class _ReferenceSine(nn.Module):
    """DETR's ``PositionEmbeddingSine``, from the paper's formula (2D, y block then x block)."""

    def __init__(self, num_pos_feats=64, temperature=10000, normalize=False, scale=None):
        super().__init__()
        self.num_pos_feats, self.temperature, self.normalize = num_pos_feats, temperature, normalize
        self.scale = 2 * math.pi if scale is None else scale

    def forward(self, tensor_list):
        mask = tensor_list.mask
        not_mask = ~mask
        y_embed = not_mask.cumsum(1, dtype=torch.float32)
        x_embed = not_mask.cumsum(2, dtype=torch.float32)
        if self.normalize:
            eps = 1e-6
            y_embed = y_embed / (y_embed[:, -1:, :] + eps) * self.scale
            x_embed = x_embed / (x_embed[:, :, -1:] + eps) * self.scale
        dim_t = torch.arange(self.num_pos_feats, dtype=torch.float32)
        dim_t = self.temperature ** (2 * (dim_t // 2) / self.num_pos_feats)
        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class _ReferenceLearned(nn.Module):
    """DETR's ``PositionEmbeddingLearned``: x (column) block then y (row) block."""

    def __init__(self, num_pos_feats=256):
        super().__init__()
        self.row_embed = nn.Embedding(50, num_pos_feats)
        self.col_embed = nn.Embedding(50, num_pos_feats)
        nn.init.uniform_(self.row_embed.weight)
        nn.init.uniform_(self.col_embed.weight)

    def forward(self, tensor_list):
        x = tensor_list.tensors
        h, w = x.shape[-2:]
        x_emb = self.col_embed(torch.arange(w))
        y_emb = self.row_embed(torch.arange(h))
        pos = torch.cat([x_emb.unsqueeze(0).repeat(h, 1, 1), y_emb.unsqueeze(1).repeat(1, w, 1)], dim=-1)
        return pos.permute(2, 0, 1).unsqueeze(0).repeat(x.shape[0], 1, 1, 1)


class _Backbone(nn.Module):
    """DETR's ``BackboneBase.forward``: features per level, each with its mask resized."""

    def __init__(self, channels=32):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, channels, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(channels, channels, 3, stride=2, padding=1))

    def forward(self, tensor_list):
        x = self.body(tensor_list.tensors)
        m = tensor_list.mask
        mask = nn.functional.interpolate(m[None].float(), size=x.shape[-2:]).to(torch.bool)[0]
        return {"0": _DetrNestedTensor(x, mask)}


class _Joiner(nn.Sequential):
    """DETR ``models/backbone.py``: ``Joiner``."""

    def forward(self, tensor_list):
        xs = self[0](tensor_list)
        out, pos = [], []
        for _, x in xs.items():
            out.append(x)
            pos.append(self[1](x).to(x.tensors.dtype))
        return out, pos


class _DetrLike(nn.Module):
    """Backbone, joiner and a transformer encoder taking ``src + pos`` with a key padding mask."""

    def __init__(self, position_embedding, hidden_dim=32):
        super().__init__()
        self.backbone = _Joiner(_Backbone(hidden_dim), position_embedding)
        layer = nn.TransformerEncoderLayer(hidden_dim, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, samples: _DetrNestedTensor) -> Tensor:
        features, pos = self.backbone(samples)
        src, mask = features[-1].decompose()
        seq = (src + pos[-1]).flatten(2).transpose(1, 2)
        return self.encoder(seq, src_key_padding_mask=mask.flatten(1))


def _samples():
    torch.manual_seed(0)
    tensors = torch.zeros(2, 3, 40, 48)
    mask = torch.ones(2, 40, 48, dtype=torch.bool)
    tensors[0, :, :40, :32] = torch.rand(3, 40, 32)
    mask[0, :40, :32] = False
    tensors[1, :, :24, :48] = torch.rand(3, 24, 48)
    mask[1, :24, :48] = False
    return _DetrNestedTensor(tensors, mask)


@pytest.mark.parametrize(
    "ours, reference",
    [
        (lambda: PositionEmbeddingSine(16, normalize=True), lambda: _ReferenceSine(16, normalize=True)),
        (lambda: PositionEmbeddingSine(16), lambda: _ReferenceSine(16)),
        (lambda: dino_sine(16), lambda: _ReferenceSine(16, temperature=20, normalize=True)),
    ],
    ids=["sine normalized", "sine", "dino preset"],
)
def test_detr_model_with_vispos_sine_equals_reference(ours, reference):
    samples = _samples()
    torch.manual_seed(1)
    model_ref = _DetrLike(reference()).eval()
    model = _DetrLike(ours()).eval()
    model.load_state_dict(model_ref.state_dict())
    with torch.no_grad():
        level = model.backbone[0](samples)["0"]
        assert_close(model.backbone[1](level), model_ref.backbone[1](level), rtol=1e-6, atol=1e-6)
        assert_close(model(samples), model_ref(samples), rtol=1e-5, atol=1e-5)


def test_detr_model_with_vispos_learned_equals_reference():
    samples = _samples()
    torch.manual_seed(1)
    model_ref = _DetrLike(_ReferenceLearned(16)).eval()
    model = _DetrLike(PositionEmbeddingLearned(16)).eval()
    model.load_state_dict(model_ref.state_dict())  # DETR's row_embed / col_embed keys load as they are
    with torch.no_grad():
        level = model.backbone[0](samples)["0"]
        assert_close(model.backbone[1](level), model_ref.backbone[1](level), rtol=0, atol=0)
        assert_close(model(samples), model_ref(samples), rtol=0, atol=0)


def test_detr_nested_tensor_without_mask_means_no_padding():
    x = torch.rand(2, 3, 5, 6)
    pe = PositionEmbeddingSine(8, normalize=True)
    assert_close(pe(_DetrNestedTensor(x, None)), pe(x), rtol=0, atol=0)
