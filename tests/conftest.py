import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import build_pair, build_tokenizer  # noqa: E402


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
def model_sets(pair_dirs):
    """arch -> ModelSet (target, draft, one slim verifier keeping layers 0 and 2) on the CPU."""
    from viasd import load_models

    loaded = {}

    def get(arch: str):
        if arch not in loaded:
            target, draft = pair_dirs(arch)
            loaded[arch] = load_models(target, draft=draft, masks=[[0, 2]], device="cpu", dtype="float32")
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
