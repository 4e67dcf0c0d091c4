"""Dagster resources: the object store and a thin MLflow resource, both built from the active profile."""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr

from infra.settings import Profile, StoreSettings, load_profile
from infra.store import ObjectStore, open_store
from infra.tracking import Tracker, default_tracking_uri, ui_url


class ObjectStoreResource(dg.ConfigurableResource):
    """Where stages read and write data: a local directory or s3://bucket/prefix."""

    url: str = Field(description="Local directory or s3://bucket/prefix")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint; None = AWS")
    region: str = Field("us-east-1", description="S3 region")
    multipart_threshold_mb: int = Field(64, description="Objects above this size upload in parts")
    max_attempts: int = Field(3, description="Attempts per S3 call")
    connect_timeout_s: float = Field(5.0, description="S3: seconds to open a connection")
    read_timeout_s: float = Field(10.0, description="S3: seconds to wait for response bytes")
    _store: ObjectStore | None = PrivateAttr(None)

    def open(self) -> ObjectStore:
        if self._store is None:
            settings = StoreSettings(
                url=self.url,
                endpoint_url=self.endpoint_url,
                region=self.region,
                multipart_threshold_mb=self.multipart_threshold_mb,
                max_attempts=self.max_attempts,
                connect_timeout_s=self.connect_timeout_s,
                read_timeout_s=self.read_timeout_s,
            )
            self._store = open_store(settings, state_dir=_profile().state_path)
        return self._store


class MlflowResource(dg.ConfigurableResource):
    """A thin resource over plain mlflow: each materialization opens and closes its own run."""

    tracking_uri: str = Field(description="MLflow tracking URI (sqlite:///... or http://...)")
    experiment_prefix: str = Field("crucible", description="Experiments are named <prefix>/<asset group>")
    ui_url: str | None = Field(None, description="MLflow UI base URL for links in Dagster metadata")
    artifact_root: str | None = Field(None, description="Artifact root for new experiments (local backend)")
    _tracker: Tracker | None = PrivateAttr(None)

    def tracker(self) -> Tracker:
        if self._tracker is None:
            self._tracker = Tracker(
                self.tracking_uri,
                self.experiment_prefix,
                ui_url=self.ui_url,
                artifact_root=self.artifact_root,
            )
        return self._tracker


def _profile() -> Profile:
    return load_profile()


def resources_for(profile: Profile) -> dict[str, dg.ConfigurableResource]:
    """The store and MLflow resources of a profile."""
    store = profile.store
    url = store.url if store.url.startswith("s3://") else str(profile.state_path / store.url)
    tracking_uri = default_tracking_uri(profile)
    artifacts = (
        (profile.state_path / "mlflow" / "artifacts").as_uri() if tracking_uri.startswith("sqlite") else None
    )
    return {
        "store": ObjectStoreResource(
            url=url,
            endpoint_url=store.endpoint_url,
            region=store.region,
            multipart_threshold_mb=store.multipart_threshold_mb,
            max_attempts=store.max_attempts,
            connect_timeout_s=store.connect_timeout_s,
            read_timeout_s=store.read_timeout_s,
        ),
        "mlflow": MlflowResource(
            tracking_uri=tracking_uri,
            experiment_prefix=profile.tracking.experiment_prefix,
            ui_url=ui_url(profile, tracking_uri),
            artifact_root=artifacts,
        ),
    }
