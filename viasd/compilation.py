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

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled(model: nn.Module) -> nn.Module:
    """`torch.compile(model, dynamic=True)`, memoised per module: every decode shares its graphs."""
    wrapped = _COMPILED.get(model)
    if wrapped is None:
        wrapped = _COMPILED[model] = torch.compile(model, dynamic=True)
    return wrapped
