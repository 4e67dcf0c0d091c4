"""Where packaged model files are cached: `make run STATE=dir` must move them with the rest of the state."""

from __future__ import annotations

from infra.packaged import models_dir
from infra.settings import REPO_ROOT


def test_models_dir_follows_the_state_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("CRUCIBLE_MODELS_DIR", raising=False)
    monkeypatch.setenv("CRUCIBLE_STATE_DIR", str(tmp_path / "elsewhere"))
    assert models_dir() == tmp_path / "elsewhere" / "models"
    monkeypatch.setenv("CRUCIBLE_STATE_DIR", "rel-state")
    assert models_dir() == REPO_ROOT / "rel-state" / "models"


def test_explicit_models_dir_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("CRUCIBLE_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("CRUCIBLE_MODELS_DIR", str(tmp_path / "m"))
    assert models_dir() == tmp_path / "m"
