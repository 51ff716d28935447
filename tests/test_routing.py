"""The routed slim verifier: found by inspection, shares the target's tensors, computes exactly what
a model made of the kept layers computes, keeps an exact KV cache, and refuses bad masks."""

import json

import pytest
import torch
import transformers as tf
from tiny_models import ARCHS, config_for

from viasd.decoding.slim import RoutingMask, SlimVerifier, evenly_spaced_mask, find_layer_stack, shares_storage
from viasd.errors import MaskError, UnsupportedArchitectureError

STACKS = {"llama": "model.layers", "mistral": "model.layers", "qwen2": "model.layers", "qwen3": "model.layers",
          "gemma2": "model.layers", "phi3": "model.layers", "gpt2": "transformer.h", "gpt_neox": "gpt_neox.layers",
          "opt": "model.decoder.layers"}


def random_model(arch, layers=4, vocab=64, seed=0):
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(config_for(arch, layers, vocab, 0)).eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_stack_found_by_inspection(arch):
    assert ".".join(find_layer_stack(random_model(arch))) == STACKS[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_slim_view_shares_weights_and_leaves_target_intact(arch):
    target = random_model(arch)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    slim = SlimVerifier(target, RoutingMask.from_layers([0, 3], 4))
    assert shares_storage(slim)
    stack = dict(target.named_modules())[STACKS[arch]]
    assert len(stack) == 4 and target.config.num_hidden_layers == 4
    view_stack = dict(slim.model.named_modules())[STACKS[arch]]
    assert len(view_stack) == 2 and view_stack[0] is stack[0] and view_stack[1] is stack[3]
    assert slim.model.get_output_embeddings().weight is target.get_output_embeddings().weight
    n_target = sum(p.numel() for p in target.parameters())
    n_unique = len({p.data_ptr() for p in target.parameters()} | {p.data_ptr() for p in slim.model.parameters()})
    assert n_unique == len({p.data_ptr() for p in target.parameters()})  # nothing new allocated
    assert n_target > sum(p.numel() for p in slim.model.parameters())
    after = target.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_are_recorded_once_whichever_model_asks_first(arch):
    """transformers hooks the layers for `output_hidden_states` on first use; a view asked first must
    not leave the target recording every layer twice (the early-exit loss reads these states)."""
    target = random_model(arch)
    ids = torch.randint(0, 64, (1, 5))
    view = SlimVerifier(target, RoutingMask.from_layers([0, 2, 3], 4)).model
    assert len(view(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states) == 4
    full = target(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states
    assert len(full) == 5
    assert len(view(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states) == 4


@pytest.mark.parametrize("arch", ARCHS)
def test_slim_view_equals_a_model_of_the_kept_layers(arch):
    """keep [0, 2] of 4 == a 2-layer model holding copies of layers 0 and 2 (Gemma2: with their
    attention types, sliding window 8 over a 20-token input)."""
    keep = [0, 2]
    target = random_model(arch)
    config = config_for(arch, 2, 64, 0)
    if getattr(target.config, "layer_types", None) is not None:
        config.layer_types = [target.config.layer_types[i] for i in keep]
    small = tf.AutoModelForCausalLM.from_config(config).eval()
    stack_name = STACKS[arch]
    state = {}
    for key, value in target.state_dict().items():
        prefix = stack_name + "."
        if key.startswith(prefix):
            index, rest = key[len(prefix):].split(".", 1)
            if int(index) in keep:
                state[f"{prefix}{keep.index(int(index))}.{rest}"] = value
        else:
            state[key] = value
    small.load_state_dict(state, strict=False)
    ids = torch.randint(1, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    slim = SlimVerifier(target, RoutingMask.from_layers(keep, 4))
    with torch.no_grad():
        expected = small(ids).logits
        got = slim(ids).logits
    torch.testing.assert_close(got, expected)
    with torch.no_grad():  # keeping every layer gives the target itself
        full = SlimVerifier(target, RoutingMask.from_layers([0, 1, 2, 3], 4))(ids).logits
        torch.testing.assert_close(full, target(ids).logits)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2", "opt"])
@pytest.mark.parametrize("keep", [[1, 3], [2]])
@pytest.mark.parametrize("kind", ["inplace", "dynamic"])
def test_routed_cache_is_exact_and_rolls_back(arch, keep, kind):
    """Incremental decoding through the routed cache (dropped layers, even layer 0) equals a full
    forward, and a rollback leaves no trace (in-place buffers of capacity 12: they grow once, past 12)."""
    target = random_model(arch)
    slim = SlimVerifier(target, RoutingMask.from_layers(keep, 4))
    ids = torch.randint(1, 64, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = slim(ids, use_cache=False).logits[0]
        cache = slim.new_cache(kind, 12)
        cache.activate_past_recording()
        slim.model(input_ids=ids[:, :10], cache=cache, use_cache=True)
        slim.model(input_ids=ids[:, 10:16], cache=cache, use_cache=True)  # a block to reject
        cache.crop(-6)
        assert cache.get_seq_length() == 10
        rows = [slim.model(input_ids=ids[:, 10:14], cache=cache, use_cache=True).logits[0]]
        for t in range(14, 24):
            rows.append(slim.model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).logits[0])
            if t == 18:
                cache.crop(0)
    torch.testing.assert_close(torch.cat(rows), reference[10:], rtol=1e-4, atol=1e-4)


def test_mask_validation_messages(tmp_path):
    with pytest.raises(MaskError, match="keeps no layers"):
        RoutingMask.from_layers([], 4)
    with pytest.raises(MaskError, match="layer 4 is out of range for a target with 4 decoder layers"):
        RoutingMask.from_layers([0, 4], 4)
    with pytest.raises(MaskError, match="out of range"):
        RoutingMask.from_layers([-1], 4)
    with pytest.raises(MaskError, match="layer 2 is listed twice"):
        RoutingMask.from_layers([2, 0, 2], 4)
    with pytest.raises(MaskError, match="not an integer"):
        RoutingMask.from_layers([0, "1"], 4)
    with pytest.raises(MaskError, match="does not exist"):
        RoutingMask.from_json(tmp_path / "missing.json", 4)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MaskError, match="not readable JSON"):
        RoutingMask.from_json(bad, 4)
    nokey = tmp_path / "nokey.json"
    nokey.write_text(json.dumps({"layers": [0]}))
    with pytest.raises(MaskError, match='no "keep_layers"'):
        RoutingMask.from_json(nokey, 4)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"keep_layers": [3, 0, 1], "cost": 0.1, "budget": 0.75}))
    assert RoutingMask.from_json(good, 4).keep_layers == (0, 1, 3)
    assert RoutingMask.parse("0, 2,5", 6).keep_layers == (0, 2, 5)
    with pytest.raises(MaskError, match="comma-separated"):
        RoutingMask.parse("0;2", 6)
    with pytest.raises(MaskError, match="made for 6 decoder layers but the target has 4"):
        SlimVerifier(random_model("llama"), RoutingMask.from_layers([0], 6))


def test_evenly_spaced_masks():
    assert evenly_spaced_mask(12, 6).keep_layers == (0, 2, 4, 6, 8, 10)
    assert evenly_spaced_mask(4, 4).keep_layers == (0, 1, 2, 3)
    assert evenly_spaced_mask(5, 1).keep_layers == (0,)


def test_unknown_layout_is_a_clear_error():
    class Config(tf.PretrainedConfig):
        model_type = "toy"

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = Config(num_hidden_layers=2)
            self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))

    with pytest.raises(UnsupportedArchitectureError, match="found no candidate decoder layer stacks of 2"):
        find_layer_stack(Toy())
