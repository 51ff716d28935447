import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import build_pair, build_tokenizer  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--device", default=os.environ.get("VIASD_TEST_DEVICE", "cpu"),
                     help="where the `model_sets` fixture puts the tiny pairs (cpu, cuda, cuda:1, ...; default cpu or "
                          "$VIASD_TEST_DEVICE): the engine's invariants, run on an accelerator. Float32 either way.")


def pytest_configure(config):
    """`--device` parsed once, before any test (one line when it names no device torch can use), and kept
    on the config for the `device` fixture."""
    import torch

    name = config.getoption("--device")
    try:
        config.viasd_device = torch.device(name)
    except RuntimeError as err:
        raise pytest.UsageError(f"--device {name}: {err}") from None
    if config.viasd_device.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device {name}: torch {torch.__version__} sees no CUDA device")
        # float32 matmuls in full precision (no TF32), as on the CPU: token-for-token invariants
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(scope="session")
def device(request):
    """The torch device the engine tests run on (`--device`)."""
    return request.config.viasd_device


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory, tokenizer):
    """arch -> (target_dir, draft_dir), built on first use and kept for the session."""
    root = tmp_path_factory.mktemp("models")
    built = {}

    def get(arch: str):
        if arch not in built:
            built[arch] = build_pair(root, arch, tokenizer)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def model_sets(pair_dirs, device):
    """arch -> ModelSet (target, draft, one slim verifier keeping layers 0 and 2) on `device` (`--device`)."""
    from viasd import load_models

    loaded = {}

    def get(arch: str):
        if arch not in loaded:
            target, draft = pair_dirs(arch)
            loaded[arch] = load_models(target, draft=draft, masks=[[0, 2]], device=str(device), dtype="float32")
        return loaded[arch]

    return get


PROMPTS = ["def parse(self, text):\n", "import os\n\nclass ", "    return self._"]


@pytest.fixture(scope="session")
def study(tmp_path_factory):
    """The smoke family trained once per session through the real stages: (folder, params). Tests that
    write stage outputs into it (masks, thresholds, decodes, bench files) share them."""
    from study_fixtures import smoke_params

    from viasd import config
    from viasd.data.prepare import prepare_data
    from viasd.training.train import train_model

    tmp = tmp_path_factory.mktemp("study")
    params = config.load(smoke_params(tmp))
    prepare_data(params, progress=False)
    for role in ("target", "draft", "independent"):
        train_model(params, role, progress=False)
    return tmp, params


@pytest.fixture
def repo(tmp_path):
    """A copy of the repository (its tracked and not-ignored files) as a fresh git repository, for the workflow tests
    that run the real Snakemake, DVC and services on it."""
    from workflow_helpers import copy_repo

    return copy_repo(tmp_path / "repo")
