"""DIMR: the routing mask search (docs/method.md (DIMR)).

A mask keeps `k = round(keep_ratio * L)` of the target's `L` decoder layers. Each trial proposes a
score `x_l in [0, 1]` per layer and keeps the `k` highest (ties to the lower index), so every
proposal is feasible: `n_random` trials with uniform scores are uniformly random `k`-subsets, then
`n_bayes` Bayesian-optimisation trials (TPE by default, or GP) start from them. The cost of a mask is
the mean DIMR cost (`path` or `target`) over the calibration positions, from log-probabilities of the
draft and target computed once: a trial is one slim forward pass over the calibration tokens.

The study lives in an Optuna storage (a SQLite file by default): a search killed at any point
continues with the trials it completed (the sampler is reseeded by the number of finished trials,
so a resumed run does not propose the same points again), and a finished search does nothing.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, field

import torch

from ..decoding.slim import RoutingMask, SlimVerifier, evenly_spaced_mask, num_decoder_layers
from ..errors import ViasdError
from .calibration_set import log_probs, window_logits
from .mask_cost import COSTS, position_costs
from .workers import SERIAL, Worker, run_trials

log = logging.getLogger(__name__)
BASELINES = ("random", "truncate", "every_other")


class SearchError(ViasdError):
    """A search cannot run: an impossible budget, an unknown sampler or cost, bad calibration data."""


@dataclass(frozen=True)
class DimrConfig:
    keep_ratio: float = 0.5
    cost: str = "path"
    n_random: int = 20
    n_bayes: int = 40
    sampler: str = "tpe"  # tpe | gp
    seed: int = 0
    batch_size: int = 8
    keep_prefix: int = 0  # every mask keeps layers 0..keep_prefix-1 (shared with the full model: reuse)
    # an encoder-decoder target: the slim also runs only the first round(ratio * encoder depth) encoder layers
    # (at least layer 0); None: it shares the target's whole encoder and its outputs (the default)
    encoder_keep_ratio: float | None = None

    def encoder_keep(self, target) -> tuple[int, ...] | None:
        """The encoder layers every mask of this search keeps (None: the target's whole encoder, shared).
        For a decoder-only target the option does not apply (logged)."""
        if self.encoder_keep_ratio is None:
            return None
        from ..decoding.seq2seq import encoder_depth

        n = encoder_depth(target.config)
        if n is None:
            log.warning("dimr.encoder_keep_ratio applies to encoder-decoder targets; %s has no encoder: ignored",
                        type(target).__name__)
            return None
        return tuple(range(max(1, round(self.encoder_keep_ratio * n))))

    def budget(self, num_layers: int) -> int:
        k = round(self.keep_ratio * num_layers)
        if not 1 <= k < num_layers:
            raise SearchError(
                f"keep_ratio {self.keep_ratio} keeps {k} of {num_layers} layers: no mask meets that budget "
                f"(it must keep at least 1 and fewer than all {num_layers} layers)")
        return k

    def check(self) -> None:
        if self.cost not in COSTS:
            raise SearchError(f"unknown DIMR cost {self.cost!r}; choose one of {', '.join(COSTS)}")
        if self.sampler not in ("tpe", "gp"):
            raise SearchError(f"unknown sampler {self.sampler!r}; choose tpe or gp")
        if self.n_random < 1 or self.n_bayes < 0:
            raise SearchError("n_random must be >= 1 and n_bayes >= 0")
        if self.keep_prefix < 0:
            raise SearchError(f"keep_prefix must be >= 0, got {self.keep_prefix}")
        if self.encoder_keep_ratio is not None and not 0 < self.encoder_keep_ratio <= 1:
            raise SearchError(f"encoder_keep_ratio must be in (0, 1] or null, got {self.encoder_keep_ratio}")

    def check_prefix(self, num_layers: int) -> None:
        k = self.budget(num_layers)
        if self.keep_prefix > k:
            raise SearchError(f"keep_prefix {self.keep_prefix} is more than the {k} layers keep_ratio "
                              f"{self.keep_ratio} keeps of {num_layers}")


@dataclass
class SearchResult:
    keep_layers: list[int]
    cost: float
    num_layers: int
    budget_layers: int
    trials: list[dict] = field(default_factory=list)  # number, phase, keep_layers, cost, seconds
    search_seconds: float = 0.0
    forward_passes: int = 0  # slim forward passes over calibration batches, this run
    reference_seconds: float = 0.0  # computing the draft's and target's log-probabilities once

    def best_random_cost(self) -> float | None:
        costs = [t["cost"] for t in self.trials if t["phase"] == "random"]
        return min(costs) if costs else None


class MaskCost:
    """Mean DIMR cost of masks of one target on one calibration set (reference log-probs cached)."""

    def __init__(self, target, draft, calibration: torch.Tensor, vocab_size: int, kind: str, batch_size: int = 8,
                 encoder_keep: tuple[int, ...] | None = None):
        """`encoder_keep`: an encoder-decoder target's encoder layers every costed slim runs (None: all,
        the target's encoder)."""
        device = next(target.parameters()).device
        self.target, self.kind, self.batch_size = target, kind, batch_size
        self.encoder_keep = encoder_keep
        if encoder_keep is not None:
            from ..decoding.slim import num_encoder_layers

            self.encoder_layers = num_encoder_layers(target)
        self.tokens = calibration.to(device)
        self.vocab_size = vocab_size
        self.num_layers = num_decoder_layers(target)
        start = time.perf_counter()
        self.target_logp = log_probs(lambda ids: window_logits(target, ids), self.tokens,
                                     vocab_size, batch_size)
        self.draft_logp = None
        if kind == "path":
            self.draft_logp = log_probs(lambda ids: window_logits(draft, ids), self.tokens,
                                        vocab_size, batch_size)
        self.reference_seconds = time.perf_counter() - start
        self.passes = 0
        self._seen: dict[tuple, float] = {}

    @torch.inference_mode()
    def __call__(self, mask: RoutingMask) -> float:
        """Mean cost of `mask` (memoised: a mask proposed again costs no forward pass), with this cost's
        encoder layers unless the mask names its own."""
        return self.exact(self.routed(mask))

    def routed(self, mask: RoutingMask) -> RoutingMask:
        """`mask` with the encoder layers every slim of this search runs (unchanged if it names its own,
        or the search shares the target's encoder)."""
        if self.encoder_keep is None or mask.encoder_keep_layers is not None:
            return mask
        return mask.with_encoder(self.encoder_keep, self.encoder_layers)

    @torch.inference_mode()
    def exact(self, mask: RoutingMask) -> float:
        """Mean cost of `mask` as given (its own encoder layers, or the target's whole encoder)."""
        key = (mask.keep_layers, mask.encoder_keep_layers)
        if key in self._seen:
            return self._seen[key]
        slim = SlimVerifier(self.target, mask)
        total, count = 0.0, 0
        for start in range(0, self.tokens.shape[0], self.batch_size):
            batch = self.tokens[start : start + self.batch_size, :-1]
            logits = window_logits(slim.model, batch)[..., : self.vocab_size].float()
            slim_logp = torch.log_softmax(logits, -1).cpu()
            end = start + batch.shape[0]
            draft = self.draft_logp[start:end] if self.draft_logp is not None else None
            costs = position_costs(self.kind, draft, slim_logp, self.target_logp[start:end])
            total += costs.sum().item()
            count += costs.numel()
            self.passes += 1
        self._seen[key] = total / count
        return total / count


def top_k_mask(scores: list[float], k: int) -> list[int]:
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(order[:k])


def _sampler(cfg: DimrConfig, n_done: int, worker: Worker = SERIAL):
    import optuna

    seed = worker.seed(cfg.seed * 1_000_003, n_done)  # reseeded on resume: no repeat of earlier proposals
    if n_done < cfg.n_random:
        return optuna.samplers.RandomSampler(seed=seed)
    if cfg.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=0)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=0, multivariate=True)


def dimr_search(cost: MaskCost, cfg: DimrConfig, storage, study_name: str, progress: bool = True,
                worker: Worker = SERIAL) -> SearchResult | None:
    """Run (or continue) the search stored as `study_name` in `storage`; returns the best mask.

    `worker`: one of several processes sharing the study (`search.workers.run_trials`): it runs trials
    until the storage holds the budget and returns None; the serial run (the default) then picks."""
    import optuna
    from tqdm.auto import tqdm

    cfg.check()
    L = cost.num_layers
    k = cfg.budget(L)
    cfg.check_prefix(L)
    prefix = cfg.keep_prefix
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=study_name, direction="minimize", load_if_exists=True)
    total = cfg.n_random + cfg.n_bayes
    start = time.perf_counter()
    passes_before = cost.passes
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    bar = tqdm(total=total, initial=min(done, total), desc=f"DIMR search ({worker})" if worker.shared else "DIMR search",
               disable=not progress, unit="trial")

    def evaluate(trial) -> float:
        phase = "random" if isinstance(study.sampler, optuna.samplers.RandomSampler) else "bayes"
        # layers 0..prefix-1 are always kept; the search places the other k - prefix among the rest
        scores = [trial.suggest_float(f"layer_{i:03d}", 0.0, 1.0) for i in range(prefix, L)]
        keep = list(range(prefix)) + [prefix + i for i in top_k_mask(scores, k - prefix)]
        t0 = time.perf_counter()
        value = cost(RoutingMask.from_layers(keep, L))
        trial.set_user_attr("keep_layers", keep)
        trial.set_user_attr("phase", phase)
        trial.set_user_attr("seconds", time.perf_counter() - t0)
        return value

    def on_trial(frozen) -> None:
        bar.update(1)
        bar.set_postfix(best=f"{study.best_value:.4f}")

    complete = run_trials(study, storage, total, lambda n: _sampler(cfg, n, worker), evaluate, worker, on_trial)
    bar.close()
    if worker.shared:
        return None
    trials = [{"number": t.number, "phase": t.user_attrs["phase"], "keep_layers": t.user_attrs["keep_layers"],
               "cost": t.value, "seconds": t.user_attrs["seconds"]} for t in complete]
    best = min(trials, key=lambda t: (t["cost"], t["number"]))
    return SearchResult(best["keep_layers"], best["cost"], L, k, trials, time.perf_counter() - start,
                        cost.passes - passes_before, cost.reference_seconds)


def baseline_mask(kind: str, num_layers: int, k: int, seed: int) -> RoutingMask:
    """Ablation masks of the same budget: `random` (seeded), `truncate` (first k layers, the early-exit
    shape), `every_other` (evenly spaced, layer 0 kept)."""
    if kind == "random":
        return RoutingMask.from_layers(sorted(random.Random(seed).sample(range(num_layers), k)), num_layers)
    if kind == "truncate":
        return RoutingMask.from_layers(list(range(k)), num_layers)
    if kind == "every_other":
        return evenly_spaced_mask(num_layers, k)
    raise SearchError(f"unknown baseline mask {kind!r}; choose one of {', '.join(BASELINES)}")


def result_json(result: SearchResult, cfg: DimrConfig, **extra) -> dict:
    return {
        "keep_layers": result.keep_layers, "cost": result.cost, "cost_fn": cfg.cost,
        "num_layers": result.num_layers, "budget_layers": result.budget_layers, "keep_ratio": cfg.keep_ratio,
        "seed": cfg.seed, "trials": len(result.trials), "n_random": cfg.n_random, "n_bayes": cfg.n_bayes,
        "sampler": cfg.sampler, "search_seconds": round(result.search_seconds, 3),
        "reference_seconds": round(result.reference_seconds, 3), "forward_passes": result.forward_passes,
        "best_random_cost": result.best_random_cost(), "config": asdict(cfg), **extra,
    }
