"""The order in which runs decoded side by side take their turns on a prompt.

Both timed comparisons of the project use it: `viasd bench`'s timed rounds (`benchmark`) and the study's
decode stage (`evaluation.decode_side_by_side`). Each decodes a prompt with every method before any
decodes the next one, so a slow spell of a shared machine falls on all of them alike; the order within
a prompt changes from prompt to prompt so that no method always runs first, or always right after the
same other one (whose decode leaves the caches, the allocator and the CPU's clock in its own state).
"""

from __future__ import annotations


def interleaved(methods: list, round_: int, prompt: int) -> list:
    """The order the methods decode prompt `prompt` in timed round `round_`: row `prompt + round_` of a Williams
    design (a balanced Latin square). Over `n` consecutive prompts (`2n` for an odd number `n` of methods) each
    method runs in each place equally often and directly after each other method equally often, so neither a
    slow spell of the machine nor what the previous decode left in the caches favours one method."""
    n = len(methods)
    if n < 2:
        return list(methods)
    first, lo, hi = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    k = (prompt + round_) % (n if n % 2 == 0 else 2 * n)
    row = [methods[(j + k) % n] for j in first]
    return row if k < n else row[::-1]
