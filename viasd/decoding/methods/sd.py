"""`sd`: two-tier speculative decoding, draft -> target (docs/method.md (speculative decoding)), lossless.
A block drafts a chain of `gamma` tokens, or with `policy.tree_nodes` a tree verified in one pass (`draft_tree.py`)."""

from __future__ import annotations

from ..acceptance import lossless
from ..draft_tree import accept, check_tree_runners, commit_path, draft_tree, verify_tree
from .base import Method, MethodInputs, Session


def set_up(s: Session, inputs: MethodInputs) -> None:
    if s.policy.tree_nodes:
        check_tree_runners(s.draft, s.target, s.text_draft, s.batch)


def block(s: Session, state: None) -> None:
    if s.policy.tree_nodes:
        tree_block(s)
    else:
        verify(s, *s.draft_tokens(s.block_size()))


def tree_block(s: Session) -> None:
    """Draft a tree `gamma` deep, verify every node in one full pass, commit the accepted path and the emitted token."""
    policy = s.policy
    drafted = draft_tree(s.draft, s.ids, s.length, s.block_size(), policy.tree_top_k, policy.tree_nodes, s.sampler)
    tree = drafted.tree
    verified = verify_tree(s.target, s.ids, s.length, tree)
    path, token = accept(tree, verified.logits, s.sampler)
    drafted.close(path)
    commit_path(s.target, s.ids, s.length, tree, path, verified)
    s.stats.blocks += 1
    s.stats.drafted += len(tree)
    s.stats.record_tree_verification(len(tree), len(path), leaf=not tree.children.get(path[-1] if path else -1))
    s.commit(len(path), token)


def verify(s: Session, x, p_logits) -> None:
    """The full model settles a drafted block `x` `[g]` (drafter logits `[g, V]`) by the lossless test and commits.
    `g` may be under `gamma`: a draft with another tokenizer or a dynamic draft length proposes fewer, even none."""
    g = len(x)
    p = None if s.sampler.greedy else s.sampler.probs(p_logits)
    q_logits = s.target.forward(s.ids, s.length + g, g + 1)  # rows: q_1..q_g, q_{g+1}
    n, token = lossless(x, p, q_logits, s.sampler)
    s.stats.blocks += 1
    s.stats.drafted += g
    s.stats.record_full_verification(g, n)
    s.commit(n, token)


METHOD = Method("sd", block, set_up=set_up, text_draft=True)
