"""The study layer, between the stage commands (`viasd.stages`, `viasd.cli`) and the libraries below
(`viasd.decoding`, `viasd.search`, `viasd.training`, `viasd.evaluation`): where the parameters of one
grid cell (pair, task, run) become its files (`paths`), its slim verifier and models (`slims`) and its
decoding policy (`cells`). Stage modules import this layer and the libraries, never each other
(`tests/test_layers.py` keeps it so)."""
