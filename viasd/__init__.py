"""viasd: VIA-SD three-tier speculative decoding with a slim verifier routed out of the target.

Notebook use::

    from viasd import load_models, DecodePolicy, SamplingConfig
    models = load_models("models/target", draft="models/draft", masks=[[0, 2, 4, 6]])
    out = models.generate("def fib(n):", DecodePolicy(method="viasd", gamma=4, max_new_tokens=64))
    print(out.text, out.stats.rejection_rate)
"""

from .decoding.batching import BatchStats
from .decoding.engine import DecodeResult, decode, decode_batch
from .decoding.policy import METHODS, DecodePolicy
from .decoding.sampling import SamplingConfig
from .decoding.slim import RoutingMask, SlimVerifier
from .decoding.stats import DecodeStats
from .errors import ViasdError
from .models import ModelSet, load_model, load_models, load_tokenizer

__all__ = [
    "BatchStats",
    "DecodePolicy",
    "DecodeResult",
    "DecodeStats",
    "METHODS",
    "ModelSet",
    "RoutingMask",
    "SamplingConfig",
    "SlimVerifier",
    "ViasdError",
    "decode",
    "decode_batch",
    "load_model",
    "load_models",
    "load_study_run",
    "load_tokenizer",
]


def __getattr__(name: str):
    """`load_study_run` (a finished study's run: its models and policy) is imported on first use: it reads the
    study's parameter file, which the decoding library itself never needs."""
    if name == "load_study_run":
        from .study.cells import load_study_run

        return load_study_run
    raise AttributeError(f"module 'viasd' has no attribute {name!r}")


# Modules that moved when the package was laid out by concept (README, "Layout"): importing an old path still
# works for now, with a DeprecationWarning naming the new one.
MOVED_MODULES = {
    "viasd.benchmark": "viasd.bench.timing",
    "viasd.bench_outputs": "viasd.bench.outputs",
    "viasd.bench_figures": "viasd.bench.figures",
    "viasd.stages.bench_stage": "viasd.bench.command",
    "viasd.run_order": "viasd.evaluation.run_order",
    "viasd.report_headroom": "viasd.report.headroom",
    "viasd.report_plots": "viasd.report.plots",
    "viasd.runs": "viasd.study.runs",
    "viasd.tracking": "viasd.study.tracking",
    "viasd.stages.decode_stage": "viasd.stages.decode",
    "viasd.stages.dimr_stage": "viasd.stages.dimr_search",
    "viasd.stages.evaluate_stage": "viasd.stages.evaluate",
    "viasd.stages.report_stage": "viasd.stages.report",
    "viasd.stages.router_stage": "viasd.stages.train_router",
    "viasd.stages.thresholds_stage": "viasd.stages.tune_thresholds",
    "viasd.decoding.routing": "viasd.decoding.slim",
    "viasd.decoding.router": "viasd.decoding.tier_router",
    "viasd.training.router": "viasd.training.tier_router",
    "viasd.search.calibration": "viasd.search.calibration_set",
    "viasd.search.wall_calibration": "viasd.search.wall_factors",
    "viasd.search.cost": "viasd.search.mask_cost",
}


class _MovedModuleFinder:
    """Resolves an old module path to its new module (the same module object), with a DeprecationWarning."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        import importlib.util

        new = MOVED_MODULES.get(name)
        if new is None:
            return None
        return importlib.util.spec_from_loader(name, _MovedModuleFinder(), origin=new)

    @staticmethod
    def create_module(spec):
        import importlib
        import warnings

        warnings.warn(f"{spec.name} moved to {spec.origin}; import it from there", DeprecationWarning, stacklevel=3)
        return importlib.import_module(spec.origin)

    @staticmethod
    def exec_module(module):
        return None


def _install_moved_module_finder() -> None:
    import sys

    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


_install_moved_module_finder()
