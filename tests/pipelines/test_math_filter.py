"""The math & science filter end to end on real sources (web pages from Debian git-doc, SymPy docs,
champ-dataset problems) with the judge behind a real OpenAI-compatible HTTP server (the deterministic
keyword scorer of infra/llm_server.py): synthetic docs dropped and counted, kept docs published, the
distilled classifier's agreement with the judge reported, and a rerun asks the judge nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from png_check import assert_drawn_png  # tests/pipelines is on sys.path (prepend import mode)

from classifiers.judge.backends import OpenAIChatBackend
from classifiers.judge.client import JudgeClient
from classifiers.judge.judge_config import prompt_name
from classifiers.judge.prompt_files import load_prompt
from infra.committed import commit, read_committed
from infra.llm_server import llm_server_process
from infra.local_web import fetch_doc_package
from infra.settings import REPO_ROOT, load_profile, validate_stage
from infra.store import LocalStore
from pipelines.knowledge.document_shards import read_documents, write_documents
from pipelines.math.doc_pages import doc_page_paths, iter_doc_pages
from pipelines.math.math_filter import TASK, MathFilterConfig, run_math_filter

CACHE = REPO_ROOT / ".crucible" / "cache" / "debian-docs"
SYNTHETIC = [
    "As an AI language model, I can explain fractions. A fraction is a part of a whole, like 1/2 or 3/4. "
    "To add two fractions, write them over a common denominator: 1/2 + 1/3 = 3/6 + 2/6 = 5/6. To multiply "
    "them, multiply the numerators and the denominators: 2/3 * 3/4 = 6/12 = 1/2. Practice with 3/5 + 1/10.",
    " ".join(f"Exercise {i}: compute {i} + {i}. Answer: {2 * i}." for i in range(40)),
]


@pytest.fixture(scope="module")
def judge_url():
    with llm_server_process("--keyword-scorer") as url:
        yield url


def chat_requests(url: str) -> int:
    return requests.get(f"{url}/stats", timeout=5).json().get("requests/chat", 0)


def web_store(root: Path) -> LocalStore:
    store = LocalStore(root)
    html = fetch_doc_package("git-doc", CACHE) / "usr/share/doc/git-doc"
    pages = [
        {"text": p.main_text, "id": f"git-doc/{Path(p.path).name}", "metadata": {"url": p.path}}
        for p in iter_doc_pages(html, min_chars=300, paths=doc_page_paths(html)[:60])
    ][:26]
    pages += [
        {"text": t, "id": f"synthetic/{i}", "metadata": {"url": f"s{i}"}} for i, t in enumerate(SYNTHETIC)
    ]
    write_documents(root.parent / "web_input" / "kept/00000.jsonl.gz", pages)
    commit(store, "web/filtered/s1", root.parent / "web_input")  # as the web_filtered stage does
    return store


def test_math_filter_keeps_math_drops_synthetic_and_reruns_from_cache(judge_url, tmp_path):
    store = web_store(tmp_path / "store")
    config = validate_stage(load_profile("micro"), "math_filter", MathFilterConfig)
    assert config.judge.backend == "openai" and not config.distill_embeddings

    def judge() -> JudgeClient:
        backend = OpenAIChatBackend(judge_url, "keyword-scorer", timeout_s=30, max_retries=2, backoff_s=0.01)
        return JudgeClient(backend, load_prompt(prompt_name(config.judge, TASK)), store, config.judge.client)

    before = chat_requests(judge_url)
    result = run_math_filter(store, config, tmp_path / "work", tag="t1", judge=judge(), debian_cache=CACHE)
    m = result.metrics
    calls = chat_requests(judge_url) - before
    assert calls == m["judge/calls"] + m["judge/retries"] and m["judge/calls"] > 40  # 24 probes + chunks

    assert (
        m["candidates/web"] == 28
        and m["candidates/python-sympy-doc"] == 30
        and m["candidates/champ-dataset"] == 30
    )
    assert m["dropped/synthetic/assistant_phrases"] == 1 and m["dropped/synthetic/template_repetition"] == 1
    assert m["after_synthetic_filter"] == 86
    kept = list(read_documents(store, result.outputs["kept"]))
    dropped = list(read_documents(store, result.outputs["dropped"]))
    assert len(kept) == m["kept"] and len(kept) + len(dropped) == 88
    kept_by_source = {s: sum(d["metadata"]["source"] == s for d in kept) for s in ("web", "champ-dataset")}
    assert kept_by_source["champ-dataset"] >= 10 and kept_by_source["web"] <= 3  # git manual pages go
    assert all("math_score" in d["metadata"] for d in kept)
    assert {d["metadata"]["drop_reason"] for d in dropped} >= {
        "synthetic/assistant_phrases",
        "below_math_threshold",
    }

    assert (
        m["distill/fasttext/auc"] >= 0.8 and m["distill/fasttext/spearman"] > 0.4
    )  # student agrees with judge
    assert m["judge_gate/n_probes"] == 24 and "judge_gate/auc" in m
    assert "| fasttext |" in result.report_md and result.extra["applied_student"] == "fasttext"
    assert store.exists(result.outputs["classifier"])
    committed = read_committed(store, "math/filtered/t1")
    assert committed.names(under="model") == [f"model/{Path(result.outputs['classifier']).name}"]
    assert committed.meta == {"kept": len(kept), "dropped": len(dropped)}
    assert_drawn_png(result.artifacts["plots/math_scores.png"])
    classifier, judge_panel = result.extra["plots"]["math_scores"]["panels"].values()
    assert (
        sum(classifier["kept"]) == m["kept"]
        and sum(classifier["dropped"]) == m["dropped/below_math_threshold"]
    )
    assert sum(classifier["kept"]) + sum(classifier["dropped"]) == m["after_synthetic_filter"]
    assert 0 < sum(judge_panel["judged"]) <= config.judge_sample_size

    before = chat_requests(judge_url)
    rerun = run_math_filter(store, config, tmp_path / "work2", tag="t1", judge=judge(), debian_cache=CACHE)
    assert chat_requests(judge_url) == before  # the second run asks the judge nothing
    assert rerun.metrics.get("judge/calls", 0) == 0 and rerun.metrics["judge/cache_hits"] == m["judge/calls"]
    assert rerun.data_version == result.data_version


@pytest.mark.slow
def test_embedded_judge_separates_solved_problems_from_fortunes(tmp_path):
    """The tiny default judge (SmolLM2-135M in process, the edu_math levels prompt) through the filter's
    chunk-and-aggregate scoring, on documents outside the probe set the prompt wording was chosen on:
    8 champ-dataset solved problems vs 8 fortunes-min quotations and jokes."""
    import time

    from judge_texts import solved_problems_and_fortunes  # tests/ is on sys.path
    from sklearn.metrics import roc_auc_score

    from classifiers.judge.judge_config import build_judge
    from pipelines.math.math_filter import judge_documents

    good, junk = solved_problems_and_fortunes(CACHE)  # shared with tests/classifiers/test_judge_http.py

    started = time.monotonic()
    config = MathFilterConfig()  # tiny defaults: local SmolLM2 judge, edu_math_levels_v1, 1 thread
    assert config.judge.backend == "local"
    judge = build_judge(config.judge, LocalStore(tmp_path / "store"), TASK)
    scores = judge_documents(judge, good + junk, config)
    good_scores, junk_scores = [scores[d["id"]] for d in good], [scores[d["id"]] for d in junk]
    auc = roc_auc_score([1] * 8 + [0] * 8, good_scores + junk_scores)
    gap = sum(good_scores) / 8 - sum(junk_scores) / 8
    # Measured on 10 + 10 such documents: AUC 0.94, mean scores 3.68 vs 1.74 (gap 1.94); two fortunes (3.6,
    # 3.1) score like mathematics. A judge that reads nothing of the document gives AUC ~0.5 and gap ~0.
    assert auc >= 0.8 and gap >= 1.0, (good_scores, junk_scores)
    print(f"embedded judge: AUC {auc:.3f}, gap {gap:.2f}, {time.monotonic() - started:.0f} s")
