"""`torch.compile` of the models the decode loop calls, once per module and process (`DecodePolicy.compile`).

Off by default. The decode loop's forwards are small (one token, or a block of `gamma + 1`), so on a
CPU much of a step is Python and operator dispatch; `torch.compile(dynamic=True)` fuses it. Shapes
vary (prefill, single steps, verification blocks, a cache that grows), so the graphs are compiled with
symbolic sizes: a handful of graphs per model, compiled on first use (minutes on a small CPU), then
reused by every later decode in the process. It pays off for long runs (the benchmark, a server), not
for a short job that compiles and exits. The compiled module wraps the same weights; greedy outputs
are checked against the eager ones in the tests and by the benchmark before any timing.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from .module_views import raise_recompile_limit

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


GRAPHS_PER_MODEL = 8  # prefill, single steps, verification blocks, ... with room to spare


def compiled(model: nn.Module) -> nn.Module:
    """`torch.compile(model, dynamic=True)`, memoised per module: every decode shares its graphs.

    Dynamo keeps its graphs per code object, so a target, a draft and a slim view of the same
    architecture share `XForCausalLM.forward`'s budget of recompilations (`recompile_limit`, 8 by
    default); past it a model silently runs eager. Each compiled model adds `GRAPHS_PER_MODEL` to it.
    """
    wrapped = _COMPILED.get(model)
    if wrapped is None:
        raise_recompile_limit(GRAPHS_PER_MODEL * (len(_COMPILED) + 1))
        wrapped = _COMPILED[model] = torch.compile(model, dynamic=True)
    return wrapped
