"""Each pair of a finished study as one MLflow model (a `pyfunc`), registered under `viasd-<study>-<pair>`, so a user
loads it by name and decodes as the study did: `mlflow.pyfunc.load_model("models:/viasd-default-default/latest")
.predict(pd.DataFrame({"prompt": [...], "task": [...]}))`.

The model holds what the tuned VIA-SD run of each task decodes with: the pair's target and draft (their directories
for the trained family; a hub pair's ids, which are loaded from the hub), the DIMR slim's routing mask, the learned
router and, per task, the tuned `DecodePolicy` (its thresholds, block length, stop strings). `predict` takes prompts
(a list of strings, or a DataFrame with `prompt` and optionally `task`; `params={"task": ..., "max_new_tokens": ...}`)
and returns a DataFrame: `text`, `token_ids`, `new_tokens`, `acceptance_rate`, `rejection_rate`. It is logged by the
report stage's run (the study's last), beside its tables.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import mlflow

from ..config import Params
from .cells import GridCell, study_policy

log = logging.getLogger(__name__)

RUN = "viasd"  # the tuned run each task's policy is taken from


def registered_name(params: Params, pair: str) -> str:
    return f"viasd-{params.study.name}-{pair}"


class ViasdModel(mlflow.pyfunc.PythonModel):
    """The pyfunc: loads the pair once (`load_context`), decodes prompts with each task's tuned policy."""

    def load_context(self, context) -> None:
        from ..decoding.policy import DecodePolicy
        from ..decoding.slim import RoutingMask, num_decoder_layers
        from ..models import load_models
        from ..training.tier_router import load_router

        config = context.model_config or {}
        artifacts = context.artifacts
        target = artifacts.get("target") or config["target"]
        draft = artifacts.get("draft") or config.get("draft")
        self.models = load_models(target, draft=draft, device=config.get("device", "auto"), dtype=config.get("dtype", "auto"))
        if "mask" in artifacts:
            self.models.add_mask(RoutingMask.from_json(artifacts["mask"], num_decoder_layers(self.models.target)))
        if "router" in artifacts:
            self.models.router = load_router(artifacts["router"])
        records = json.loads(Path(artifacts["policies"]).read_text())
        self.policies = {task: DecodePolicy.from_record(record) for task, record in records.items()}
        self.default_task = config.get("task") or next(iter(self.policies))

    def predict(self, context, model_input, params: dict | None = None):
        from dataclasses import replace

        import pandas as pd

        from ..errors import PolicyError

        params = params or {}
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame({"prompt": list(model_input)})
        if "prompt" not in frame.columns:
            raise PolicyError("the model's input needs a `prompt` column (or a list of prompt strings)")
        tasks = frame["task"] if "task" in frame.columns else [params.get("task") or self.default_task] * len(frame)
        rows = []
        for prompt, task in zip(frame["prompt"], tasks):
            if task not in self.policies:
                raise PolicyError(f"task {task!r} has no tuned policy in this model (tasks: {', '.join(self.policies)})")
            policy = self.policies[task]
            if params.get("max_new_tokens"):
                policy = replace(policy, max_new_tokens=int(params["max_new_tokens"]))
            result = self.models.generate(prompt, policy)
            rows.append({"text": result.text, "token_ids": result.token_ids, "new_tokens": result.stats.new_tokens,
                         "acceptance_rate": result.stats.acceptance_rate, "rejection_rate": result.stats.rejection_rate})
        return pd.DataFrame(rows)


def log_pair_model(params: Params, pair_name: str, run_id: str, tracking_uri: str) -> str:
    """Log the pair's model into the run `run_id` (artifact path `model-<pair>`) and register it; returns the
    model's URI (`models:/<name>/<version>`)."""
    from mlflow.models import infer_signature

    pair = params.pair(pair_name)
    policies, masks, router = {}, None, None
    for task in params.study.tasks:
        cell = GridCell.of(params, pair.name, task, RUN)
        policies[task] = study_policy(cell).as_record()
        masks = masks or cell.inputs.get("mask")
        if cell.policy().router == "learned":
            from .paths import router_paths

            router = router_paths(params, pair.name)["router"]
    with tempfile.TemporaryDirectory() as tmp:
        policy_file = Path(tmp) / "policies.json"
        policy_file.write_text(json.dumps(policies, indent=1))
        artifacts = {"policies": str(policy_file)}
        config = {"task": params.study.tasks[0], "dtype": pair.dtype}
        if pair.trained:
            artifacts.update(target=pair.target, draft=pair.draft)
        else:
            config.update(target=pair.target, draft=pair.draft)
        if masks is not None:
            artifacts["mask"] = str(masks)
        if router is not None:
            artifacts["router"] = str(router)
        import pandas as pd

        example = pd.DataFrame({"prompt": ["def f(x):"], "task": [params.study.tasks[0]]})
        output = pd.DataFrame({"text": ["..."], "token_ids": [[0]], "new_tokens": [1], "acceptance_rate": [0.5],
                               "rejection_rate": [0.5]})
        mlflow.set_tracking_uri(tracking_uri)
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name=f"model-{pair.name}", python_model=ViasdModel(), artifacts=artifacts, model_config=config,
                signature=infer_signature(example, output, params={"task": params.study.tasks[0], "max_new_tokens": 0}),
                input_example=example,
                pip_requirements=["viasd", "torch", "transformers", "pandas"],
                registered_model_name=registered_name(params, pair.name))
    return f"models:/{registered_name(params, pair.name)}/{info.registered_model_version}"
