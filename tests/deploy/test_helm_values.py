"""infra/deploy/helm/values.yaml says what infra/deploy/dagster.yaml says, its references exist (the code
location module, the tags the jobs set, the MLflow manifest's image and namespace), and the run pods that
dagster-k8s builds from a job's tags request that job's resources. No helm and no cluster here: the run's
Kubernetes Job is built with dagster-k8s's own code (the launcher's container context and
construct_dagster_k8s_job), offline."""

from __future__ import annotations

import importlib
import json
import re

import kubernetes.client
import pytest
import yaml
from dagster import DagsterRun
from dagster_k8s import K8sRunLauncher
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import USER_DEFINED_K8S_CONFIG_KEY, construct_dagster_k8s_job
from k8s_schema import k8s_object  # tests/deploy is on sys.path

from infra import mlflow_server
from infra.k8s_run_config import K8S_CONFIG_TAG, k8s_run_tags, run_resources
from infra.settings import REPO_ROOT, load_profile

DEPLOY = REPO_ROOT / "infra" / "deploy"
VALUES = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
INSTANCE = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
LAUNCHER = INSTANCE["run_launcher"]["config"]


def snake(node):
    """The chart's camelCase values in dagster.yaml's snake_case (keys only)."""
    if isinstance(node, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): snake(v) for k, v in node.items()}
    if isinstance(node, list):
        return [snake(v) for v in node]
    return node


def test_values_say_what_the_instance_config_says():
    k8s = VALUES["runLauncher"]["config"]["k8sRunLauncher"]
    assert VALUES["runLauncher"]["type"] == INSTANCE["run_launcher"]["class"] == "K8sRunLauncher"
    assert k8s["jobNamespace"] == LAUNCHER["job_namespace"] == mlflow_server.NAMESPACE
    assert VALUES["global"]["serviceAccountName"] == LAUNCHER["service_account_name"]
    assert (
        f"{VALUES['fullnameOverride']}-instance" == LAUNCHER["instance_config_map"]
    )  # the chart's ConfigMap
    assert VALUES["global"]["dagsterHome"] == LAUNCHER["dagster_home"]
    assert k8s["imagePullPolicy"] == LAUNCHER["image_pull_policy"]
    assert k8s["loadInclusterConfig"] is LAUNCHER["load_incluster_config"] is True
    assert [s["name"] for s in k8s["envSecrets"]] == LAUNCHER["env_secrets"] == [mlflow_server.SECRET]
    assert snake(k8s["runK8sConfig"]) == LAUNCHER["run_k8s_config"]

    pg, pg_instance = VALUES["postgresql"], INSTANCE["storage"]["postgres"]["postgres_db"]
    assert pg["enabled"] is False and VALUES["generatePostgresqlPasswordSecret"] is False
    assert (pg["postgresqlDatabase"], pg["service"]["port"], pg["postgresqlScheme"]) == (
        pg_instance["db_name"],
        pg_instance["port"],
        pg_instance["scheme"],
    )
    assert pg["postgresqlPassword"] == ""  # the password lives in a Secret only

    assert VALUES["concurrency"]["enabled"] is True
    assert (
        snake({k: v for k, v in VALUES["concurrency"].items() if k != "enabled"}) == INSTANCE["concurrency"]
    )
    assert snake(VALUES["dagsterDaemon"]["runMonitoring"]) == INSTANCE["run_monitoring"]
    logs = VALUES["computeLogManager"]
    assert logs["type"] == INSTANCE["compute_logs"]["class"]
    assert snake(logs["config"]["s3ComputeLogManager"]) == INSTANCE["compute_logs"]["config"]
    assert VALUES["telemetry"] == INSTANCE["telemetry"] == {"enabled": False}


def test_kubernetes_fields_in_the_values_follow_the_api_schema():
    """The chart passes these through to pod specs verbatim: unknown keys would fail at install time."""
    (deployment,) = VALUES["dagster-user-deployments"]["deployments"]
    k8s = VALUES["runLauncher"]["config"]["k8sRunLauncher"]
    requirements = [
        VALUES["dagsterWebserver"]["resources"],
        deployment["resources"],
        k8s["runK8sConfig"]["containerConfig"]["resources"],
    ]
    for resources in requirements:
        assert k8s_object(kubernetes.client.V1ResourceRequirements, resources).requests
    for env in deployment["env"]:
        k8s_object(kubernetes.client.V1EnvVar, env)
    for source in deployment["envSecrets"] + k8s["envSecrets"]:
        k8s_object(kubernetes.client.V1SecretEnvSource, source)
    with pytest.raises(Exception, match="request"):  # singular: a typo
        k8s_object(kubernetes.client.V1ResourceRequirements, {"request": {"cpu": "1"}})


def test_code_location_exists_and_jobs_carry_their_pod_settings():
    (deployment,) = VALUES["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[0] == "--module-name"
    definitions = importlib.import_module(args[1])  # the module the code server loads
    env = {e["name"]: e["value"] for e in deployment["env"]}
    cluster = load_profile(env["CRUCIBLE_PROFILE"])  # the profile the code server runs exists and validates
    assert [s["name"] for s in deployment["envSecrets"]] == LAUNCHER["env_secrets"]

    # the same image runs the MLflow server (infra/deploy/mlflow.yaml)
    (mlflow_deployment, _) = mlflow_server.manifest()
    mlflow_image = mlflow_deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert mlflow_image == f"{deployment['image']['repository']}:{deployment['image']['tag']}"

    limited = {
        t["value"]
        for t in VALUES["concurrency"]["runs"]["tagConcurrencyLimits"]
        if t["key"] == "crucible/resource"
    }
    used = set(definitions.job_resources(cluster).values()) | {
        j.tags["crucible/resource"] for j in definitions.JOBS
    }
    assert used <= limited == set(run_resources())  # every class a job can have is queued and sized
    for job in definitions.JOBS:
        assert K8S_CONFIG_TAG == USER_DEFINED_K8S_CONFIG_KEY
        assert job.tags[K8S_CONFIG_TAG] == k8s_run_tags(job.tags["crucible/resource"])[K8S_CONFIG_TAG], (
            job.name
        )


@pytest.fixture
def launcher(tmp_path):
    """The production K8sRunLauncher (dagster.yaml) with a kubeconfig that points nowhere: nothing is sent."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "none", "user": {"token": "unused"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    return K8sRunLauncher(**{**LAUNCHER, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)})


def run_pod(launcher: K8sRunLauncher, tags: dict[str, str]):
    """The Kubernetes Job the launcher would create for a run with `tags` (its _launch_k8s_job_with_args)."""
    run = DagsterRun(job_name="training", run_id="0" * 32, tags=tags)
    context = K8sContainerContext.create_for_run(run, launcher, include_run_tags=True)
    job = construct_dagster_k8s_job(
        job_config=context.get_k8s_job_config(job_image="crucible:latest", run_launcher=launcher),
        args=["dagster", "api", "execute_run"],
        job_name="dagster-run-0",
        pod_name="dagster-run-0",
        component="run_worker",
        user_defined_k8s_config=context.run_k8s_config,
        labels={},
    )
    return context, job.spec.template.spec


def test_run_pods_request_the_resources_of_their_tag(launcher):
    context, pod = run_pod(launcher, {"crucible/resource": "cpu"})  # no k8s tag: the launcher's default
    assert context.namespace == "crucible"
    assert pod.service_account_name == "crucible-dagster"
    assert [e.secret_ref.name for e in pod.containers[0].env_from if e.secret_ref] == ["crucible-secrets"]
    assert pod.containers[0].resources.requests == {"cpu": "2", "memory": "8Gi"}

    for resource, spec in run_resources().items():
        tags = {"crucible/resource": resource, **k8s_run_tags(resource)}
        _, pod = run_pod(launcher, tags)
        container = pod.containers[0]
        want = spec["container_config"]["resources"]
        assert container.resources.requests == want["requests"], resource
        assert container.resources.limits == want["limits"], resource
        assert pod.service_account_name == "crucible-dagster"  # the tag adds, it does not replace
        if resource == "gpu":
            assert container.resources.requests["nvidia.com/gpu"] == "8"
            assert pod.node_selector == {"crucible/pool": "gpu"}
            assert [t.key for t in pod.tolerations] == ["nvidia.com/gpu"]
            assert {m.mount_path for m in container.volume_mounts} >= {"/dev/shm"}
            assert {v.name: v.empty_dir.medium for v in pod.volumes if v.empty_dir} == {"dshm": "Memory"}
        else:
            assert pod.node_selector is None
        env = {e.name: e for e in container.env}
        if resource == "spark":  # the driver finds the Spark master and is reachable from the executors
            assert env["MASTER"].value == "spark://spark-master.crucible:7077"
            assert env["SPARK_LOCAL_IP"].value_from.field_ref.field_path == "status.podIP"
        else:
            assert "MASTER" not in env


def test_unknown_resource_class_names_the_known_ones():
    with pytest.raises(KeyError, match="'tpu'.*cpu.*gpu.*llm.*spark"):
        k8s_run_tags("tpu")
    assert json.loads(k8s_run_tags("gpu")[K8S_CONFIG_TAG]) == run_resources()["gpu"]
