"""One module per decoding method, each a `base.Method` (docs/method.md, "Methods and ablations"): `ar`, `sd`,
`self_sd`, `cascade_sd`, `spec_cascade`, `viasd`. `base` says what a method is and the session surface it may use."""

from . import ar, cascade_sd, sd, self_sd, spec_cascade, viasd
from .base import Method, MethodInputs, Session

METHODS: dict[str, Method] = {m.name: m for m in (ar.METHOD, sd.METHOD, self_sd.METHOD, cascade_sd.METHOD,
                                                  spec_cascade.METHOD, viasd.METHOD)}

__all__ = ["METHODS", "Method", "MethodInputs", "Session"]
