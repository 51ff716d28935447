"""The few places where torch and transformers have no public API for what the slim verifier needs, in one
module, each with the reason. Everything else reads models through public APIs (`get_submodule`,
`named_children`, `setattr`).

- `view_of`: a second `nn.Module` object of the same class that shares every child module, parameter and
  buffer with the original but has its own child table, so that replacing a child in the view (the layer
  stack by the kept layers) leaves the original untouched. torch has no public shallow copy with separate
  child tables (`copy.copy` shares the `_modules` dict, so a replacement would reach the target); the view
  is built from the module's state, with its three tables copied.
- `install_output_hooks`: transformers (5) installs its output-capturing hooks on the layers the first
  time a model is asked for hidden states, and marks that model object (`_can_record_outputs` tells
  which modules capture). A view shares the layers but is another object: asked first, it would hook the
  shared layers, and the target asked later would hook them again. Hooking the target before taking a view
  lets the view inherit the mark, so the hooks exist once.
- `raise_recompile_limit`: Dynamo keeps its compiled graphs per code object, so models of one architecture
  share `XForCausalLM.forward`'s recompilation budget (`torch._dynamo.config.recompile_limit`); past it a
  model silently runs eager. torch exposes the limit only in that config.
"""

from __future__ import annotations

from torch import nn


def view_of(module: nn.Module) -> nn.Module:
    """A new module object of the same class sharing every child and tensor, with its own child tables."""
    view = module.__class__.__new__(module.__class__)
    state = dict(module.__dict__)
    state["_modules"] = type(module._modules)(module._modules)
    state["_parameters"] = type(module._parameters)(module._parameters)
    state["_buffers"] = type(module._buffers)(module._buffers)
    view.__dict__.update(state)
    return view


def install_output_hooks(target: nn.Module, path: tuple[str, ...]) -> None:
    """Install transformers' output-capturing hooks on `target` (and on each module on `path` to its layer
    stack that captures outputs) before a view of it is taken; no-op on transformers without them."""
    try:
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:  # older transformers: outputs are returned by the layers, no hooks
        return
    node = target
    for name in (None, *path[:-1]):
        node = node if name is None else node.get_submodule(name)
        if getattr(node, "_can_record_outputs", None):
            maybe_install_capturing_hooks(node)


def raise_recompile_limit(at_least: int) -> None:
    """Let Dynamo keep at least `at_least` graphs per code object."""
    import torch

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, at_least)
