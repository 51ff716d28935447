"""The in-place KV cache layer against transformers' DynamicLayer: same states after any sequence of
updates, crops and growth; and which layers a cache of each kind gets."""

import pytest
import torch
from tiny_models import config_for
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from viasd.decoding.kv_cache import InPlaceLayer, model_cache
from viasd.errors import PolicyError


def _states(t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, t, 4, generator=g), torch.randn(1, 2, t, 4, generator=g)


def test_inplace_layer_matches_dynamic_layer_through_updates_crops_and_growth():
    ours, ref = InPlaceLayer(capacity=5), DynamicLayer()
    steps = [("update", 3), ("update", 1), ("crop", -2), ("update", 4), ("update", 1), ("crop", 0),
             ("crop", -5), ("update", 9), ("update", 1)]  # capacity 5 -> 10 (needs 6) -> 20 (needs 12)
    for k, (op, n) in enumerate(steps):
        if op == "update":
            key, value = _states(n, k)
            got, want = ours.update(key, value), ref.update(key, value)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        else:
            ours.crop(n)
            ref.crop(n)
        assert ours.get_seq_length() == ref.get_seq_length()
        assert ours.get_mask_sizes(1) == ref.get_mask_sizes(1)
    assert ours.capacity == 20
    # the states live in one buffer: the returned keys are a view, not a copy
    assert ours.keys.data_ptr() == ours._k.data_ptr()


def test_inplace_layer_refuses_a_positive_crop_and_resets():
    layer = InPlaceLayer(capacity=4)
    layer.update(*_states(2, 0))
    with pytest.raises(ValueError, match="negative"):
        layer.crop(1)
    layer.reset()
    assert layer.get_seq_length() == 0 and not layer.is_initialized
    layer.update(*_states(3, 1))
    assert layer.get_seq_length() == 3


def test_inplace_layer_batch_operations():
    layer, ref = InPlaceLayer(capacity=8), DynamicLayer()
    key = torch.randn(3, 2, 5, 4)
    layer.update(key, key + 1)
    ref.update(key, key + 1)
    index = torch.tensor([2, 0])
    layer.reorder_cache(index)
    ref.reorder_cache(index)
    torch.testing.assert_close(layer.keys, ref.keys)
    layer.batch_repeat_interleave(2)
    ref.batch_repeat_interleave(2)
    torch.testing.assert_close(layer.values, ref.values)
    layer.update(torch.zeros(4, 2, 1, 4), torch.zeros(4, 2, 1, 4))
    assert layer.keys.shape == (4, 2, 6, 4)


def test_cache_kinds_layers():
    from transformers import AutoModelForCausalLM

    llama = AutoModelForCausalLM.from_config(config_for("llama", 2, 64, 0))
    gemma2 = AutoModelForCausalLM.from_config(config_for("gemma2", 2, 64, 0))
    assert all(isinstance(layer, InPlaceLayer) for layer in model_cache(llama, "inplace", 32).layers)
    assert all(type(layer) is DynamicLayer for layer in model_cache(llama, "dynamic").layers)
    kinds = {type(layer) for layer in model_cache(gemma2, "inplace", 32).layers}
    assert kinds == {InPlaceLayer, DynamicSlidingWindowLayer}  # sliding layers keep transformers' own class
    with pytest.raises(PolicyError, match="cache must be one of inplace, dynamic, static"):
        model_cache(llama, "paged", 32)
    with pytest.raises(PolicyError, match="needs the decode's capacity"):
        model_cache(llama, "inplace")
