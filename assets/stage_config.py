"""Turn a stage's pydantic config model into a Dagster `Config` whose defaults are the active profile's.

The launchpad then shows every field with its description and the profile's value, and a run can override
any of them. A bad profile value fails here, when the code location loads, naming the file and field.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, create_model

from infra.settings import Profile, validate_stage

_PLAIN = (str, int, float, bool)


def _launchpad_type(annotation: Any) -> tuple[Any, bool]:
    """A Dagster-compatible annotation for `annotation`; (type, is_json) where JSON carries complex values."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in _PLAIN:
        return annotation, False
    if annotation is Path:
        return str, False
    if origin is typing.Literal:
        return str, False
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            base, is_json = _launchpad_type(inner[0])
            return (base | None), is_json
    if origin is list and args and (args[0] in _PLAIN or typing.get_origin(args[0]) is typing.Literal):
        return list[str if typing.get_origin(args[0]) is typing.Literal else args[0]], False
    if origin is dict and args and args[0] is str and args[1] in _PLAIN:
        return dict[str, args[1]], False
    return str, True  # nested models, tuples, mixed dicts: edited as JSON text


def launchpad_config(stage: str, model: type[BaseModel], profile: Profile) -> type[dg.Config]:
    """A `dg.Config` subclass mirroring `model`, with defaults from `profile.stages[stage]`."""
    defaults = validate_stage(profile, stage, model)
    fields: dict[str, Any] = {}
    json_fields = []
    dumped = defaults.model_dump(mode="json")
    for name, info in model.model_fields.items():
        annotation, is_json = _launchpad_type(info.annotation)
        value = getattr(defaults, name)
        if is_json or isinstance(value, BaseModel):
            value = dumped[name]
        if is_json:
            json_fields.append(name)
            value = json.dumps(value, default=str)
        elif isinstance(value, Path):
            value = str(value)
        elif hasattr(value, "value") and not isinstance(value, _PLAIN):  # enums
            value = value.value
        fields[name] = (annotation, Field(default=value, description=info.description or name))
    cls_name = "".join(part.title() for part in stage.split("_")) + "Config"
    config_cls = create_model(cls_name, __base__=dg.Config, **fields)
    config_cls.__crucible_json_fields__ = tuple(json_fields)
    config_cls.__crucible_model__ = model
    return config_cls


def resolve(config: dg.Config) -> BaseModel:
    """Validate a launchpad config back into the stage's own pydantic model."""
    model: type[BaseModel] = type(config).__crucible_model__
    values = config.model_dump()
    for name in type(config).__crucible_json_fields__:
        values[name] = json.loads(values[name]) if isinstance(values[name], str) else values[name]
    return model.model_validate(values)
