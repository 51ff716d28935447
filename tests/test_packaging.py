"""A non-editable install carries what the stage commands read at run time (the params schema, the
local metric modules), so `pip install .` works outside the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_non_editable_install_validates_params_and_loads_metrics(tmp_path):
    from workflow_helpers import copy_repo

    source = copy_repo(tmp_path / "src")  # what a clone has; the build leaves its build/ there, not in the repo
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, cwd=tmp_path)
    assert (target / "viasd" / "schemas" / "params.schema.yaml").exists()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "params.yaml").write_text((REPO / "params.yaml").read_text())
    code = ("import viasd, json; from viasd.cli import main; "
            "from viasd.metrics.text_metrics import compute; "
            f"assert viasd.__file__.startswith({str(target)!r}), viasd.__file__; "
            "print(json.dumps(compute('edit_sim', ['ab'], ['ab']))); "
            "raise SystemExit(main(['resolve-params', '--params', 'params.yaml']))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], cwd=run_dir, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"edit_sim": 1.0' in out.stdout
    # a bad parameter is still refused by the shipped schema
    (run_dir / "params.yaml").write_text((REPO / "params.yaml").read_text().replace("gamma: 4 ", "gamma: -4 "))
    bad = subprocess.run([sys.executable, "-c", code], cwd=run_dir, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "decode.gamma" in bad.stderr


def test_the_decoding_library_imports_no_tracking_search_or_workflow():
    """`viasd.decoding` is pure: importing every module of it loads no tracking, search, parameter or
    workflow code (checked in a fresh interpreter, so nothing else imported them first)."""
    import pkgutil

    import viasd.decoding

    modules = [m.name for m in pkgutil.walk_packages(viasd.decoding.__path__, "viasd.decoding.")]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'optuna', 'dvc', 'snakemake') or "
            "m.startswith(('viasd.stages', 'viasd.search', 'viasd.study.tracking', 'viasd.config', 'viasd.cli', "
            "'viasd.training', 'viasd.evaluation.side_by_side', 'viasd.bench.timing')))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert len(modules) >= 15 and out.stdout.strip() == ""
