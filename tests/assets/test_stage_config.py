from __future__ import annotations

from typing import Literal

import dagster as dg
import pytest
from pydantic import BaseModel, ConfigDict, Field

from assets.stage_config import launchpad_config, resolve
from infra.settings import SettingsError, load_profile


class Inner(BaseModel):
    name: str
    size: int = 1


class StageModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pages: int = Field(300, gt=0, description="pages to fetch")
    mode: Literal["a", "b"] = Field("a", description="mode")
    seeds: list[str] = Field(default_factory=list, description="seeds")
    uri: str | None = Field(None, description="optional uri")
    inner: Inner = Field(default_factory=lambda: Inner(name="x"), description="nested")
    stages: list[Inner] = Field(
        default_factory=lambda: [Inner(name="s1", size=2)], description="list of models"
    )


def test_launchpad_config_carries_profile_defaults_and_round_trips(monkeypatch):
    profile = load_profile("micro").model_copy(
        update={"stages": {"web_crawl": {"pages": 7, "stages": [{"name": "p"}]}}}
    )
    cls = launchpad_config("web_crawl", StageModel, profile)
    assert issubclass(cls, dg.Config)
    fields = cls.model_fields
    assert fields["pages"].default == 7 and fields["pages"].description == "pages to fetch"
    resolved = resolve(cls())
    assert isinstance(resolved, StageModel)
    assert resolved.stages == [Inner(name="p")] and resolved.inner == Inner(name="x") and resolved.pages == 7
    override = resolve(cls(pages=3, mode="b", stages='[{"name": "q", "size": 5}]'))
    assert override.pages == 3 and override.mode == "b" and override.stages == [Inner(name="q", size=5)]


def test_bad_profile_value_fails_at_load_naming_the_field():
    profile = load_profile("micro").model_copy(update={"stages": {"web_crawl": {"pages": 0}}})
    with pytest.raises(SettingsError, match=r"(?s)stages\.web_crawl.*'pages'"):
        launchpad_config("web_crawl", StageModel, profile)


def test_bad_launchpad_value_is_rejected_by_the_stage_model():
    cls = launchpad_config("web_crawl", StageModel, load_profile("micro").model_copy(update={"stages": {}}))
    with pytest.raises(ValueError, match="pages"):
        resolve(cls(pages=-1))
