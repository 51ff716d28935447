"""VIA-SD as a transformers `custom_generate` recipe.

    model.generate(**inputs, custom_generate="<this repository>", trust_remote_code=True,
                   assistant_model=draft, viasd_policy=policy, max_new_tokens=64)

transformers loads this file and calls `generate(model=..., **the arguments of generate)`; everything happens in the
installed `viasd` package (`viasd.hf.generate`, whose docstring lists what it takes and returns).
"""

from viasd.hf import generate as viasd_generate


def generate(model, **kwargs):
    """transformers' entry point: VIA-SD (or a baseline) in place of `generate`'s decoding loop."""
    return viasd_generate(model, **kwargs)
