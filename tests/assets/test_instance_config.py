"""The repo's dagster.yaml and the production example both validate against Dagster's schemas."""

from __future__ import annotations

import importlib
import shutil

import pytest
import yaml
from dagster._config import validate_config
from dagster._core.instance.config import dagster_instance_config

from infra.settings import REPO_ROOT

DEPLOY = REPO_ROOT / "infra" / "deploy" / "dagster.yaml"


def _class_config_ok(section: dict) -> list[str]:
    cls = getattr(importlib.import_module(section["module"]), section["class"])
    result = validate_config(cls.config_type(), section.get("config", {}))
    return [e.message for e in result.errors or []]


def test_local_instance_config(tmp_path, monkeypatch):
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    config, _ = dagster_instance_config(str(tmp_path))
    runs = config["concurrency"]["runs"]
    limits = {(t["key"], t["value"]): t["limit"] for t in runs["tag_concurrency_limits"]}
    assert set(limits) == {("crucible/resource", v) for v in ("cpu", "gpu", "spark", "llm")}
    assert config["concurrency"]["pools"]["default_limit"] == 1
    assert config["run_monitoring"]["enabled"] is True and config["telemetry"]["enabled"] is False


def test_production_instance_config_validates(tmp_path, monkeypatch):
    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD"):
        monkeypatch.setenv(var, "x")
    shutil.copy(DEPLOY, tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))
    assert "postgres" in config["storage"]
    raw = yaml.safe_load(DEPLOY.read_text())
    assert raw["run_launcher"]["class"] == "K8sRunLauncher"
    assert _class_config_ok(raw["run_launcher"]) == []
    assert _class_config_ok(raw["compute_logs"]) == []
    from dagster_postgres import DagsterPostgresStorage

    result = validate_config(DagsterPostgresStorage.config_type(), raw["storage"]["postgres"])
    assert result.success, result.errors


def test_production_config_typo_is_caught():
    raw = yaml.safe_load(DEPLOY.read_text())
    raw["run_launcher"]["config"]["job_namespac"] = "typo"
    assert any("job_namespac" in e for e in _class_config_ok(raw["run_launcher"]))


@pytest.mark.parametrize("path", [REPO_ROOT / "dagster.yaml", DEPLOY])
def test_secrets_come_from_the_environment(path):
    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if "password" in key:
                    assert isinstance(value, dict) and set(value) == {"env"}, (
                        f"{path}: {key} must be an env ref"
                    )
                walk(value)

    walk(yaml.safe_load(path.read_text()))
