"""World-knowledge classifier on real data: the MediaWiki dump in the gensim wheel, Debian dict-* packages
and fortunes, and real web pages (Debian git-doc HTML) as the crawled web. Held-out AUC >= 0.95."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from classifiers.embedding_quality import SentenceEmbedder
from classifiers.labelled_text import LabelledText
from infra.committed import commit
from infra.local_web import fetch_doc_package
from infra.settings import load_profile, validate_stage
from infra.store import LocalStore
from pipelines.knowledge.dictd import decode_dictd_number, read_dictd
from pipelines.knowledge.document_shards import read_documents, write_documents
from pipelines.knowledge.fortunes import read_fortunes
from pipelines.knowledge.wikipedia_dump import gensim_sample_dump, read_wikipedia_articles, strip_wiki_markup
from pipelines.knowledge.world_knowledge import (
    WorldKnowledgeConfig,
    current_classifier,
    rescue_documents,
    train_world_knowledge,
)
from pipelines.math.doc_pages import iter_doc_pages

# the PNG check the pipeline plot tests use (tests/pipelines/png_check.py; not on sys.path from here)
_spec = importlib.util.spec_from_file_location(
    "png_check", Path(__file__).parents[1] / "pipelines" / "png_check.py"
)
png_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(png_check)


def test_dump_reader_parses_real_articles():
    stats = {}
    articles = list(read_wikipedia_articles(gensim_sample_dump(), stats=stats))
    assert stats == {"articles": 106, "skipped/redirect": 99, "skipped/not_article_namespace": 1}
    by_title = {a.title: a for a in articles}
    assert by_title["Anarchism"].text.startswith("Anarchism is a political philosophy")
    assert by_title["Anarchism"].page_id == 12
    for a in articles:
        assert "[[" not in a.text and "{{" not in a.text and "<ref" not in a.text and "'''" not in a.text
    assert "\nReferences\n" not in by_title["Anarchism"].text  # reference sections are dropped
    assert sum(len(a.text) for a in articles) > 2_000_000


def test_wiki_markup_stripping():
    wikitext = (
        "'''Foo''' is a [[bar (thing)|bar]] in [[Baz]].<ref>Cite</ref>{{Infobox|a={{b}}}}\n"
        "[[File:X.png|thumb|A [[nested]] caption]]\n== History ==\nSee [http://x.org the site].\n"
        "== References ==\n* a ref\n[[Category:Things]]"
    )
    assert strip_wiki_markup(wikitext) == "Foo is a bar in Baz.\n\nHistory\n\nSee the site."


def test_dictd_and_fortune_readers(debian_cache):
    assert (
        decode_dictd_number("B") == 1
        and decode_dictd_number("BA") == 64
        and decode_dictd_number("Gb9L") == 6 * 64**3 + 27 * 64**2 + 61 * 64 + 11
    )
    root = fetch_doc_package("dict-elements", debian_cache)
    entries = {e.headword: e for e in read_dictd(next(root.rglob("elements.index")))}
    assert "Atomic number: 10" in entries["neon"].text
    fortunes = list(
        read_fortunes(next(fetch_doc_package("fortunes-min", debian_cache).rglob("fortunes/literature")))
    )
    assert len(fortunes) > 20 and all("\n%\n" not in f.text for f in fortunes)


@pytest.fixture(scope="module")
def web_store(tmp_path_factory, debian_cache) -> LocalStore:
    """Real web pages (git's HTML manual) as a crawled snapshot: longer pages kept, shorter ones dropped,
    plus 26 Wikipedia articles the classifier never trains on, dropped as if by a heuristic filter."""
    store = LocalStore(tmp_path_factory.mktemp("store"))
    html = fetch_doc_package("git-doc", debian_cache) / "usr/share/doc/git-doc"
    pages = [
        {
            "text": p.main_text,
            "id": f"git-doc/{Path(p.path).name}",
            "metadata": {"url": f"http://127.0.0.1/git-doc/{Path(p.path).name}", "snapshot": "s1"},
        }
        for p in iter_doc_pages(html, min_chars=300)
    ]
    kept = [p for i, p in enumerate(pages) if i % 4]
    dropped = [
        dict(p, metadata=dict(p["metadata"], drop_reason="gopher_repetition"))
        for i, p in enumerate(pages)
        if not i % 4
    ]
    wiki = list(read_wikipedia_articles(gensim_sample_dump()))[80:]
    dropped += [
        {
            "text": a.text[:3000],
            "id": f"wiki/{a.page_id}",
            "metadata": {"url": f"http://127.0.0.1/wiki/{a.page_id}", "drop_reason": "c4_quality"},
        }
        for a in wiki
    ]
    out = tmp_path_factory.mktemp("web_filtered")
    write_documents(out / "kept/00000.jsonl.gz", kept)
    write_documents(out / "dropped/00000.jsonl.gz", dropped)
    commit(store, "web/filtered/s1", out)  # as the web_filtered stage does
    return store


def test_world_knowledge_auc_on_held_out_split_and_rescue(web_store, debian_cache, tmp_path):
    config = validate_stage(load_profile("micro"), "world_knowledge", WorldKnowledgeConfig)
    assert config.judge_sample_size == 0 and config.dropped_negative_fraction == 0.0
    embedder = SentenceEmbedder(max_seq_length=64)  # short inputs keep the test fast; tiny uses 128
    result = train_world_knowledge(
        web_store, config, tmp_path / "work", embedder=embedder, debian_cache=debian_cache
    )
    m = result.metrics
    assert m["world_knowledge_fasttext/auc_encyclopedic_vs_web"] >= 0.95
    assert m["world_knowledge_fasttext/f1"] >= 0.85
    assert m["world_knowledge_minilm/auc_encyclopedic_vs_web"] >= 0.90
    assert m["examples/test"] >= 100 and m["examples_by_source/web/kept:0"] > 100
    assert (
        "| world_knowledge_fasttext |" in result.report_md
        and "| world_knowledge_minilm |" in result.report_md
    )
    assert web_store.exists(result.outputs["world_knowledge_fasttext"])
    assert {"precision", "recall", "f1", "auc", "threshold"} <= set(
        web_store.get_json(result.outputs["model_card"])["world_knowledge_fasttext"]["metrics"]
    )

    # held-out score histograms: every test example once per classifier, by its true label
    png_check.assert_drawn_png(result.artifacts["plots/heldout_scores.png"])
    panels = result.extra["plots"]["heldout_scores"]["panels"]
    assert set(panels) == {"world_knowledge_fasttext", "world_knowledge_minilm"}
    for by_label in panels.values():
        assert sum(sum(c) for c in by_label.values()) == m["examples/test"]
    positives = {name: sum(by_label["knowledge (label 1)"]) for name, by_label in panels.items()}
    assert (
        len(set(positives.values())) == 1 and 0 < positives["world_knowledge_fasttext"] < m["examples/test"]
    )

    threshold = result.extra["thresholds"]["world_knowledge_fasttext"]
    assert current_classifier(web_store, config) == (
        "world_knowledge_fasttext",
        result.outputs["world_knowledge_fasttext"],
        threshold,
        result.data_version,
    )
    rescue = rescue_documents(web_store, config, result.outputs["world_knowledge_fasttext"], threshold, "s1")
    rescued = list(read_documents(web_store, rescue.outputs["rescued"]))
    wiki_rescued = sum(d["id"].startswith("wiki/") for d in rescued)
    m = rescue.metrics
    # Every dropped document of the snapshot is scored once and counted under its own drop reason.
    dropped_ids = [d["id"] for d in read_documents(web_store, "web/filtered/s1/dropped/")]
    n_git = sum(i.startswith("git-doc/") for i in dropped_ids)
    assert n_git > 20 and len(dropped_ids) == n_git + 26
    assert m["dropped_docs"] == m["scored"] == n_git + 26
    assert m["dropped_in/gopher_repetition"] == n_git and m["dropped_in/c4_quality"] == 26
    assert m["rescued"] == len(rescued)
    assert m["rescued/c4_quality"] == wiki_rescued
    assert m.get("rescued/gopher_repetition", 0) == len(rescued) - wiki_rescued
    assert wiki_rescued >= 23  # unseen Wikipedia articles come back
    assert len(rescued) - wiki_rescued <= 3  # git manual pages stay dropped
    assert rescue.sample and rescue.sample[0]["score"] >= 0.9
    # plots: every scored document in the histogram, rescued ones right of the threshold; bars per reason
    assert set(rescue.artifacts) == {"plots/rescue_scores.png", "plots/rescued_by_reason.png"}
    for path in rescue.artifacts.values():
        png_check.assert_drawn_png(path)
    (hist,) = rescue.extra["plots"]["rescue_scores"]["panels"].values()
    (edges,) = rescue.extra["plots"]["rescue_scores"]["edges"].values()
    assert sum(hist["rescued"]) == m["rescued"] and sum(hist["left dropped"]) == m["scored"] - m["rescued"]
    assert all(hi > threshold for n, hi in zip(hist["rescued"], edges[1:], strict=True) if n)
    bars = rescue.extra["plots"]["rescued_by_reason"]["panels"]["per drop reason"]
    assert bars == {
        "dropped": [m["dropped_in/c4_quality"], m["dropped_in/gopher_repetition"]],
        "rescued": [m["rescued/c4_quality"], m.get("rescued/gopher_repetition", 0)],
    }

    # dropped docs used as training negatives (cluster option) are never rescued by the same model
    shared = config.model_copy(update={"dropped_negative_fraction": 0.3})
    m = rescue_documents(
        web_store, shared, result.outputs["world_knowledge_fasttext"], threshold, "s1"
    ).metrics
    assert (
        m["scored"] + m["skipped/trained_on"] == m["dropped_docs"]
        and 0 < m["skipped/trained_on"] < m["scored"]
    )


def test_judge_labelled_web_samples_join_the_training_data(web_store, debian_cache, judge_server, tmp_path):
    from classifiers.judge.backends import OpenAIChatBackend
    from classifiers.judge.client import JudgeClient, JudgeClientConfig
    from classifiers.judge.prompt_files import load_prompt
    from pipelines.knowledge.world_knowledge import assemble_examples

    config = WorldKnowledgeConfig(
        max_wikipedia_passages=20,
        dictionaries=["dict-elements"],
        max_passages_per_dictionary=20,
        low_value_packages=["fortunes-min"],
        max_low_value=20,
        judge_sample_size=30,
        judge_positive_min=2.0,
        dropped_negative_fraction=0.0,
        judge_negative_max=0.5,
    )
    judge = JudgeClient(
        OpenAIChatBackend(judge_server.url, "m", backoff_s=0.01),
        load_prompt("world_knowledge_v1"),
        LocalStore(tmp_path / "judge"),
        JudgeClientConfig(show_progress=False, calibrate=False),
    )
    stats: dict = {}
    examples = assemble_examples(web_store, config, judge, debian_cache, stats)
    labelled = stats.get("judge/web_positive", 0) + stats.get("judge/web_negative", 0)
    assert labelled + stats.get("judge/web_uncertain", 0) == 30 and labelled > 0
    sources = {e.source for e in examples}
    assert "judge/web-low" in sources or "judge/web" in sources
    assert sum(e.source.startswith("judge/") for e in examples) == labelled
    assert all(e.label == 1 for e in examples if e.source == "judge/web")


def test_encyclopedic_vs_web_auc_counts_judge_low_pages_as_web_and_leaves_judge_positives_out():
    from pipelines.knowledge.world_knowledge import encyclopedic_vs_web_auc

    test = [
        LabelledText("a", 1, "wikipedia", "A"),
        LabelledText("b", 1, "dict-foldoc", "B"),
        LabelledText("c", 0, "judge/web-low", "C"),  # a web page the judge scored low: still web
        LabelledText("d", 1, "judge/web", "D"),  # a web page the judge called knowledge: neither side
        LabelledText("e", 0, "fortunes", "E"),  # low-value text is not a web page
    ]
    assert encyclopedic_vs_web_auc(test, [0.9, 0.8, 0.7, 0.1, 0.95]) == 1.0
    assert encyclopedic_vs_web_auc(test, [0.9, 0.6, 0.7, 0.1, 0.0]) == 0.5
