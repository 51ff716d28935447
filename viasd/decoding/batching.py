"""Many prompts at once: every method decodes a batch, each row with its own acceptance, tiers and rollback.

A batched decode runs one `engine.DecodeSession` per row, unchanged: the method's block logic (drafting,
the acceptance tests, VIA-SD's tiers and router, the full model's lag) is per row by construction. What is
shared is the model passes. Each row runs as a coroutine (a greenlet); when its method calls a model — the
draft, a slim, the trunk, the full model's rest — the row's runner hands the call to the `Batch` and the
row pauses. Once every live row has paused, the batch runs the model that most rows wait for in one pass
over all of them (`ragged_cache`: each row at its own offset, feeding its own number of tokens), and
resumes those rows with their slices of the output. So rows that accepted different numbers of tokens,
rows whose tiers escalate at different blocks and rows still prefilling share passes with no alignment
step, and a row's tokens depend on its own prompt only.

Rows run in lockstep by default: a row that reaches the start of a block waits there until every running row
has, so the rows draft together, the slim tier runs over all of them at once, and the full model over the rows
that escalate. Left to run free (`lockstep=False`), rows whose blocks the slim tier settles draft on while others
wait for the full model, and each model's passes split into more, narrower ones (docs/results.md counts them);
the tokens are the same either way.

Rows come from a queue (`decode_batch(prompts, batch_size=...)`): a row that finishes frees its slot for the
next prompt, whose prefill joins the other rows' decoding passes (continuous batching); once the queue is
empty, finished rows leave the batch and the caches shrink to the rows still running.

A pass covers either every row of the batch — a row with nothing to feed to that model gets padding,
whose writes land past that row's end — or only the rows that call it, a sub-batch whose K/V are gathered
for the pass (a copy of their caches) and written back in place. Padding costs compute, gathering costs
memory traffic: each model's batch measures both at each width and takes the cheaper (`_Group._gather`).
So when three rows of eight escalate to the full model, the full model runs over three rows or eight,
whichever this machine does faster.

Per-row statistics count each row's own passes; their seconds include the time a row waited for the others
(its latency, not its cost); `BatchStats` has the batched passes and the wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .ragged_cache import Feed, RowCache, ragged_cache, ragged_layers
from .runner import ModelRunner


@dataclass
class BatchStats:
    """What a batched decode did as a whole. `passes`: batched passes per runner name; `rows_fed`: row-passes
    that fed tokens; `rows_computed`: row-passes computed (fed or padding; a sub-batch computes only the
    rows it feeds); `widths`: per runner, pass width (columns) -> passes;
    `wall_time_s`: the whole batch, first prefill to last token; `max_rows`: the batch size used."""

    passes: dict[str, int] = field(default_factory=dict)
    rows_fed: dict[str, int] = field(default_factory=dict)
    rows_computed: dict[str, int] = field(default_factory=dict)
    widths: dict[str, dict[int, int]] = field(default_factory=dict)
    wall_time_s: float = 0.0
    max_rows: int = 0
    new_tokens: int = 0

    def as_dict(self) -> dict:
        return {"passes": dict(self.passes), "rows_fed": dict(self.rows_fed), "rows_computed": dict(self.rows_computed),
                "widths": {k: dict(v) for k, v in self.widths.items()}, "wall_time_s": self.wall_time_s,
                "max_rows": self.max_rows, "new_tokens": self.new_tokens}


@dataclass
class _Call:
    """A row's pending model call: its handle, its inputs `[1, w]` ids or `[1, w, H]` embeddings, and the
    logits it keeps (`keep`: 0 for hidden states)."""

    group: _Group
    row: RowCache
    tokens: torch.Tensor
    embeds: bool
    keep: int


_AT_BLOCK_START = object()  # what a row hands the scheduler at the start of a block, in lockstep
_GO = object()  # what the scheduler hands back once every row is there


class _Output:
    """A row's slice of a batched output, as the runner reads it (`.logits` `[1, k, V]` or
    `.last_hidden_state` `[1, w, H]`); `batch_slice` `(r, c)`: the row's place in the pass, row `r` from column `c`
    on, where a runner cuts its slice of what forward hooks saw of the whole pass (`feature_drafter.TrunkFeatures`)."""

    def __init__(self, logits=None, last_hidden_state=None, batch_slice=None):
        self.logits = logits
        self.last_hidden_state = last_hidden_state
        self.batch_slice = batch_slice


class _Group:
    """One model over one kind of cache, shared by the rows: the runners of the same name over the same module.
    Holds the ragged cache (made from the first row's batch-1 cache layout) and each slot's handle."""

    def __init__(self, batch: Batch, name: str, model: nn.Module, template):
        self.batch, self.name, self.model = batch, name, model
        self.cache = ragged_cache(template, batch.slots, batch.capacity)
        self.layers = ragged_layers(self.cache)
        self.handles: dict[int, RowCache] = {}
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        # measured seconds per pass: (0, width) over every row, (n, width) a sub-batch of n rows (`_gather`)
        self._costs: dict[tuple[int, int], float] = {}

    def handle(self, slot: int) -> RowCache:
        """A fresh handle for the row in `slot` (a row that ends leaves its slot to the next one's)."""
        self.handles[slot] = handle = RowCache(slot)
        return handle

    @torch.inference_mode()
    def run(self, calls: list[_Call]) -> list[_Output]:
        """One pass for the calls: over every row of the batch (the others padding) or over the calling rows
        alone (a sub-batch, their K/V gathered), whichever the measured pass costs say is cheaper."""
        slots = self.batch.slots
        width = max(c.tokens.shape[1] for c in calls)
        rows = sorted(c.row.slot for c in calls) if self._gather(len(calls), width) else list(range(slots))
        by_slot = {c.row.slot: c for c in calls}
        widths = [by_slot[s].tokens.shape[1] if s in by_slot else 0 for s in rows]
        offsets = [self.handles[s].n if s in self.handles else 0 for s in rows]
        feed = Feed.build(offsets, widths, self.dtype, self.device, rows if len(rows) < slots else None)
        for layer in self.layers:
            layer.feed = feed
        embeds = calls[0].embeds
        if embeds:
            hidden = calls[0].tokens.shape[-1]
            inputs = torch.zeros((len(rows), width, hidden), dtype=calls[0].tokens.dtype, device=self.device)
        else:
            inputs = torch.zeros((len(rows), width), dtype=torch.long, device=self.device)
        place = {s: i for i, s in enumerate(rows)}
        for c in calls:
            w = c.tokens.shape[1]
            inputs[place[c.row.slot], width - w :] = c.tokens[0]
        keep = max(c.keep for c in calls)
        kwargs = {"inputs_embeds" if embeds else "input_ids": inputs, "attention_mask": feed.mask,
                  "position_ids": feed.write, "cache": self.cache, "use_cache": True}
        if keep:
            kwargs["logits_to_keep"] = keep
        start = self._clock()
        out = self.model(**kwargs)
        self._measured(len(rows) if len(rows) < slots else 0, width, self._clock() - start)
        for layer in self.layers:
            layer.feed = None
        stats = self.batch.stats
        stats.passes[self.name] = stats.passes.get(self.name, 0) + 1
        stats.rows_fed[self.name] = stats.rows_fed.get(self.name, 0) + len(calls)
        stats.rows_computed[self.name] = stats.rows_computed.get(self.name, 0) + len(rows)
        per_width = stats.widths.setdefault(self.name, {})
        per_width[width] = per_width.get(width, 0) + 1
        results = []
        for c in calls:
            c.row.n += c.tokens.shape[1]
            r = place[c.row.slot]
            if c.keep:
                results.append(_Output(logits=out.logits[r : r + 1, keep - c.keep :]))
            else:
                start = width - c.tokens.shape[1]
                results.append(_Output(last_hidden_state=out.last_hidden_state[r : r + 1, start:], batch_slice=(r, start)))
        return results

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _gather(self, n: int, width: int) -> bool:
        """Whether `n` calling rows of `width` tokens should run as a sub-batch: never when every row calls;
        else by the measured seconds of a pass over every row and of a sub-batch of `n` rows at this width
        (each measured once before the choice is made; kept as running means)."""
        if n >= self.batch.slots:
            return False
        full, sub = self._costs.get((0, width)), self._costs.get((n, width))
        if sub is None:
            return True
        if full is None:
            return False
        return sub < full

    def _measured(self, rows: int, width: int, seconds: float) -> None:
        """A pass's seconds into the running mean of its kind (`rows`: 0 over every row, else the sub-batch's)."""
        key = (rows, width)
        old = self._costs.get(key)
        self._costs[key] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def keep_rows(self, rows: list[int]) -> None:
        """Only the slots `rows` stay, renumbered 0.. in that order (rows that left the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in self.layers:
            layer.keep_rows(index)
        handles = {}
        for new, old in enumerate(rows):
            if old in self.handles:
                handle = self.handles[old]
                handle.slot = new
                handles[new] = handle
        self.handles = handles


class _RowModel:
    """What a row's runner calls instead of its model: the call goes to the batch and the row waits."""

    def __init__(self, group: _Group):
        self.group = group

    def __call__(self, input_ids=None, inputs_embeds=None, cache=None, logits_to_keep: int = 0, **_):
        embeds = inputs_embeds is not None
        tokens = inputs_embeds if embeds else input_ids
        return self.group.batch.wait(_Call(self.group, cache, tokens, embeds, int(logits_to_keep)))

    def parameters(self):
        return self.group.model.parameters()


class Batch:
    """The shared side of a batched decode: `slots` rows, the model groups, the scheduler of the rows'
    coroutines. `bind(runner, slot)` makes a row's runner call the batch (`engine.DecodeSession` does it for
    every runner of a batched row before starting them)."""

    def __init__(self, slots: int, capacity: int, lockstep: bool = True):
        self.slots = slots
        self.capacity = capacity
        self.lockstep = lockstep
        self.groups: dict[tuple, _Group] = {}
        self.stats = BatchStats(max_rows=slots)
        self._main = None

    def bind(self, runner: ModelRunner, slot: int) -> None:
        """Route `runner`'s passes through the batch: its model becomes the row's door to the group of runners
        of its name over its module, its cache that group's handle for `slot`."""
        from .reuse import ExitRunner

        if isinstance(runner, ExitRunner):  # the exit head: a norm and an LM-head product on the trunk's rows, per row
            return
        key = (runner.name, id(runner.model))
        if key not in self.groups:
            self.groups[key] = _Group(self, runner.name, runner.model, runner._new_cache())
        group = self.groups[key]
        handle = group.handle(slot)  # renumbered, not replaced, when rows leave the batch (`_shrink`)
        runner.model = _RowModel(group)
        runner._new_cache = handle.reset

    def wait(self, call: _Call):
        """Called from a row: hand the call to the scheduler and pause until its output is ready."""
        import greenlet

        if greenlet.getcurrent() is self._main:
            raise RuntimeError("a batched runner was called outside its row")
        return self._main.switch(call)

    def block_start(self) -> None:
        """Called by a row before each of its blocks: with `lockstep`, the row waits until every running row has
        reached the start of a block, so that the rows draft, verify and escalate together."""
        if self.lockstep:
            self._main.switch(_AT_BLOCK_START)

    def run(self, rows: Callable[[int], Callable | None]) -> None:
        """Run rows until none is left. `rows(slot)` gives the next row's body for a free slot (a callable that
        decodes one prompt to the end), or None when the queue is empty."""
        import greenlet

        self._main = greenlet.getcurrent()
        start = time.perf_counter()
        waiting: dict[int, _Call] = {}
        live: dict[int, greenlet.greenlet] = {}

        def step(slot: int, value=None) -> None:
            """Resume the row in `slot` until it pauses on a call or ends; refill or retire its slot."""
            while True:
                result = live[slot].switch(value) if value is not None else live[slot].switch()
                if result is _AT_BLOCK_START or isinstance(result, _Call):
                    waiting[slot] = result
                    return
                del live[slot]  # the row's decode ended
                body = rows(slot)
                if body is None:
                    return
                live[slot] = greenlet.greenlet(body)
                value = None

        for slot in range(self.slots):
            body = rows(slot)
            if body is None:
                break
            live[slot] = greenlet.greenlet(body)
        for slot in list(live):
            step(slot)
        while waiting:
            if all(c is _AT_BLOCK_START for c in waiting.values()):  # every row at a block's start: all go on
                for slot in list(waiting):
                    del waiting[slot]
                    step(slot, _GO)
                continue
            counts: dict[_Group, int] = {}
            for call in (c for c in waiting.values() if c is not _AT_BLOCK_START):
                counts[call.group] = counts.get(call.group, 0) + 1
            group = max(counts, key=counts.get)  # the model most rows wait for
            slots = [s for s, c in waiting.items() if c is not _AT_BLOCK_START and c.group is group]
            calls = [waiting.pop(s) for s in slots]
            outputs = group.run(calls)
            for slot, output in zip(slots, outputs):
                step(slot, output)
            if len(live) < self.slots and not live.keys() - waiting.keys():
                self._shrink(live, waiting)
        self.stats.wall_time_s += time.perf_counter() - start

    def _shrink(self, live: dict, waiting: dict) -> None:
        """Rows that ended left free slots the queue did not fill: keep only the running rows' slots."""
        keep = sorted(live)
        if len(keep) == self.slots or not keep:
            return
        for group in self.groups.values():
            group.keep_rows(keep)
        remap = {old: new for new, old in enumerate(keep)}
        for d in (live, waiting):
            moved = {remap[s]: v for s, v in d.items()}
            d.clear()
            d.update(moved)
        self.slots = len(keep)


def row_seed(seed: int, index: int) -> int:
    """The sampling seed of the `index`-th prompt of a batch: `seed` for the first, so that one prompt in a
    batch draws what it draws alone."""
    return seed + index

