"""Helpers of the workflow tests: a copy of the repository in a temp dir, the real tools run on it,
and both DAGs (Snakemake's dry run, DVC's stage index) read into one comparable shape."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("MLFLOW_TRACKING_URI", None)  # the study's default store: mlflow.db beside params.yaml
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def copy_repo(dest: Path) -> Path:
    """The repository's tracked and not-ignored files, as a fresh git repository (what a clone has)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    run(["git", "init", "-q"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"], dest)
    return dest


def run(cmd: list[str], cwd: Path, check: bool = True, timeout: float = 900, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env or tool_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def snakemake(cwd: Path, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    return run([str(BIN / "snakemake"), *args], cwd, check=check, timeout=timeout)


def viasd_command(shell: str) -> str:
    """`viasd <stage> <args>` of a rule's or stage's command, without the parameter-file options (both
    tools read the same parameters) and without environment settings and redirections."""
    words = shlex.split(shell.split(">")[0])
    words = words[words.index("viasd"):]
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--params", "--config"):
            skip = True
        else:
            out.append(word)
    return " ".join(out)


def snakemake_jobs(cwd: Path, extra: list[str] = ()) -> dict[str, dict]:
    """The jobs of a dry run of `all`, keyed by viasd command: rule, inputs, outputs."""
    proc = run([str(BIN / "snakemake"), "--dry-run", "--printshellcmds", "--forceall", "all", *extra], cwd)
    jobs, current = {}, None
    for line in proc.stdout.splitlines():
        head = re.match(r"^(local)?rule (\w+):$", line)
        if head:
            current = {"rule": head.group(2), "inputs": set(), "outputs": set()}
            continue
        if current is None:
            continue
        field = re.match(r"^\s+(input|output|benchmark|wildcards): (.*)$", line)
        if field and field.group(1) in ("input", "output"):
            current["inputs" if field.group(1) == "input" else "outputs"] = {p.strip() for p in field.group(2).split(",")}
        elif field and field.group(1) == "benchmark":
            current["benchmark"] = field.group(2).strip()
        elif field:
            current["wildcards"] = dict(w.strip().split("=", 1) for w in field.group(2).split(","))
        elif line.startswith("Shell command:") and "viasd " in line:
            jobs[viasd_command(line.split(":", 1)[1])] = current
            current = None
    return jobs


def dvc_stages(cwd: Path) -> dict[str, dict]:
    """dvc.yaml's stages (foreach/matrix expanded by DVC itself), keyed by viasd command."""
    code = ("import json; from dvc.repo import Repo; from dvc.dependency.param import ParamsDependency as P; "
            "r = Repo('.'); print(json.dumps([{'name': s.addressing, 'cmd': s.cmd, "
            "'deps': [str(d.def_path) for d in s.deps if not isinstance(d, P)], "
            "'outs': [str(o.def_path) for o in s.outs]} for s in r.index.stages]))")
    import json

    stages = json.loads(run([sys.executable, "-c", code], cwd).stdout)
    return {viasd_command(s["cmd"]): {"name": s["name"], "deps": set(s["deps"]), "outs": set(s["outs"])} for s in stages}


def covers(parent: str, path: str) -> bool:
    parent, path = parent.rstrip("/"), path.rstrip("/")
    return path == parent or path.startswith(parent + "/")


SMOKE_RUNS = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())["study"]["runs"]


def expected_run_names(pair="smoke", task="stdlib_continuation") -> list[str]:
    names = ["prepare_corpus", f"prepare_tasks/{task}/dev", f"prepare_tasks/{task}/test", "train_model/target",
             "train_model/draft", "train_model/independent", f"dimr_search/{pair}/path", f"train_router/{pair}",
             "report"]
    # thresholds per slim of the grid's viasd runs (thresholds.per_slim), and the hand rules tuned alone
    names += [f"tune_thresholds/{pair}/{task}/{slim}" for slim in ("main", "mask_random", "independent", "rules")]
    # each search run as a job of its own first (thresholds.split_searches)
    names += [f"tune_thresholds/{pair}/{task}/search-{slim}" for slim in ("rules", "main", "mask_random", "independent")]
    names += [f"{stage}/{pair}/{task}/{run}" for stage in ("decode", "evaluate") for run in SMOKE_RUNS]
    names += [f"batch_table/{pair}/{task}"]
    return sorted(names)



# What a smoke study produces that no code change meant to keep behaviour may change (tests/golden/): the
# masks, the policies each threshold search tries (the DIMR slim's and the hand rules': with the smoke
# config's trial counts every trial is a seeded start-up draw, independent of timings), the tokens of every
# run whose output does not depend on the timed choice of thresholds, and the MLflow run names.
GOLDEN = Path(__file__).resolve().parent / "golden" / "smoke-fingerprint.json"
FINGERPRINT_RUNS = ("ar", "sd", "cascade_sd", "spec_cascade", "viasd-oracle")


def smoke_fingerprint(repo: Path, pair: str = "smoke", task: str = "stdlib_continuation",
                      tracking_uri: str | None = None) -> dict:
    """The fingerprint of a finished smoke study in `repo` (see GOLDEN); its runs read from `tracking_uri`
    (default: the study's own store, mlflow.db)."""
    import json

    from mlflow.tracking import MlflowClient

    from viasd.decoding.policy import TUNED_FIELDS

    masks = {p.name: json.loads(p.read_text())["keep_layers"]
             for p in sorted((repo / "models-smoke" / "masks" / pair).glob("*.json"))}
    searches = {}
    for slim in ("main", "rules"):
        trace = repo / "models-smoke" / "thresholds" / f"{pair}-{task}" / f"{slim}.trace.jsonl"
        trials = [json.loads(line) for line in trace.read_text().splitlines()]
        searches[slim] = [{k: t.get(k) for k in TUNED_FIELDS} for t in sorted(
            (t for t in trials if not t["tiers_off"] and t.get("search") is None), key=lambda t: t["number"])]
    tokens = {}
    for run_name in FINGERPRINT_RUNS:
        rows = (repo / "reports-smoke" / "decode" / pair / task / f"{run_name}.jsonl").read_text().splitlines()
        tokens[run_name] = [json.loads(line)["token_ids"] for line in rows]
    client = MlflowClient(tracking_uri or f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("viasd-smoke")
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=5000) if r.info.status == "FINISHED"]
    return {"masks": masks, "searched_policies": searches, "tokens": tokens,
            "mlflow_run_names": sorted(r.info.run_name for r in runs)}


if __name__ == "__main__":  # python tests/workflow_helpers.py <finished smoke repo>: print its fingerprint
    import json

    print(json.dumps(smoke_fingerprint(Path(sys.argv[1])), indent=1, sort_keys=True))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# what a closed network needs (without them Chromium's background connections fail at every start)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VEGA = {"vega@5": "vega/build/vega.min.js", "vega-lite@5": "vega-lite/build/vega-lite.min.js",
        "vega-embed@6": "vega-embed/build/vega-embed.min.js"}


def offline_plots_template(cache: Path) -> Path | None:
    """An HTML template for `dvc plots show --html-template` that carries Vega, Vega-Lite and Vega-Embed inline (DVC's
    own loads them from a CDN, which a closed network does not reach), from the npm registry into `cache`, and draws
    as SVG (so the page's DOM shows every mark). None when npm cannot fetch them."""
    modules = cache / "node_modules"
    if not all((modules / path).exists() for path in VEGA.values()):
        npm = shutil.which("npm")
        if npm is None:
            return None
        proc = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(cache), *VEGA],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            return None
    scripts = "".join(f"<script>{(modules / path).read_text()}</script>" for path in VEGA.values())
    svg = "<script>const embed = vegaEmbed; vegaEmbed = (el, spec, opt) => embed(el, spec, {...opt, renderer: 'svg'});</script>"
    template = cache / "plots.html"
    template.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'>{scripts}{svg}</head>"
                        "<body>{plot_divs}</body></html>")
    return template


def rendered_dom(html: Path) -> str:
    """The DOM of `html` after headless Chromium ran its scripts."""
    proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, "--virtual-time-budget=15000", "--dump-dom", html.as_uri()],
                          capture_output=True, text=True, timeout=120)
    return proc.stdout


def md_rows(text: str) -> list[list[str]]:
    """The cells of a markdown table's rows (header and body, not the rule line)."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [row for row in rows if not all(set(cell) <= set("-:") for cell in row)]


def planned_rules(output: str) -> set[str]:
    """Rule names of a Snakemake dry run's job-stats table."""
    table = output.split("Job stats:", 1)[1] if "Job stats:" in output else ""
    return {m.group(1) for m in re.finditer(r"^(\w+)\s+\d+\s*$", table, re.M) if m.group(1) != "total"}


def stages_run(output: str) -> set[str]:
    """Names of the stages a `dvc repro` (or `dvc exp run`) output says it ran."""
    return set(re.findall(r"Running stage '([^']+)'", output))
