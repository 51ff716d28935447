"""One module per decoding method; each exposes `block(session)` (docs/method.md (methods and ablations))."""

from . import ar, cascade_sd, sd, spec_cascade, viasd

BLOCKS = {
    "ar": ar.block,
    "sd": sd.block,
    "cascade_sd": cascade_sd.block,
    "spec_cascade": spec_cascade.block,
    "viasd": viasd.block,
}
