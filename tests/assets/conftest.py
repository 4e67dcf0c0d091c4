"""Fixtures for the Dagster layer: an isolated DAGSTER_HOME and a live `dagster dev` (webserver + daemon)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from local_servers import dagster_dev, static_site
from local_servers import graphql as run_graphql

from infra.settings import REPO_ROOT

BIN = Path(sys.executable).parent


@pytest.fixture
def graphql():
    """POST a GraphQL query to a webserver; returns `data`, failing on GraphQL errors."""
    return run_graphql


@pytest.fixture
def dagster_webserver(dagster_home, port):
    """`dagster dev` on 127.0.0.1 in its own process group (it ignores signals otherwise)."""
    with dagster_dev(["-m", "assets.definitions"], port, dagster_home / "dagster_dev.log", REPO_ROOT) as url:
        yield url


POST_TRAINING_CORPUS = [
    "What is 3 + 4? Answer: 7. Use the calculator to compute 12 * 34. def f(x): return x + 1",
    "Which term is defined as: a computer program? Answer: software",
] * 40


@pytest.fixture
def midtrained(tmp_path, dagster_home):
    """A committed tokenizer and a micro `midtrain_stage3` checkpoint, as the training job would leave them:
    where the post-training chain tests start. Returns the store."""
    from assets.midtraining import checkpoint_prefix
    from assets.post_training import _model_cfg
    from assets.pretraining import TOKENIZER_PREFIX
    from infra.committed import Producer, commit
    from infra.settings import load_profile
    from infra.store import LocalStore
    from training.checkpoint import export_hf
    from training.model import build_model
    from training.tokenizer import TokenizerConfig, train_tokenizer

    profile = load_profile()
    store = LocalStore(profile.state_path / profile.store.url)
    tok_dir = train_tokenizer(POST_TRAINING_CORPUS, TokenizerConfig(vocab_size=512), tmp_path / "tok")
    files = {n: tok_dir / n for n in ("tokenizer.json", "tokenizer_config.json")}
    store.begin_stage(Producer(asset="corpus_tokenizer"))
    commit(store, TOKENIZER_PREFIX, files)
    cfg, _ = _model_cfg(tok_dir)
    hf = export_hf(build_model(cfg, seed=0), tmp_path / "hf", files)
    store.begin_stage(Producer(asset="midtrain_stage3", mlflow_run_id="parent-run"))
    commit(store, checkpoint_prefix("midtrain_stage3"), hf)
    return store


def _is_prose(paragraph: str) -> bool:
    words = paragraph.split()
    return len(words) >= 8 and sum(w.strip(".,;:()'\"").isalpha() for w in words) >= 0.9 * len(words)


def _docs_pages() -> dict[str, str]:
    """Interlinked HTML pages of real English prose: the docstrings of standard-library modules."""
    import html
    import importlib
    import inspect

    names = [
        "json",
        "argparse",
        "collections",
        "functools",
        "itertools",
        "pathlib",
        "subprocess",
        "logging",
        "threading",
        "unittest",
        "csv",
        "datetime",
        "decimal",
        "fractions",
        "statistics",
        "textwrap",
    ]
    pages = {}
    for i, name in enumerate(names):
        module = importlib.import_module(name)
        parts = [inspect.getdoc(module) or ""]
        for _, obj in inspect.getmembers(module, lambda o: inspect.isclass(o) or inspect.isfunction(o)):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200:
                parts.append(doc)
            if sum(map(len, parts)) > 12000:
                break
        paragraphs = [" ".join(p.split()) for p in "\n\n".join(parts).split("\n\n")]
        body = "".join(f"<p>{html.escape(p)}</p>" for p in paragraphs if _is_prose(p))
        links = " ".join(f'<a href="/{n}.html">{n}</a>' for n in names[i + 1 : i + 4])
        pages[f"/{name}.html"] = (
            f"<html><head><title>{name}</title></head><body><h1>The {name} module</h1>"
            f"<article>{body}</article><nav>{links}</nav></body></html>"
        )
    pages["/index.html"] = (
        "<html><body>" + " ".join(f'<a href="/{n}.html">{n}</a>' for n in names) + "</body></html>"
    )
    return pages


@pytest.fixture(scope="session")
def docs_site():
    """A small local web on 127.0.0.1 (robots.txt allows all); yields the seed URL."""
    with static_site(_docs_pages()) as base:
        yield f"{base}/index.html"
