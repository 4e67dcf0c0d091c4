"""Pod requests of a Dagster run on Kubernetes, chosen by the job's `crucible/resource` tag.

The table is infra/deploy/run_resources.yaml; `k8s_run_tags` turns one entry into the `dagster-k8s/config`
run tag that dagster-k8s's K8sRunLauncher merges over its default run_k8s_config. Off Kubernetes the tag is
inert (no other launcher reads it), so every profile's jobs carry it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import yaml

RUN_RESOURCES = Path(__file__).parent / "deploy" / "run_resources.yaml"
K8S_CONFIG_TAG = "dagster-k8s/config"  # dagster_k8s.job.USER_DEFINED_K8S_CONFIG_KEY


@cache
def run_resources() -> dict[str, dict]:
    """{resource class: dagster-k8s user-defined config} from run_resources.yaml."""
    return yaml.safe_load(RUN_RESOURCES.read_text())


def k8s_run_tags(resource: str) -> dict[str, str]:
    """The `dagster-k8s/config` tag for a job of `resource` (cpu, gpu, spark, llm)."""
    table = run_resources()
    if resource not in table:
        raise KeyError(
            f"no pod settings for crucible/resource {resource!r} in {RUN_RESOURCES}: {sorted(table)}"
        )
    return {K8S_CONFIG_TAG: json.dumps(table[resource], sort_keys=True)}
