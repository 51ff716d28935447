"""Tree drafting: the drafter proposes a tree of continuations and the full model verifies every branch in one
pass (SpecInfer, [Miao et al. 2024](https://arxiv.org/abs/2305.09781); EAGLE-2's dynamic tree,
[Li et al. 2024](https://arxiv.org/abs/2406.16858)). `sd` drafts a tree when `DecodePolicy.tree_nodes > 0`.

Notation: the *root* is the last committed token `x_{L-1}` (fed to no model yet, the session's invariant); a
node `j` is a draft token at depth `d_j >= 1` below its parent (`-1`: the root), at sequence position
`L - 1 + d_j`. `p_v` is the drafter's distribution after node `v` (its children were drawn from it), `q_v` the
full model's.

**Which tree.** Greedy decoding takes EAGLE-2's dynamic tree: at each depth the `tree_top_k` nodes of the
highest cumulative draft log-probability `sum log p` along their path are expanded into their `tree_top_k`
most likely children, one drafter pass per depth over the expanded nodes; of all candidates the `tree_nodes`
of the highest cumulative log-probability are verified (a child never scores above its parent, so the kept
set is a tree). Sampling takes a tree whose shape does not depend on the drawn tokens, as the lossless
multi-draft test below requires: every node of the *spine* gets `tree_top_k` children drawn i.i.d. from
`p_v`, and the first of them continues the spine (one drafter pass per depth over one node); the first
`tree_nodes` candidates in depth order are verified. `tree_top_k = 1` is chain drafting, token for token.

**One verification pass.** The full model is fed the root and every node at once. Each node attends to the
committed prefix, the root and its own ancestors (a 4-D attention mask; position ids by depth), so its logits
are exactly those the model gives the node's path as a sequence. The drafter's tree passes use the same masks
over its own cache, which is cut back to the committed prefix after the tree is drafted.

**Acceptance** (greedy): from the root, step to the child whose token is `argmax q_v`, while there is one;
the emitted token after the last accepted node is `argmax q_v` there. (Sampling) SpecInfer's multi-step
speculative sampling: at node `v` with children `c_1..c_k` drawn i.i.d. from `p_v`, let `r = q_v`; for each
`c_i` in order accept with probability `min(1, r(c_i) / p_v(c_i))`, else `r <- norm(max(0, r - p_v))`; after
the first acceptance continue at that child, and when none is accepted (or the node has no children) draw
the emitted token from `r`. Each emitted token is exactly `q`-distributed (SpecInfer, Theorem 4.2), so the
output has the full model's distribution.

**Committing.** The accepted path's K/V move to the slots after the committed prefix (`keep_new_slots`; the
rest is dropped), so every cache again holds a plain sequence, and the method commits as chain `sd` does.
Pure library code: tensors in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicLayer

from ..errors import PolicyError
from .feature_drafter import FeatureDraftRunner
from .kv_cache import DroppedLayer, InPlaceLayer, cache_parts
from .reuse import RestRunner
from .runner import ModelRunner
from .sampling import Sampler, residual

ROOT = -1


@dataclass
class DraftTree:
    """Drafted nodes in creation order (a parent always before its children). `tokens[j]`, `parents[j]`
    (`ROOT` for depth 1), `depths[j]`; `children[v]`: node `v`'s children in drawing order (`v = ROOT`: the
    depth-1 nodes); `proposals[v]`: `p_v` `[V]`, the distribution node `v`'s children were drawn from
    (sampling only)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    children: dict[int, list[int]] = field(default_factory=dict)
    proposals: dict[int, torch.Tensor] = field(default_factory=dict)
    paths: list[tuple[int, ...]] = field(default_factory=list)  # each node's path from depth 1, itself last

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        self.children.setdefault(parent, []).append(node)
        self.paths.append((node,) if parent == ROOT else (*self.paths[parent], node))
        return node

    def path(self, node: int) -> list[int]:
        """The nodes from depth 1 down to `node`."""
        return list(self.paths[node]) if node != ROOT else []

    def subtree(self, keep: list[int]) -> tuple[DraftTree, list[int]]:
        """The tree of the nodes `keep` (a set closed under parents), renumbered in creation order; with the
        old index of each new node."""
        order = sorted(keep)
        new_of = {old: i for i, old in enumerate(order)}
        tree = DraftTree()
        for old in order:
            parent = self.parents[old]
            tree.add(self.tokens[old], ROOT if parent == ROOT else new_of[parent])
        tree.proposals = {(ROOT if v == ROOT else new_of[v]): p for v, p in self.proposals.items()
                          if v == ROOT or v in new_of}
        return tree, order


def allowed_mask(tree: DraftTree, fed: list[int], new: list[int], chain: int = 0) -> torch.Tensor:
    """Which slots after the committed prefix each row of a pass may read: `[chain + len(new), chain + len(fed)
    + len(new)]` bool. The pass feeds `chain` sequence tokens (the root last; causal among them) and then the
    nodes `new`; the cache already holds the nodes `fed` (in that order) after the prefix. A node reads the chain,
    its ancestors and itself."""
    width = chain + len(new)
    slots = chain + len(fed) + len(new)
    allowed = torch.zeros((width, slots), dtype=torch.bool)
    allowed[:chain, :chain] = torch.tril(torch.ones((chain, chain), dtype=torch.bool))
    slot_of = {node: chain + i for i, node in enumerate([*fed, *new])}
    for row, node in enumerate(new, start=chain):
        allowed[row, :chain] = True
        for a in tree.paths[node]:
            if a in slot_of:
                allowed[row, slot_of[a]] = True
    return allowed


def additive_mask(prefix: int, allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """The 4-D mask `[1, 1, W, prefix + S]` a model adds to its attention scores: 0 over the committed prefix
    and the `allowed` `[W, S]` slots after it, the dtype's minimum elsewhere."""
    width, slots = allowed.shape
    full = torch.ones((width, prefix + slots), dtype=torch.bool)
    full[:, prefix:] = allowed
    mask = torch.zeros(full.shape, dtype=dtype)
    mask.masked_fill_(~full, torch.finfo(dtype).min)
    return mask[None, None].to(device)


@torch.inference_mode()
def keep_new_slots(cache, start: int, keep: list[int]) -> None:
    """Of the slots from `start` on, keep those at offsets `keep` (increasing), moved to `start, start+1, ...`;
    drop the rest. Every kept layer of the cache (its self-attention part) in place."""
    for layer in cache_parts(cache)[0].layers:
        if isinstance(layer, DroppedLayer) or not layer.is_initialized:
            continue
        index = torch.tensor(keep, dtype=torch.long, device=layer.keys.device) + start
        end = start + len(keep)
        if isinstance(layer, InPlaceLayer):
            layer._k[..., start:end, :] = layer._k.index_select(2, index)
            layer._v[..., start:end, :] = layer._v.index_select(2, index)
            layer.n = end
            layer._views()
        elif type(layer) is DynamicLayer:
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(2, index)], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(2, index)], dim=-2)
        else:
            raise PolicyError(f"tree drafting needs full-attention layers with an in-place or dynamic cache, not "
                              f"{type(layer).__name__}")


def check_tree_runners(draft, target, text_draft, batch) -> None:
    """One clear error where tree drafting cannot run: it needs a drafter model (not a draft of another
    tokenizer), one prompt at a time, and caches it can compact (in-place or dynamic, full attention)."""
    if text_draft is not None or draft is None:
        raise PolicyError("tree drafting needs a draft model, a feature drafter or a self-drafter of the target's "
                          "tokenizer; a draft of another tokenizer drafts a chain (set tree_nodes: 0)")
    if batch is not None:
        raise PolicyError("tree drafting decodes one prompt at a time; decode a batch with chain drafting "
                          "(tree_nodes: 0)")
    runners = [draft, target, *([target.trunk] if isinstance(target, RestRunner) else [])]
    for r in runners:
        cache = r._new_cache() if r.cache is None else r.cache
        if hasattr(cache, "self_attention_cache"):
            raise PolicyError("tree drafting is implemented for decoder-only models; decode an encoder-decoder "
                              "pair with chain drafting (tree_nodes: 0)")
        for layer in cache_parts(cache)[0].layers:
            if not isinstance(layer, (DroppedLayer, InPlaceLayer)) and type(layer) is not DynamicLayer:
                raise PolicyError(f"tree drafting needs full-attention layers with an in-place or dynamic cache; "
                                  f"the {r.name} has {type(layer).__name__} (sliding-window or static)")


def _node_ids(ids: torch.Tensor, length: int, tree: DraftTree, node: int) -> torch.Tensor:
    """A copy of the session's ids with node `node`'s path written after the committed `length` tokens."""
    out = ids.clone()
    path = tree.path(node)
    out[0, length : length + len(path)] = torch.tensor([tree.tokens[a] for a in path], device=ids.device)
    return out


def _processed(runner: ModelRunner, ids: torch.Tensor, length: int, tree: DraftTree, nodes: list[int],
               logits: torch.Tensor) -> torch.Tensor:
    """Node rows `[n, V]` through the generation config's processors, each with its own path as the prefix."""
    if runner.processors is None:
        return logits
    rows = [runner.processors(_node_ids(ids, length, tree, v), length + tree.depths[v], logits[i : i + 1])
            for i, v in enumerate(nodes)]
    return torch.cat(rows)


class _Drafting:
    """The drafter's side of one tree: it feeds nodes to expand over its cache (which holds the committed
    prefix, then the nodes fed so far) and gives their logits; `close` cuts the cache back to the prefix."""

    def __init__(self, runner: ModelRunner, ids: torch.Tensor, length: int, tree: DraftTree):
        self.runner, self.ids, self.length, self.tree = runner, ids, length, tree
        self.fed: list[int] = []
        self.feature = isinstance(runner, FeatureDraftRunner)
        self.prefix = runner.positions if self.feature else runner.cached
        self.g: dict[int, torch.Tensor] = {}  # a feature drafter's outputs `[H]` per fed node

    @torch.inference_mode()
    def expand(self, nodes: list[int]) -> torch.Tensor:
        """Feed `nodes` (their ancestors fed before) in one pass; their logits `[n, V]` (float32, processed)."""
        r, tree = self.runner, self.tree
        allowed = allowed_mask(tree, self.fed, nodes)
        tokens = torch.tensor([[tree.tokens[v] for v in nodes]], device=r.device)
        # a node at depth d sits at sequence position L-1+d; a feature drafter's position t reads x_{t+1}
        offset = self.length - 2 if self.feature else self.length - 1
        positions = torch.tensor([[offset + tree.depths[v] for v in nodes]], device=r.device)
        dtype = next(r.model.parameters()).dtype
        mask = additive_mask(self.prefix, allowed, dtype, r.device)
        with r.timed(len(nodes)):
            if self.feature:
                parents = torch.stack([r.g[0, -1] if tree.parents[v] == ROOT else self.g[tree.parents[v]]
                                       for v in nodes])[None]
                u = r.drafter.inputs(parents, tokens, own=True)
                g = r.model(inputs_embeds=u, position_ids=positions, attention_mask=mask, cache=r.cache,
                            use_cache=True).last_hidden_state
                self.g.update({v: g[0, i] for i, v in enumerate(nodes)})
                logits = r.drafter.head(g[0])[:, : r.vocab_size].float()
            else:
                out = r.model(input_ids=tokens, position_ids=positions, attention_mask=mask, cache=r.cache,
                              use_cache=True)
                logits = out.logits[0, :, : r.vocab_size].float()
        r.tokens += len(nodes)
        self.fed.extend(nodes)
        return _processed(r, self.ids, self.length, tree, nodes, logits)

    def close(self, path: list[int]) -> None:
        """The accepted `path` (nodes of the full tree) is known: a draft model keeps the K/V of the path's nodes it
        was fed (they are its cache for that sequence, as a chain draft keeps its accepted tokens'); a feature
        drafter drops every node (fed its own outputs, not the trunk's features: its next block re-reads them)."""
        if not self.fed:
            return
        if self.feature:
            self.runner.cache.crop(-len(self.fed))
            return
        slot = {v: i for i, v in enumerate(self.fed)}
        keep = [slot[v] for v in path if v in slot]
        keep_new_slots(self.runner.cache, self.prefix, keep)
        self.runner.cached = self.prefix + len(keep)


class Drafted:
    """A drafted tree and the drafter's state after it: `tree` (the nodes kept for verification) and `close(path)`,
    which settles the drafter's cache once the verification accepted `path` (nodes of `tree`)."""

    def __init__(self, tree: DraftTree, drafting: _Drafting, old: list[int] | None = None):
        self.tree, self._drafting, self._old = tree, drafting, old

    def close(self, path: list[int]) -> None:
        self._drafting.close(path if self._old is None else [self._old[v] for v in path])


def draft_tree(runner: ModelRunner, ids: torch.Tensor, length: int, depth: int, top_k: int, nodes: int,
               sampler: Sampler) -> Drafted:
    """Draft a tree of at most `depth` levels and `nodes` nodes after the committed `ids[0, :length]` (see the
    module docstring for its shape). The drafter's cache holds the nodes it expanded until `Drafted.close`."""
    tree = DraftTree()
    root = runner.forward(ids, length, 1)[0]  # the drafter catches up the committed tokens: p_root
    drafting = _Drafting(runner, ids, length, tree)
    if drafting.feature and runner.g is None:  # a one-token prompt: no drafter output to draft deeper from
        depth = 1
    score: dict[int, float] = {}
    frontier, rows = [ROOT], root[None]
    for d in range(1, depth + 1):
        born = []
        if sampler.greedy:  # every frontier row's top-k children at once (one host sync per depth)
            top = torch.topk(torch.log_softmax(rows, dim=-1), top_k)
            for v, lps, tokens in zip(frontier, top.values.tolist(), top.indices.tolist()):
                for lp, token in zip(lps, tokens):
                    child = tree.add(token, v)
                    score[child] = score.get(v, 0.0) + lp
                    born.append(child)
        else:  # `top_k` children of each frontier node drawn i.i.d. from its p_v
            for v, logits in zip(frontier, rows):
                p = sampler.probs(logits)
                tree.proposals[v] = p
                drawn = torch.multinomial(p, top_k, replacement=True, generator=sampler.generator)
                born.extend(tree.add(token, v) for token in drawn.tolist())
        if d == depth:
            break
        if sampler.greedy:
            frontier = sorted(born, key=lambda c: (-score[c], c))[:top_k]
        else:
            frontier = born[:1]  # the spine: the first child drawn
        rows = drafting.expand(frontier)
    if len(tree) <= nodes:
        return Drafted(tree, drafting)
    if sampler.greedy:
        keep = sorted(range(len(tree)), key=lambda c: (-score[c], c))[:nodes]
    else:
        keep = list(range(nodes))  # creation order: depth by depth, value-independent
    kept, old = tree.subtree(keep)
    return Drafted(kept, drafting, old)


def accept(tree: DraftTree, logits: torch.Tensor, sampler: Sampler) -> tuple[list[int], int]:
    """Walk the verified tree from the root (module docstring): the accepted nodes (a path) and the emitted
    token. `logits` `[1 + m, V]`: the full model's after the root (row 0) and after each node `j` (row `1 + j`)."""
    path, v = [], ROOT
    greedy = logits.argmax(-1).tolist() if sampler.greedy else None  # one host sync for the whole walk
    while True:
        kids = tree.children.get(v, [])
        if sampler.greedy:
            best = greedy[v + 1]
            nxt = next((c for c in kids if tree.tokens[c] == best), None)
            if nxt is None:
                return path, best
        else:
            r, nxt = sampler.probs(logits[v + 1]), None
            if kids:
                p = tree.proposals[v]
                u = sampler.uniform(len(kids), p.device)
                for i, c in enumerate(kids):
                    x = tree.tokens[c]
                    if u[i] * p[x] < r[x]:  # u < min(1, r(x) / p(x)) without dividing
                        nxt = c
                        break
                    r = residual(r, p)
            if nxt is None:
                return path, int(sampler.sample(r))
        path.append(nxt)
        v = nxt


@dataclass
class Verified:
    """The full model's pass over a tree: `logits` `[1 + m, V]` (row 0 after the root, row `1 + j` after node
    `j`, processed; what `accept` walks); with a trunk of its own, the trunk's outputs at the nodes, `hidden` `[1, m, H]` and the
    feature drafter's `features` `[1, m, F*H]` (None without one)."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None
    features: torch.Tensor | None = None


def _chain_and_nodes(runner: ModelRunner, length: int, tree: DraftTree, dtype) -> tuple[int, dict]:
    """What `runner` reads in the verification pass: the committed tokens it has not seen (`c`, the root last),
    then every node; the position ids and the mask of that pass."""
    device = runner.device
    c = length - runner.cached
    positions = [*range(runner.cached, length), *(length - 1 + d for d in tree.depths)]
    mask = additive_mask(runner.cached, allowed_mask(tree, [], list(range(len(tree))), c), dtype, device)
    return c, {"position_ids": torch.tensor([positions], device=device), "attention_mask": mask,
               "cache": runner.cache, "use_cache": True}


@torch.inference_mode()
def verify_tree(target, ids: torch.Tensor, length: int, tree: DraftTree) -> Verified:
    """One pass of the full model over the root and every node (with a trunk of its own, `RestRunner`: the trunk's
    pass, then the rest's). The caches then hold the chain and every node; `commit_path` keeps the accepted ones."""
    m = len(tree)
    tokens = torch.tensor([tree.tokens], device=ids.device)
    hidden = features = None
    if isinstance(target, RestRunner):
        trunk = target.trunk
        c, kwargs = _chain_and_nodes(trunk, length, tree, trunk.hidden.dtype)
        with trunk.timed(c + m), trunk.capturing():
            out = trunk.model(input_ids=torch.cat([ids[:, trunk.cached : length], tokens], dim=1), **kwargs)
        trunk.tokens += c + m
        trunk.hidden[:, trunk.cached : length] = out.last_hidden_state[:, :c]
        hidden = out.last_hidden_state[:, c:]
        if trunk.capture is not None:
            taken = trunk.capture.take()
            trunk.features[:, trunk.cached : length] = taken[:, :c]
            features = taken[:, c:]
        trunk.cached = length  # the chain is in its buffers now; the nodes wait for `commit_path`
        inputs = {"inputs_embeds": torch.cat([trunk.hidden[:, target.cached : length], hidden], dim=1)}
    else:
        inputs = {"input_ids": torch.cat([ids[:, target.cached : length], tokens], dim=1)}
    c, kwargs = _chain_and_nodes(target, length, tree, next(target.model.parameters()).dtype)
    with target.timed(c + m):
        out = target.model(**inputs, **kwargs)
        logits = out.logits[0, c - 1 :, : target.vocab_size].float()
    target.tokens += c + m
    root = target.process(ids, length, logits[:1])
    return Verified(torch.cat([root, _processed(target, ids, length, tree, list(range(m)), logits[1:])]),
                    hidden, features)


@torch.inference_mode()
def commit_path(target, ids: torch.Tensor, length: int, tree: DraftTree, path: list[int], verified: Verified) -> None:
    """Write the accepted path's tokens after the committed prefix and keep only their K/V (and, with a trunk, their
    hidden states and features): every cache then holds the sequence up to the last accepted node."""
    n = len(path)
    if n:
        ids[0, length : length + n] = torch.tensor([tree.tokens[v] for v in path], device=ids.device)
    runners = [target]
    if isinstance(target, RestRunner):
        trunk = target.trunk
        runners.append(trunk)
        index = torch.tensor(path, dtype=torch.long, device=ids.device)
        trunk.hidden[:, length : length + n] = verified.hidden.index_select(1, index)
        if verified.features is not None:
            trunk.features[:, length : length + n] = verified.features.index_select(1, index)
    for r in runners:
        keep_new_slots(r.cache, length, path)
        r.cached = length + n
