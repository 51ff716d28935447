"""VIA-SD from transformers' own `generate`: `model.generate(..., custom_generate=viasd.hf.generate)` and the
repository's `custom_generate/` folder (`custom_generate="<path>", trust_remote_code=True`) run every method of
the engine with the call's generation config, and return our statistics on the output."""

from .generate import ViasdGenerateOutput, generate

__all__ = ["ViasdGenerateOutput", "generate"]
