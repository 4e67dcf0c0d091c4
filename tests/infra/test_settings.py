from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from infra import settings
from infra.settings import SettingsError, load_profile, validate_stage


class _Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_pages: int = Field(300, gt=0, description="pages")
    name: str = Field("x", description="name")


def test_profiles_load_and_inherit():
    tiny, micro, cluster = (load_profile(n) for n in ("tiny", "micro", "cluster"))
    assert (tiny.name, micro.name, cluster.name) == ("tiny", "micro", "cluster")
    assert micro.store.url == tiny.store.url == "store"  # micro extends tiny
    assert cluster.store.url.startswith("s3://")


def test_env_selects_profile(monkeypatch):
    monkeypatch.setenv("CRUCIBLE_PROFILE", "cluster")
    assert load_profile().name == "cluster"


def test_unknown_profile_lists_choices(monkeypatch):
    monkeypatch.setenv("CRUCIBLE_PROFILE", "huge")
    with pytest.raises(SettingsError, match=r"unknown profile 'huge'.*cluster.*micro.*tiny"):
        load_profile()


def test_bad_profile_value_names_file_and_field(tmp_path, monkeypatch):
    (tmp_path / "bad.yaml").write_text("store:\n  max_attempts: zero\n")
    monkeypatch.setattr(settings, "PROFILES_DIR", tmp_path)
    with pytest.raises(SettingsError) as err:
        load_profile("bad")
    assert "bad.yaml" in str(err.value) and "store.max_attempts" in str(err.value)


def test_a_profile_that_is_not_yaml_is_a_settings_error_naming_the_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "broken.yaml").write_text("store:\n  url: [store\nstages: {}\n")  # an unclosed list
    monkeypatch.setattr(settings, "PROFILES_DIR", tmp_path)
    with pytest.raises(SettingsError) as err:
        load_profile("broken")
    assert "broken.yaml: not valid YAML" in str(err.value) and "line" in str(err.value)


def test_unknown_top_level_key_is_rejected(tmp_path, monkeypatch):
    (tmp_path / "typo.yaml").write_text("stroe: {}\n")
    monkeypatch.setattr(settings, "PROFILES_DIR", tmp_path)
    with pytest.raises(SettingsError, match="stroe"):
        load_profile("typo")


def test_stage_validation_names_stage_and_field(tmp_path, monkeypatch):
    (tmp_path / "p.yaml").write_text("stages:\n  web_crawl:\n    max_pages: -3\n")
    monkeypatch.setattr(settings, "PROFILES_DIR", tmp_path)
    with pytest.raises(SettingsError) as err:
        validate_stage(load_profile("p"), "web_crawl", _Stage)
    assert "stages.web_crawl" in str(err.value) and "'max_pages'" in str(err.value)
    ok = validate_stage(load_profile("p"), "web_crawl", _Stage, overrides={"max_pages": 7})
    assert ok.max_pages == 7 and ok.name == "x"


def test_state_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("CRUCIBLE_STATE_DIR", str(tmp_path / "s"))
    assert load_profile("tiny").state_path == tmp_path / "s"


def test_unknown_stage_name_fails_naming_file_name_choices_and_close_match(tmp_path, monkeypatch):
    (tmp_path / "typo.yaml").write_text("stages:\n  web_crawl: {}\n  dedup_wbe:\n    kind: web\n")
    monkeypatch.setattr(settings, "PROFILES_DIR", tmp_path)
    # on 98a639e the profile loaded and dedup_web silently kept its defaults
    with pytest.raises(SettingsError) as err:
        load_profile("typo")
    message = str(err.value)
    assert str(tmp_path / "typo.yaml") in message and "'dedup_wbe'" in message
    assert "did you mean 'dedup_web'?" in message
    assert all(name in message for name in settings.STAGE_NAMES)


def test_stage_vocabulary_matches_the_profiles_and_the_code():
    for name in ("tiny", "micro", "cluster"):
        assert set(load_profile(name).stages) <= settings.STAGE_NAMES
    with pytest.raises(SettingsError, match=r"stage 'crawl' is not in STAGE_NAMES"):
        validate_stage(load_profile("micro"), "crawl", _Stage)


def test_a_partial_nested_override_keeps_the_stages_own_nested_defaults():
    """SFT's default trainer is not TrainerConfig's (lr 1e-3, sparse_gather, fp32, 1,600 steps): setting only
    `trainer: {steps: ...}` used to build a fresh TrainerConfig and silently train at the class's lr."""
    from training.post_train import SftConfig
    from training.rl.general_job import GeneralRLStageConfig
    from training.trainer import TrainerConfig

    tiny = load_profile("tiny")
    default = validate_stage(tiny, "sft", SftConfig).trainer
    assert default.optim.lr != TrainerConfig().optim.lr  # else this test could not fail
    steps = validate_stage(tiny, "sft", SftConfig, {"trainer": {"steps": 3000}}).trainer
    assert steps == default.model_copy(update={"steps": 3000})
    lr = validate_stage(tiny, "sft", SftConfig, {"trainer": {"optim": {"lr": 5e-4}}}).trainer
    assert lr.optim == default.optim.model_copy(update={"lr": 5e-4}) and lr.steps == default.steps

    # an optional nested model (the GRM judge): a partial override keeps the rest; null still turns it off
    judge = validate_stage(
        tiny, "general_rl", GeneralRLStageConfig, {"judge": {"client": {"max_calls": 7}}}
    ).judge
    assert judge.client.max_calls == 7 and judge.client.show_progress is False and judge.local_threads is None
    assert validate_stage(tiny, "general_rl", GeneralRLStageConfig, {"judge": None}).judge is None
    # a plain dict field is replaced, not merged: ratios name exactly the families to train on
    from training.agentic.async_loop import AgenticRLConfig

    ratios = validate_stage(
        tiny, "agentic_rl", AgenticRLConfig, {"task_ratios": {"terminal": 1.0}}
    ).task_ratios
    assert ratios == {"terminal": 1.0}
    with pytest.raises(SettingsError, match="trainer.stepz"):
        validate_stage(tiny, "sft", SftConfig, {"trainer": {"stepz": 3}})
