"""Errors a user can cause. Each carries one sentence that names the problem and, where there is
one, the fix. The command line prints the message on one line and exits with status 2."""


class ViasdError(Exception):
    """Base class for every problem caused by input (files, parameters, prompts, models)."""


class ModelLoadError(ViasdError):
    """A model or tokenizer could not be loaded (missing path, unreachable hub, unsupported type)."""


class VocabularyMismatchError(ViasdError):
    """Draft and target do not share a vocabulary, so their token ids mean different things."""


class UnsupportedArchitectureError(ViasdError):
    """The decoder layer stack of a model could not be found by inspection."""


class MaskError(ViasdError):
    """A routing mask is malformed: empty, duplicate or out-of-range layers, unreadable file."""


class PromptError(ViasdError):
    """A prompt is empty or too long for the models' context."""


class PolicyError(ViasdError):
    """A decoding policy has an invalid value (unknown method or rule, negative gamma, ...)."""


class BenchError(ViasdError):
    """The benchmark cannot report a speedup (outputs differ, a method cannot run)."""


class StudyInputError(ViasdError):
    """A stage's input (mask, thresholds, router, decode output) has not been produced yet."""


class ConfigError(ViasdError):
    """params.yaml (or an override file) is malformed."""
