"""decoding/linear.py: products over packed weights at inference, F.linear's where gradients are recorded."""

from __future__ import annotations

import gc
import io

import pytest
import torch
import torch.nn.functional as F

from specbench.decoding import linear as packed_linear
from specbench.decoding.linear import Linear, linear, onednn, packing

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


def test_a_bfloat16_product_matches_f_linear_whether_or_not_this_cpu_packs_it():
    # oneDNN packs bfloat16 only with avx_ne_convert or avx512bw/vl/dq: the product is right on either CPU
    torch.manual_seed(0)
    layer = Linear(40, 96).to(torch.bfloat16)
    x = torch.randn(7, 40, dtype=torch.bfloat16)
    with torch.no_grad():
        got = layer(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=2e-2, atol=2e-2)
    assert (id(layer.weight) in packed_linear._packed) == onednn(torch.bfloat16)


def test_a_dtype_onednn_refuses_on_this_cpu_takes_f_linear(monkeypatch):
    # what oneDNN raises for bfloat16 on an AVX2-only CPU, made to happen here whatever this CPU has
    def reorder(weight):
        if weight.dtype == torch.bfloat16:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert "
                               "or avx512bw, avx512vl and avx512dq")
        return torch.ops.mkldnn._reorder_linear_weight(weight, packed_linear.PACKED_ROWS)

    monkeypatch.setattr(packed_linear, "_reorder", reorder)
    onednn.cache_clear()
    try:
        weight, x = torch.randn(16, 8), torch.randn(3, 8)
        with torch.no_grad():
            assert torch.equal(linear(x.bfloat16(), weight.bfloat16()), F.linear(x.bfloat16(), weight.bfloat16()))
            torch.testing.assert_close(linear(x, weight), F.linear(x, weight), rtol=0, atol=1e-4)
        assert not onednn(torch.bfloat16) and onednn(torch.float32)
        assert id(weight) in packed_linear._packed
    finally:
        onednn.cache_clear()
