"""vispos.app.figures.leak: an item's features alone against in a padded batch (issue 31's figure)."""

import pytest
import torch

from vispos.app.figures import padding_leak_maps, plot_padding_leak
from vispos.backbones import TimmBackbone


def _pair():
    torch.manual_seed(0)
    stock = TimmBackbone("resnet18", out_indices=(2, 3))
    g = torch.Generator().manual_seed(0)
    for m in stock.modules():  # trained-like batch norms: random initialisation hides the leak
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) - 0.5)
    invariant = TimmBackbone("resnet18", out_indices=(2, 3), padding_invariant=True)
    invariant.load_state_dict(stock.state_dict())
    return stock.eval(), invariant.eval()


def test_maps_show_the_leak_of_the_stock_backbone_only():
    stock, invariant = _pair()
    item, partner = torch.randn(3, 70, 50), torch.randn(3, 96, 96)
    leak, none = padding_leak_maps(stock, item, partner), padding_leak_maps(invariant, item, partner)
    alone = stock(__import__("vispos").NestedTensor(item[None], None))
    assert [tuple(m.shape) for m in leak] == [tuple(a.tensors.shape[2:]) for a in alone]
    assert float(leak[-1].max()) > 0.1
    assert all(float(m.max()) < 1e-4 for m in none)
    # the map is the largest channel change over the level's std, cell by cell (by hand here)
    batched = stock(__import__("vispos").nested_tensor_from_tensor_list([item, partner]))
    ref = alone[-1].tensors[0]
    want = (batched[-1].tensors[0, :, : ref.shape[1], : ref.shape[2]] - ref).abs().amax(0) / (ref.std() + 1e-12)
    torch.testing.assert_close(leak[-1], want)


def test_figure_has_a_row_per_backbone_and_a_column_per_level():
    stock, invariant = _pair()
    fig = plot_padding_leak({"stock": stock, "invariant": invariant}, torch.rand(3, 40, 30), torch.rand(3, 64, 48),
                            level_names=["C3", "C4"])
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 2 * 3
    assert images[1].get_title().startswith("C3 (5, 4): max")


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"backbones": {}}, ValueError, "at least one backbone"),
    ({"item": torch.rand(1, 8, 8)}, ValueError, r"must be \(3, H, W\) images"),
    ({"level_names": ["C3"]}, ValueError, "level_names must have 2 entries"),
])
def test_bad_arguments(kwargs, exc, match):
    stock, _ = _pair()
    args = {"backbones": {"stock": stock}, "item": torch.rand(3, 40, 30), "partner": torch.rand(3, 64, 48)}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        plot_padding_leak(**args)
    with pytest.raises(ValueError, match="same C"):
        padding_leak_maps(stock, torch.rand(3, 8, 8), torch.rand(1, 8, 8))
