"""MLflow tracking and registry over the plain MlflowClient (no global active-run state).

One `StageRun` per asset materialization: tags carry the lineage (Dagster run, asset, partition, code version,
git commit, profile, upstream MLflow runs and data versions); params carry the resolved stage config (secrets
redacted); metrics carry counts and timings; artifacts carry a sample of the output and a report.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.settings import REPO_ROOT, Profile

log = logging.getLogger(__name__)

UPSTREAM_RUNS_TAG = "crucible.upstream_runs"
UPSTREAM_VERSIONS_TAG = "crucible.upstream_data_versions"
# Declared upstream assets the stage recorded no read of: the lineage walk reports a broken link there.
LINEAGE_MISSING_TAG = "crucible.lineage_missing"
# External sources a stage read outside the store (Debian archives by name and version): lineage leaves.
SOURCES_TAG = "crucible.sources"
HOST_TAG, PID_TAG = "crucible.host", "crucible.pid"
# Whole words of a key's last part: `hf_token`, `aws_secret_access_key`, `apiKey` are secret; `max_new_tokens`
# and `author` are not.
_SECRET_WORDS = r"secret|password|passwd|token|api[_-]?key|credentials?|access[_-]?key|private[_-]?key|auth"
_SECRET = re.compile(rf"(?:^|[._-])({_SECRET_WORDS})(?:$|[._-])", re.I)
_URL_CREDENTIALS = re.compile(r"(\w+://)[^/@\s:]+:[^/@\s]+@")
_METRIC_SPELLED = {"+": "p", "#": "sharp", " ": "_", ":": "/"}  # labels: C++, Emacs Lisp, source:label
_METRIC_KEY = re.compile(r"[A-Za-z0-9_/.-]{1,64}")
RUNS_VIEW = "?workflowType=machine_learning"  # MLflow UI: "Model training" view, not "GenAI"


def redact(params: dict[str, Any]) -> dict[str, str]:
    """Flatten params to strings, hiding values of secret-looking keys and credentials inside URLs."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
            return
        if _SECRET.search(prefix) and value not in (None, "", [], {}):
            flat[prefix] = "***"
            return
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        flat[prefix] = _URL_CREDENTIALS.sub(r"\1***@", text)[:6000]

    walk("", params)
    return flat


def metric_name(key: str) -> str | None:
    """A metric key from the fixed vocabulary, or None for free text (longer than 64 characters, or other
    characters than [A-Za-z0-9_/.-] once labels are spelled out: `C++` -> `Cpp`, `web:0` -> `web/0`)."""
    name = "".join(_METRIC_SPELLED.get(c, c) for c in key)
    return name if _METRIC_KEY.fullmatch(name) else None


def process_tags() -> dict[str, str]:
    """Where a run's process lives, so a later stage can tell that a RUNNING run's process is gone."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def process_gone(tags: dict[str, str], current_dagster_run: str = "") -> bool:
    """True if a run's process (HOST_TAG, PID_TAG) ran on this host and no longer exists; a reused pid is
    gone too when it is this process serving another Dagster run. Other hosts: False (cannot tell)."""
    if tags.get(HOST_TAG) != socket.gethostname() or not tags.get(PID_TAG, "").isdigit():
        return False
    pid = int(tags[PID_TAG])
    if pid == os.getpid():
        return tags.get("dagster.run_id", "") != current_dagster_run
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by someone else
        return False
    return False


def git_commit() -> str:
    """HEAD of the repo this code runs from ('+dirty' if the tree has changes), or 'unknown'."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def default_tracking_uri(profile: Profile) -> str:
    """$MLFLOW_TRACKING_URI, else the profile's URI, else sqlite in the state dir."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or profile.tracking.tracking_uri
    if uri:
        return uri
    db = profile.state_path / "mlflow" / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def ui_url(profile: Profile, tracking_uri: str) -> str | None:
    """Where run links point: $CRUCIBLE_MLFLOW_UI_URL, an http tracking server, else the profile's UI URL."""
    if os.environ.get("CRUCIBLE_MLFLOW_UI_URL"):
        return os.environ["CRUCIBLE_MLFLOW_UI_URL"]
    return tracking_uri if tracking_uri.startswith("http") else profile.tracking.ui_url


@dataclass
class StageRun:
    """An open MLflow run for one materialization."""

    client: Any
    run_id: str
    experiment_id: str
    url: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    rejected_metrics: list[str] = field(default_factory=list)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log numbers under vocabulary keys; a free-text key is dropped and named once (log and a tag)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            name = metric_name(key)
            if name is None:
                self._reject(key)
            elif value is not None:
                batch.append(Metric(name, float(value), now, step or 0))
        for i in range(0, len(batch), 900):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 900])
        self.metrics.update({m.key: m.value for m in batch})

    def log_history(self, rows: list[dict[str, Any]], prefix: str = "") -> int:
        """Log per-step rows (each with an int `step`; `time` is ignored) as metric histories: one MLflow
        point per (key, step). Returns the number of points logged."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for row in rows:
            step = int(row["step"])
            for key, value in row.items():
                if key in ("step", "time") or not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                name = metric_name(prefix + key)
                if name is None:
                    self._reject(prefix + key)
                else:
                    batch.append(Metric(name, float(value), now, step))
        for i in range(0, len(batch), 900):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 900])
        return len(batch)

    def _reject(self, key: str) -> None:
        if key in self.rejected_metrics:
            return
        self.rejected_metrics.append(key)
        log.warning("metric key %r is not a vocabulary key (<= 64 of [A-Za-z0-9_/.-]): not logged", key[:200])
        self.client.set_tag(
            self.run_id, "crucible.rejected_metric_keys", json.dumps(self.rejected_metrics)[:5000]
        )

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        batch = [Param(k, v) for k, v in redact(params).items()]
        for i in range(0, len(batch), 90):
            self.client.log_batch(self.run_id, params=batch[i : i + 90])

    def set_tags(self, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def log_dict(self, obj: Any, name: str) -> None:
        self.client.log_text(self.run_id, json.dumps(obj, indent=2, default=str), name)

    def log_figure(self, figure: Any, name: str) -> None:
        self.client.log_figure(self.run_id, figure, name)


class Tracker:
    """Opens stage runs in `<prefix>/<group>` experiments and registers models."""

    def __init__(
        self,
        tracking_uri: str,
        experiment_prefix: str = "crucible",
        ui_url: str | None = None,
        artifact_root: str | None = None,
    ):
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.experiment_prefix = experiment_prefix
        self.artifact_root = artifact_root
        self.ui_url = ui_url or (tracking_uri if tracking_uri.startswith("http") else None)
        self._ui_answers: bool | None = None  # checked once, on the first run link
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    @classmethod
    def from_profile(cls, profile: Profile) -> Tracker:
        uri = default_tracking_uri(profile)
        artifacts = None
        if uri.startswith("sqlite:"):
            artifacts = (profile.state_path / "mlflow" / "artifacts").as_uri()
        return cls(
            uri, profile.tracking.experiment_prefix, ui_url=ui_url(profile, uri), artifact_root=artifacts
        )

    def experiment_id(self, group: str) -> str:
        name = f"{self.experiment_prefix}/{group}"
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        location = f"{self.artifact_root}/{group}" if self.artifact_root else None
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # created concurrently by another process
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def ui_available(self) -> bool:
        """A link target exists: the UI is the configured tracking server, or it answers HTTP (cached)."""
        if not self.ui_url:
            return False
        if self.ui_url == self.tracking_uri:
            return True
        if self._ui_answers is None:
            import urllib.error
            import urllib.request

            try:
                urllib.request.urlopen(self.ui_url, timeout=2).close()
                self._ui_answers = True
            except urllib.error.HTTPError:
                self._ui_answers = True  # something answers there
            except (OSError, ValueError):
                self._ui_answers = False
                log.info("no MLflow UI answers at %s: runs carry no link", self.ui_url)
        return self._ui_answers

    def run_url(self, experiment_id: str, run_id: str) -> str | None:
        if not self.ui_available():
            return None
        # MLflow 3.x opens a run in its GenAI view unless the link asks for the training (runs) view
        return f"{self.ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{RUNS_VIEW}"

    def fail_stale_runs(
        self, group: str, asset: str, partition: str, stale_reason: Callable[[Any], str | None]
    ) -> list[str]:
        """Mark RUNNING runs of one asset partition FAILED where `stale_reason(run)` gives a reason (e.g. its
        process was SIGKILLed), recorded as the tag crucible.failed_reason; returns their ids."""
        runs = self.find_runs(
            group,
            f"attributes.status = 'RUNNING' and tags.`dagster.asset_key` = '{asset}'"
            f" and tags.`dagster.partition_key` = '{partition}'",
        )
        failed = []
        for run in runs:
            reason = stale_reason(run)
            if reason:
                self.client.set_tag(run.info.run_id, "crucible.failed_reason", reason)
                self.client.set_terminated(run.info.run_id, "FAILED")
                failed.append(run.info.run_id)
        return failed

    @contextmanager
    def stage_run(
        self, group: str, run_name: str, tags: dict[str, Any], params: dict[str, Any] | None = None
    ) -> Iterator[StageRun]:
        """Open one MLflow run; it ends FINISHED on success and FAILED (re-raising) on error."""
        exp_id = self.experiment_id(group)
        run = self.client.create_run(exp_id, run_name=run_name, tags={k: str(v) for k, v in tags.items()})
        stage = StageRun(self.client, run.info.run_id, exp_id, self.run_url(exp_id, run.info.run_id))
        if params:
            stage.log_params(params)
        try:
            yield stage
        except BaseException:
            self.client.set_terminated(stage.run_id, "FAILED")
            raise
        self.client.set_terminated(stage.run_id, "FINISHED")

    def get_run(self, run_id: str):
        return self.client.get_run(run_id)

    def find_runs(self, group: str, filter_string: str = "", max_results: int = 100) -> list:
        exp = self.client.get_experiment_by_name(f"{self.experiment_prefix}/{group}")
        if exp is None:
            return []
        return self.client.search_runs(
            [exp.experiment_id],
            filter_string=filter_string,
            max_results=max_results,
            order_by=["attributes.start_time DESC"],
        )

    def register_model(self, name: str, run_id: str, artifact_path: str, tags: dict[str, Any]) -> Any:
        """Register `runs:/<run_id>/<artifact_path>` as a new version of `name`, with lineage tags."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name)
        except MlflowException:
            pass  # already registered
        source = f"{self.client.get_run(run_id).info.artifact_uri}/{artifact_path}"
        version = self.client.create_model_version(
            name, source, run_id=run_id, tags={k: str(v) for k, v in tags.items()}
        )
        return version

    def model_version_run_id(self, name: str, version: str) -> str:
        """The MLflow run behind a registered model version; LookupError naming what is registered."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version(name, version).run_id
        except MlflowException:
            known = sorted(m.name for m in self.client.search_registered_models())
            raise LookupError(
                f"no registered model version {name}/{version}; registered models: {', '.join(known) or 'none'}"
                " (see the Models page of the MLflow UI)"
            ) from None

    def run_lineage(self, run_id: str, store: Any = None) -> dict:
        """`lineage`, with a LookupError for an unknown run id."""
        from mlflow.exceptions import MlflowException

        try:
            return self.lineage(run_id, store)
        except MlflowException:
            raise LookupError(f"no MLflow run {run_id!r} (give <model>/<version> or a run id)") from None

    def lineage(self, run_id: str, store: Any = None) -> dict:
        """The upstream tree of a run back to the roots (the crawl snapshots), its reads checked against the
        committed pointers of `store` when given (infra/lineage_report.py)."""
        from infra.lineage_report import lineage

        return lineage(self.client, run_id, store)
