"""A failing blocking asset check stops the downstream assets of the run: the graph's own `web_corpus` job
(crawl -> `web_documents` -> `web_filtered` -> `web_deduped`) on a real Dagster instance and the micro
profile's store. `web_filtered` has two blocking checks (`kept_not_empty`, `drop_rate_within_bounds`): on a
site whose pages are all too short for the quality filters both fail, and `web_deduped` must not run."""

from __future__ import annotations

import dagster as dg
import pytest
from local_servers import static_site

SENTENCES = [
    "The old bridge over the river was closed for repairs last spring.",
    "Our market opens early on Saturday mornings and sells fresh bread.",
    "She walked to the station with her brother and waited for the train.",
    "The library will be quiet during the summer because the students are away.",
    "Green hills surround the small town where my grandparents used to live.",
]


@pytest.fixture(scope="module")
def short_pages_site():
    """English pages of two sentences (~25 words): language ID keeps them, Gopher's 50-word minimum drops
    every one of them. Yields the seed URL."""
    pages = {
        f"/p{i}.html": f"<html><body><article><p>{SENTENCES[i % 5]} {SENTENCES[(i + 2) % 5]} Page {i}.</p>"
        f"</article></body></html>"
        for i in range(12)
    }
    pages["/index.html"] = (
        "<html><body>" + " ".join(f'<a href="{p}">{p}</a>' for p in pages) + "</body></html>"
    )

    with static_site(pages) as base:
        yield f"{base}/index.html"


def _run(instance, snapshot: str, seed: str):
    from assets.definitions import definitions
    from infra.settings import load_profile

    # this test's state dir: `defs` holds the resources of whichever test first imported the module, whose
    # temp dir is gone by now (with MLflow's NullPool, "unable to open database file")
    defs = definitions(load_profile())
    instance.add_dynamic_partitions("web_snapshot", [snapshot])
    crawl = {"source": "seeds", "seeds": [seed], "max_pages": 20, "allow_private_networks": ["127.0.0.0/8"]}
    return defs.resolve_job_def("web_corpus").execute_in_process(
        instance=instance,
        partition_key=snapshot,
        run_config={"ops": {"web_warc": {"config": crawl}}},
        raise_on_error=False,
    )


def _checks(result) -> dict[tuple[str, str], bool]:
    return {
        (c.asset_key.to_user_string(), c.check_name): c.passed for c in result.get_asset_check_evaluations()
    }


def _materialized(instance, asset: str) -> set[str]:
    return instance.get_materialized_partitions(dg.AssetKey(asset))


def _step_events(result, step: str) -> set[str]:
    return {e.event_type_value for e in result.all_events if e.step_key == step}


@pytest.mark.slow
def test_failing_blocking_check_of_web_filtered_stops_web_deduped(dagster_home, docs_site, short_pages_site):
    instance = dg.DagsterInstance.get()

    # Control: real prose passes the filters, every check passes and the run goes on to deduplicate.
    good = _run(instance, "good", docs_site)
    assert good.success
    assert _checks(good)[("web_filtered", "kept_not_empty")] is True
    assert _checks(good)[("web_filtered", "drop_rate_within_bounds")] is True
    assert _materialized(instance, "web_deduped") == {"good"}

    # Short pages: extracted in English (web_documents' checks pass), all dropped by the quality filters.
    bad = _run(instance, "bad", short_pages_site)
    assert not bad.success
    checks = _checks(bad)
    assert checks[("web_documents", "documents_not_empty")] and checks[("web_documents", "language_mix")]
    assert checks[("web_filtered", "kept_not_empty")] is False
    assert checks[("web_filtered", "drop_rate_within_bounds")] is False
    # web_filtered itself is recorded (its output is there to inspect), nothing downstream of it ran (with
    # WARN severity, web_deduped starts, and fails on the empty input).
    assert _materialized(instance, "web_filtered") == {"good", "bad"}
    assert "STEP_START" not in _step_events(bad, "web_deduped")
    assert "STEP_SUCCESS" in _step_events(good, "web_deduped")
    assert _materialized(instance, "web_deduped") == {"good"}
    severities = {c.severity for c in bad.get_asset_check_evaluations() if not c.passed}
    assert severities == {dg.AssetCheckSeverity.ERROR}  # blocking, not warn-only


def test_the_graph_built_for_a_profile_tracks_and_stores_in_that_profiles_state_dir(tmp_path, monkeypatch):
    from assets.definitions import definitions
    from infra.settings import load_profile

    for name in ("a", "b"):
        monkeypatch.setenv("CRUCIBLE_STATE_DIR", str(tmp_path / name))
        resources = definitions(load_profile()).resources
        assert resources["mlflow"].tracking_uri == f"sqlite:///{tmp_path / name / 'mlflow' / 'mlflow.db'}"
        assert resources["store"].url.startswith(str(tmp_path / name))
