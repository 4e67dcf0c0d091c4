"""Real texts for judge separation tests, outside the probe set the judge prompts were worded on: solved
competition problems (champ-dataset) and fortunes-min quotations and jokes (a Debian package). Shared by
the in-process judge test (tests/pipelines/test_math_filter.py) and the HTTP one
(tests/classifiers/test_judge_http.py); import as `from judge_texts import ...` (tests/ is on sys.path)."""

from __future__ import annotations

from pathlib import Path

from classifiers.judge.quality_gate import load_probe_set
from infra.local_web import fetch_doc_package
from pipelines.knowledge.fortunes import read_fortunes
from pipelines.math.candidates import champ_candidates


def solved_problems_and_fortunes(debian_cache: Path, n: int = 8) -> tuple[list[dict], list[dict]]:
    """`n` champ-dataset solved problems and `n` fortunes of >= 200 characters, none of them a probe:
    documents `{"text", "id"}`, in a fixed order."""
    probes = load_probe_set()
    probe_refs, probe_starts = {p.get("ref") for p in probes}, {p["text"][:200] for p in probes}
    good = [d for d in champ_candidates() if d["id"].removeprefix("champ:") not in probe_refs][:n]
    fortunes = [
        f
        for path in sorted(fetch_doc_package("fortunes-min", debian_cache).rglob("fortunes/*"))
        if path.is_file() and not path.suffix
        for f in read_fortunes(path, min_chars=200)
        if f.text[:200] not in probe_starts
    ]
    junk = [{"text": f.text, "id": f"fortune:{f.collection}:{f.index}"} for f in fortunes[:n]]
    assert len(good) == len(junk) == n
    return good, junk
