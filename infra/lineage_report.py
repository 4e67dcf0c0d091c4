"""The lineage report of a stage run (a checkpoint): the tree of MLflow runs it read from, back to the roots.

Each node is one run; its `reads` are the committed outputs the stage recorded reading (prefix, version and
producer, `crucible.upstream_data_versions`), each checked against the prefix's current `_committed.json`:

- ok: the version read is still the committed one;
- stale: the prefix has been re-committed since (an upstream re-materialized after this run read it);
- gone: the prefix has no readable pointer any more (broken);
- unlinked: no upstream run of the recorded producer is in the tree (broken: the walk cannot go on);
- unreadable: the run's recorded reads are not a JSON map (a hand-edited or truncated tag; broken).

A declared upstream the stage did not read (`crucible.lineage_missing`) and an upstream run id MLflow does not
know are broken links too. `exit_code` maps a report to the CLI's exit status.
"""

from __future__ import annotations

import html
import json
from typing import Any

from pydantic import ValidationError

from infra.committed import POINTER, CommittedOutput
from infra.store import ObjectStore, StoreError
from infra.tracking import LINEAGE_MISSING_TAG, SOURCES_TAG, UPSTREAM_RUNS_TAG, UPSTREAM_VERSIONS_TAG

EXIT_BROKEN = 3  # a link cannot be followed (kept: scripts already test for 3)
EXIT_STALE = 4  # every link follows, but some run read a version that has since been replaced
STATUS_TAG = "crucible.lineage_status"  # ok / stale / broken, on a registered checkpoint's run
BROKEN_READS = ("gone", "unlinked", "unreadable")


def lineage(client: Any, run_id: str, store: ObjectStore | None = None) -> dict:
    """The tree under `run_id` (MlflowException if that run does not exist); reads are checked against
    `store` when given. The root carries the summary: lineage_status, broken_links, stale_links."""
    root = _node(client, client.get_run(run_id), store, {})
    broken, stale = problems(root)
    root["lineage_status"] = "broken" if broken else "stale" if stale else "ok"
    root["broken_links"], root["stale_links"] = broken, stale
    return root


def _describe(run: Any) -> dict:
    tags = run.data.tags
    return {
        "run_id": run.info.run_id,
        "asset": tags.get("dagster.asset_key", run.info.run_name or ""),
        "partition": tags.get("dagster.partition_key", ""),
        "dagster_run_id": tags.get("dagster.run_id", ""),
        "data_version": tags.get("crucible.data_version", ""),
        "code_version": tags.get("crucible.code_version", ""),
        "git_commit": tags.get("crucible.git_commit", ""),
        "sources": [x for x in tags.get(SOURCES_TAG, "").split(",") if x],  # external: a leaf's inputs
        "upstream": [],
        "missing": [],
        "reads": [],
        "error": "",
        "seen": False,
    }


def label(node: dict) -> str:
    """`asset[partition]`, the producer label reads record (infra/committed.Producer via assets/tracked)."""
    return f"{node['asset']}[{node['partition']}]"


def _node(client: Any, run: Any, store: ObjectStore | None, seen: dict[str, dict]) -> dict:
    node = _describe(run)
    seen[node["run_id"]] = node
    tags = run.data.tags
    node["missing"] = [a for a in tags.get(LINEAGE_MISSING_TAG, "").split(",") if a]
    node["reads"] = _reads(tags.get(UPSTREAM_VERSIONS_TAG), store, node)
    for up in dict.fromkeys(filter(None, tags.get(UPSTREAM_RUNS_TAG, "").split(","))):
        if up == node["run_id"]:  # the stage re-read its own output: no edge
            continue
        node["upstream"].append(_child(client, up, store, seen))
    _link_reads(node)
    return node


def _child(client: Any, run_id: str, store: ObjectStore | None, seen: dict[str, dict]) -> dict:
    from mlflow.exceptions import MlflowException

    if run_id in seen:  # a diamond (task suites read by SFT data and by RL): shown once, referenced after
        first = seen[run_id]
        return {**first, "upstream": [], "missing": [], "reads": [], "seen": True}
    try:
        run = client.get_run(run_id)
    except MlflowException:
        lost = {**_describe_lost(run_id), "error": f"no MLflow run {run_id} (deleted, or another server)"}
        seen[run_id] = lost
        return lost
    return _node(client, run, store, seen)


def _describe_lost(run_id: str) -> dict:
    keys = ("asset", "partition", "dagster_run_id", "data_version", "code_version", "git_commit")
    return {"run_id": run_id, **dict.fromkeys(keys, ""), "sources": [], "upstream": [], "missing": [], "reads": [],
            "error": "", "seen": False}  # fmt: skip


def _reads(raw: str | None, store: ObjectStore | None, node: dict) -> list[dict]:
    """The recorded reads, each with the prefix's current version and a status."""
    if raw is None:
        return []
    try:
        recorded = json.loads(raw)
        items = [(p, str(r["asset"]), str(r["version"])) for p, r in sorted(recorded.items())]
    except (ValueError, TypeError, KeyError, AttributeError):  # a hand-edited or truncated tag
        return [{"prefix": "?", "asset": "?", "version": "", "current": "", "status": "unreadable",
                 "detail": f"{UPSTREAM_VERSIONS_TAG} is not a JSON map of reads"}]  # fmt: skip
    return [_check_read(store, prefix, asset, version, node) for prefix, asset, version in items]


def _check_read(store: ObjectStore | None, prefix: str, asset: str, version: str, node: dict) -> dict:
    read = {"prefix": prefix, "asset": asset, "version": version, "current": "", "status": "ok", "detail": ""}
    if store is None:  # no store to compare with: only the links are checked
        return read
    current, problem = _current(store, prefix)
    if current is None:
        return {**read, "status": "gone", "detail": problem}
    read["current"] = current.version
    # the run that read it may have committed the prefix itself afterwards (an index it appends to)
    if current.version != version and current.producer.mlflow_run_id != node["run_id"]:
        producer = current.producer
        by = f"{producer.asset}[{producer.partition}] run {producer.mlflow_run_id or '?'}"
        read.update(status="stale", detail=f"re-committed since by {by}")
    return read


def _current(store: ObjectStore, prefix: str) -> tuple[CommittedOutput | None, str]:
    """The prefix's pointer, or None and why. Not `read_committed`: the walk must not count as a stage's
    read (inside `run_stage` the handle is still recording the stage's reads)."""
    key = f"{prefix}/{POINTER}"
    try:
        if not store.exists(key):
            return None, f"{store.uri(key)} is gone (no committed version)"
        return CommittedOutput.model_validate_json(store.get_bytes(key)), ""
    except (StoreError, ValidationError) as exc:
        return None, f"{store.uri(key)} is unreadable: {str(exc)[:200]}"


def _link_reads(node: dict) -> None:
    """A read whose producer is neither an upstream run in the tree nor this run cannot be walked further."""
    linked = {label(child) for child in node["upstream"] if not child["error"]} | {label(node)}
    for read in node["reads"]:
        if read["status"] == "ok" and read["asset"] not in linked:
            read.update(status="unlinked", detail="no MLflow run of its producer is recorded")


def problems(node: dict, parent: str = "") -> tuple[list[str], list[str]]:
    """(broken links, stale links) under `node`, one line each; a referenced (seen) node is counted once."""
    if node["seen"]:
        return [], []
    who = label(node)
    broken = [f"no recorded read of {asset} (by {node['asset']})" for asset in node["missing"]]
    if node["error"]:
        broken.append(f"{node['error']} (upstream of {parent})")
    stale = []
    for read in node["reads"]:
        line = f"{read['prefix']}@{read['version'][:12]} read by {who}: {read['detail']}"
        if read["status"] in BROKEN_READS:
            broken.append(line)
        elif read["status"] == "stale":
            stale.append(f"{line}, now @{read['current'][:12]}")
    for child in node["upstream"]:
        b, s = problems(child, who)
        broken += b
        stale += s
    return broken, stale


def exit_code(tree: dict) -> int:
    broken, stale = problems(tree)
    return EXIT_BROKEN if broken else EXIT_STALE if stale else 0


def _edge(parent: dict | None, node: dict) -> list[dict]:
    """The parent's reads of this node's outputs."""
    if parent is None:
        return []
    return [r for r in parent["reads"] if r["asset"] == label(node)]


def _edge_text(reads: list[dict]) -> str:
    parts = []
    for r in reads:
        text = f"{r['prefix']}@{r['version'][:12]}"
        if r["status"] == "stale":
            text += f" stale (now @{r['current'][:12]})"
        elif r["status"] != "ok":
            text += f" {r['status']}"
        parts.append(text)
    return f"  read {', '.join(parts)}" if parts else ""


def _node_text(node: dict) -> str:
    part = f"[{node['partition']}]" if node["partition"] else ""
    if node["error"]:
        return f"{node['run_id']}: {node['error']} (lineage broken)"
    if node["seen"]:
        return f"{node['asset']}{part}  mlflow={node['run_id']} (see above)"
    return (
        f"{node['asset']}{part}  mlflow={node['run_id']} dagster={node['dagster_run_id']} "
        f"data={node['data_version'][:16]} code={node['code_version'] or '-'}"
        + (f" sources={','.join(node['sources'])}" if node["sources"] else "")
    )


def render_text(tree: dict) -> str:
    """The indented tree: one line per run (with the version it was read at), then its broken reads."""
    lines: list[str] = []

    def show(node: dict, parent: dict | None, depth: int) -> None:
        lines.append("  " * depth + _node_text(node) + _edge_text(_edge(parent, node)))
        pad = "  " * (depth + 1)
        for child in node["upstream"]:
            show(child, node, depth + 1)
        for asset in node["missing"]:  # declared upstream the stage recorded no read of
            lines.append(f"{pad}{asset}: no recorded read (lineage broken)")
        for read in node["reads"]:
            if read["status"] in BROKEN_READS:
                lines.append(f"{pad}{read['prefix']}@{read['version'][:12]} ({read['asset']}): "
                             f"{read['detail']} (lineage broken)")  # fmt: skip

    show(tree, None, 0)
    return "\n".join(lines)


_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}
ul{list-style:none;padding-left:1.4em;border-left:1px solid #ddd}li{margin:.25em 0}
.asset{font-weight:600}.meta{color:#666;font-family:monospace;font-size:12px}
.read{font-family:monospace;font-size:12px;color:#264}
.stale{color:#a60;font-weight:600}.broken{color:#b00;font-weight:600}.ok{color:#270}"""


def render_html(tree: dict, title: str = "") -> str:
    """A self-contained page (inline CSS, no scripts) of the tree and its broken and stale links."""
    broken, stale = problems(tree)
    status = "broken" if broken else "stale" if stale else "ok"
    esc = html.escape
    title = title or f"Lineage of {label(tree)}"
    summary = "".join(f'<li class="broken">broken: {esc(x)}</li>' for x in broken)
    summary += "".join(f'<li class="stale">stale: {esc(x)}</li>' for x in stale)
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{esc(title)}</h1>"
        f'<p>lineage: <span class="{status}">{status}</span></p><ul>{summary}</ul>'
        f"<ul>{_node_html(tree, None)}</ul></body></html>\n"
    )


def _node_html(node: dict, parent: dict | None) -> str:
    esc = html.escape
    part = f"[{node['partition']}]" if node["partition"] else ""
    if node["error"]:
        head = f'<span class="broken">{esc(node["run_id"])}: {esc(node["error"])}</span>'
    else:
        meta = "(see above)" if node["seen"] else (
            f"mlflow={node['run_id']} dagster={node['dagster_run_id']} data={node['data_version']} "
            f"code={node['code_version'] or '-'} git={node['git_commit'][:12]}"
            + (f" sources={','.join(node['sources'])}" if node["sources"] else "")
        )  # fmt: skip
        head = f'<span class="asset">{esc(node["asset"] + part)}</span> <span class="meta">{esc(meta)}</span>'
    for read in _edge(parent, node):
        cls = {"ok": "read", "stale": "stale"}.get(read["status"], "broken")
        now = f" (now @{read['current']})" if read["status"] == "stale" else ""
        head += f' <span class="{cls}">read {esc(read["prefix"])}@{esc(read["version"])} {read["status"]}{now}</span>'
    items = [_node_html(child, node) for child in node["upstream"]]
    items += [f'<li class="broken">{esc(a)}: no recorded read (lineage broken)</li>' for a in node["missing"]]
    items += [
        f'<li class="broken">{esc(r["prefix"])}@{esc(r["version"])}: {esc(r["detail"])} (lineage broken)</li>'
        for r in node["reads"]
        if r["status"] in BROKEN_READS
    ]
    return f"<li>{head}" + (f"<ul>{''.join(items)}</ul>" if items else "") + "</li>"
