"""Quality metrics. Text metrics go through `evaluate` with local metric modules (the hub's cannot be
fetched offline); model-based ones (agreement with the target's greedy output, target NLL) need the
models and live in `model_metrics`."""
