"""Kubernetes objects checked against the Kubernetes API schema offline: the python client's models, filled the
strict way dagster-k8s fills them (unknown keys and missing required fields raise)."""

from __future__ import annotations

from typing import Any

from dagster_k8s.models import k8s_model_from_dict, k8s_snake_case_dict


def k8s_object(model: type, manifest: dict[str, Any]) -> Any:
    """`manifest` (camelCase, as in YAML) as an instance of the client model `model`, e.g. V1Deployment."""
    return k8s_model_from_dict(model, k8s_snake_case_dict(model, manifest))
