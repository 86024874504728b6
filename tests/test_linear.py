"""engine/linear.py: products over packed weights at inference, F.linear's where gradients are recorded."""

from __future__ import annotations

import gc
import io

import pytest
import torch
import torch.nn.functional as F

from specbench.engine import linear as packed_linear
from specbench.engine.linear import Linear, linear, onednn, packing

pytestmark = pytest.mark.skipif(not onednn(), reason="this torch cannot pack weights for oneDNN")


def test_inference_products_are_f_linear_up_to_rounding():
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 40), torch.randn(96)
    with torch.no_grad():
        inputs = (torch.randn(40), torch.randn(7, 40), torch.randn(2, 3, 40), torch.randn(40, 5).t(),
                  torch.randn(0, 40))
        for x in inputs:
            got = linear(x, weight, bias)
            assert got.shape == F.linear(x, weight, bias).shape
            torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=0, atol=1e-4)
    assert id(weight) in packed_linear._packed


def test_training_takes_f_linear_and_its_gradients():
    layer = Linear(8, 4)
    x = torch.randn(3, 8)
    out = layer(x)
    assert out.grad_fn is not None and torch.equal(out, F.linear(x, layer.weight, layer.bias))
    out.sum().backward()
    assert layer.weight.grad is not None
    assert id(layer.weight) not in packed_linear._packed


def test_a_weight_changed_in_place_is_packed_again():
    weight = torch.nn.Parameter(torch.randn(16, 8))
    x = torch.randn(2, 8)
    with torch.no_grad():
        before = linear(x, weight)
        weight.add_(1.0)  # an optimizer step
        after = linear(x, weight)
    torch.testing.assert_close(after, F.linear(x, weight.detach()), rtol=0, atol=1e-4)
    assert not torch.allclose(before, after)


def test_a_weight_whose_data_is_swapped_is_packed_again():
    # `.data = ...` (flat.fuse) and a module's `.to(dtype)` replace the values without a version change
    layer = Linear(8, 16)
    x = torch.randn(2, 8)
    with torch.no_grad():
        layer(x)
        layer.weight.data = torch.randn(16, 8)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-4)
        layer.to(torch.bfloat16)
        assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_the_packed_copy_goes_with_its_weight_and_never_into_a_save():
    weight = torch.nn.Parameter(torch.randn(16, 8))
    with torch.no_grad():
        linear(torch.randn(2, 8), weight)
    assert id(weight) in packed_linear._packed
    torch.save({"w": weight}, io.BytesIO())  # the packed copy is not on the tensor: the save works
    key = id(weight)
    del weight
    gc.collect()
    assert key not in packed_linear._packed


def test_packing_off_is_f_linear_exactly():
    weight, x = torch.randn(32, 16), torch.randn(5, 16)
    with torch.no_grad(), packing(False):
        assert torch.equal(linear(x, weight), F.linear(x, weight))
