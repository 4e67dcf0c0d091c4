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
