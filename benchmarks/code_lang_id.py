"""Code language ID benchmark: our content classifier vs guesslang and pygments `guess_lexer`, content only
(no file names), on the same held-out package files of a crawled snapshot.

    .venv/bin/python benchmarks/code_lang_id.py [--snapshot code-0001] [--max-files 3000]
    .venv/bin/python benchmarks/code_lang_id.py --snapshot code-0001 --eval-snapshot code-fresh2-0001 \
        --eval-manifest pipelines/code/manifests/heldout.yaml --max-files 0

Issue 19, the frozen protocol (see README, "Frozen protocol"):

    .venv/bin/python benchmarks/code_lang_id.py crawl --state STATE_DIR    # code-0001, code-langs-0001 to -0004, -dev-0001
    .venv/bin/python benchmarks/code_lang_id.py train --data STATE_DIR:code-0001 STATE_DIR:code-langs-0001 \
        ... STATE_DIR:code-langs-0004 STATE_DIR:code-langs-dev-0001 --frozen-version v4 --out DIR
    .venv/bin/python benchmarks/code_lang_id.py protocol --data ... --model-dir DIR    # ours vs magika
    .venv/bin/python benchmarks/code_lang_id.py log-test DIR    # re-log a finished test report to MLflow
    .venv/bin/python benchmarks/code_lang_id.py train --dev-only --epochs 140 --threads 1 --seed 1 --out DIR
        # a recipe variant scored on dev only (flags: --train-group-cap, --max-train-per-label, --dim, ...)

`train` splits projects into train / dev / test (or reads the frozen split in `classifiers/data/`), chooses the
epochs and the temperature on dev and scores the frozen test set once; `protocol` runs ours and magika (its own
venv, `<state dir>/bench-venv-magika`) on the same frozen test texts in one run.

`--snapshot` defaults to the code snapshot `make run` (`crucible run`) materializes. `--eval-snapshot` scores the
model of `--snapshot` on another crawl (e.g. `manifests/heldout.yaml`, crawled as `code-fresh2-0001`: projects
that share nothing with the training manifest), labelled the way training labels files. Correction rules were
added while watching heldout.yaml's score, so it is a second dev set now, not an untouched test set.

Every table is also split by where the labels came from: `extension` (an unambiguous extension: the headline),
`filename`, `shebang` and `heuristic` (markers for ambiguous extensions). Our classifier reads `#!` lines and
constructs like `@interface` too, so on shebang- and heuristic-labelled files its accuracy is partly circular.

Needs the outputs of `crawl_code` (code/raw/<snapshot>) and `train_code_language_classifier`
(code/language_id/<snapshot>: model + heldout.jsonl.gz) in the profile's store.

guesslang (TensorFlow) never goes into the project venv: on first use this script creates a separate venv
(`<state dir>/bench-venv`: `pip install --no-deps guesslang==2.2.1` + `tensorflow-cpu==2.21.0`) and runs
guesslang there in a subprocess that reads the texts and prints its predictions as JSON. guesslang's saved
model is called directly (`tf.saved_model.load`): its `Guess` wrapper needs `tf.estimator`, gone from TF 2.16+.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from classifiers.code_language import CHAR_MODEL, CodeLanguageClassifier
from classifiers.fasttext_train import classification_report
from infra.settings import load_profile
from infra.stage import markdown_table
from infra.store import open_store
from pipelines.code.crawl import CodeCrawlConfig, crawl_code
from pipelines.code.language_id import CodeLanguageIdConfig, group_of, labelled_files
from pipelines.code.records import read_shards

log = logging.getLogger("code_lang_id")

GUESSLANG_PINS = ["guesslang==2.2.1"]
TENSORFLOW_PIN = "tensorflow-cpu==2.21.0"

# guesslang language names -> ours (its "Lisp" covers both Lisps we label)
GUESSLANG_NAMES = {"Matlab": "MATLAB", "Batchfile": "Batchfile"}
GUESSLANG_LISP = {"Emacs Lisp", "Common Lisp"}

# pygments lexer names -> ours
PYGMENTS_NAMES = {
    "Python": "Python", "Python 2.x": "Python", "C": "C", "C++": "C++", "Java": "Java", "Go": "Go", "Rust": "Rust",
    "JavaScript": "JavaScript", "TypeScript": "TypeScript", "Ruby": "Ruby", "PHP": "PHP", "HTML+PHP": "PHP",
    "Perl": "Perl", "Perl6": "Perl", "Bash": "Shell", "Shell": "Shell", "Lua": "Lua", "Scala": "Scala",
    "Swift": "Swift", "Kotlin": "Kotlin", "Objective-C": "Objective-C", "Objective-C++": "Objective-C",
    "Matlab": "MATLAB", "Octave": "MATLAB", "Haskell": "Haskell", "Erlang": "Erlang", "EmacsLisp": "Emacs Lisp",
    "Common Lisp": "Common Lisp", "Tcl": "Tcl", "S": "R", "R": "R", "SQL": "SQL", "Prolog": "Prolog",
    "Coq": "Coq", "verilog": "Verilog", "systemverilog": "Verilog", "Clojure": "Clojure", "Markdown": "Markdown",
    "JSON": "JSON", "YAML": "YAML", "HTML": "HTML", "CSS": "CSS", "XML": "XML", "Makefile": "Makefile",
    "CMake": "CMake", "TeX": "TeX", "Groovy": "Groovy", "TOML": "TOML", "Scheme": "Scheme", "Racket": "Racket",
}  # fmt: skip

GUESSLANG_RUNNER = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import importlib.util
from pathlib import Path
import tensorflow as tf
# locate guesslang's saved model without importing the package (its __init__ needs tf.estimator, gone in TF 2.16+)
data = Path(importlib.util.find_spec("guesslang").origin).parent / "data"
names = {ext: name for name, ext in json.loads((data / "languages.json").read_text()).items()}
t0 = time.time()
model = tf.saved_model.load(str(data / "model"))
load_s = time.time() - t0
texts = [json.loads(line)["text"] for line in open(sys.argv[1])]
fn = model.signatures["serving_default"]
fn(tf.constant(["warm up"]))
out = []
t0 = time.time()
for text in texts:  # one file per call, as guesslang's own Guess.probabilities does
    pred = fn(tf.constant([text]))
    scores = pred["scores"][0].numpy()
    classes = pred["classes"][0].numpy()
    out.append(names[classes[scores.argmax()].decode()])
print(json.dumps({"predictions": out, "seconds": time.time() - t0, "load_seconds": load_s}))
"""


def ensure_bench_venv(venv: Path) -> Path:
    """A separate venv with guesslang + tensorflow-cpu (never the project venv); returns its python."""
    python = venv / "bin" / "python"
    marker = venv / ".guesslang-ready"
    if marker.exists():
        return python
    log.info("creating %s with guesslang and %s (one time, a few minutes)", venv, TENSORFLOW_PIN)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--no-deps", *GUESSLANG_PINS], check=True)
    subprocess.run([*pip, TENSORFLOW_PIN], check=True)
    marker.write_text("ok\n")
    return python


def run_guesslang(python: Path, texts: list[str]) -> tuple[list[str], float]:
    with tempfile.TemporaryDirectory(prefix="crucible-guesslang-") as tmp:
        inp = Path(tmp) / "texts.jsonl"
        inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        runner = Path(tmp) / "runner.py"
        runner.write_text(GUESSLANG_RUNNER)
        proc = subprocess.run(
            [str(python), str(runner), str(inp)], capture_output=True, text=True, timeout=7200
        )
        if proc.returncode != 0:
            raise RuntimeError(f"guesslang runner failed: {proc.stderr[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    preds = [GUESSLANG_NAMES.get(p, p) for p in result["predictions"]]
    return preds, result["seconds"]


def run_pygments(texts: list[str]) -> tuple[list[str], float]:
    from pygments.lexers import guess_lexer
    from pygments.util import ClassNotFound

    preds = []
    t0 = time.time()
    for text in texts:
        try:
            name = guess_lexer(text).name
        except ClassNotFound:
            name = ""
        preds.append(PYGMENTS_NAMES.get(name, name))
    return preds, time.time() - t0


def load_heldout(
    store, snapshot: str, max_files: int, seed: int
) -> tuple[list[str], list[str], list[str], Path]:
    """Texts, labels and label sources (`extension`, `heuristic`, `shebang`, `filename`) of held-out files."""
    prefix = f"code/language_id/{snapshot}"
    heldout = [
        json.loads(x) for x in gzip.decompress(store.get_bytes(f"{prefix}/heldout.jsonl.gz")).splitlines()
    ]
    wanted = {h["id"]: h for h in heldout}
    texts = {r["id"]: r["text"] for r in read_shards(store, f"code/raw/{snapshot}") if r["id"] in wanted}
    ids = sorted(i for i in wanted if i in texts)
    if max_files and len(ids) > max_files:
        ids = sorted(random.Random(seed).sample(ids, max_files))
    labels = [wanted[i]["label"] for i in ids]
    how = [wanted[i].get("how", "unknown") for i in ids]
    return [texts[i] for i in ids], labels, how, Path(prefix)


def load_other_snapshot(
    store, model_snapshot: str, snapshot: str, max_files: int, seed: int
) -> tuple[list[str], list[str], list[str], Path]:
    """Texts, labels and label sources of `snapshot`'s labelled files in the languages the model of
    `model_snapshot` was scored on, minus any package (or file content) the model's snapshot contains."""
    prefix = f"code/language_id/{model_snapshot}"
    languages = set(json.loads(store.get_bytes(f"{prefix}/eval.json"))["labels"])
    seen_groups, seen_sha = set(), set()
    for rec in read_shards(store, f"code/raw/{model_snapshot}"):
        seen_groups.add(group_of(rec["metadata"]))
        seen_sha.add(rec["metadata"]["sha256"])
    stats: Counter = Counter()
    files = []
    for rec in read_shards(store, f"code/raw/{snapshot}"):
        if group_of(rec["metadata"]) in seen_groups or rec["metadata"]["sha256"] in seen_sha:
            stats["dropped/in_model_snapshot"] += 1
            continue
        files.extend(labelled_files([rec], CodeLanguageIdConfig(), stats))
    files = [f for f in files if f["label"] in languages]
    if not files:
        raise SystemExit(f"no labelled files of the model's languages in code/raw/{snapshot}: crawl it first")
    files.sort(key=lambda f: f["id"])
    if max_files and len(files) > max_files:
        files = sorted(random.Random(seed).sample(files, max_files), key=lambda f: f["id"])
    log.info("%s: %d labelled files in %d packages (%s)", snapshot, len(files),
             len({f["group"] for f in files}), dict(stats))  # fmt: skip
    return [f["text"] for f in files], [f["label"] for f in files], [f["how"] for f in files], Path(prefix)


def score(name: str, y_true: list[str], y_pred: list[str], files_per_s: float, labels: list[str]) -> dict:
    rep = classification_report(y_true, y_pred, labels)
    return {"method": name, "files": len(y_true), "languages": len(labels), "accuracy": round(rep.accuracy, 4),
            "macro_f1": round(rep.macro_f1, 4), "files_per_s": round(files_per_s, 1)}  # fmt: skip


# the code snapshot partition `crucible run` (`make run`) materializes (assets/cli.py `--code-snapshot`)
DEFAULT_SNAPSHOT = "code-0001"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--snapshot", default=DEFAULT_SNAPSHOT, help="snapshot whose model (and held-out files) to score"
    )
    ap.add_argument(
        "--eval-snapshot", default=None, help="score on this crawl's files instead of the held-out packages"
    )
    ap.add_argument(
        "--eval-manifest",
        type=Path,
        default=None,
        help="crawl --eval-snapshot from this manifest first if the store does not have it yet",
    )
    ap.add_argument("--max-files", type=int, default=3000, help="seeded sample of held-out files (0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bench-venv", type=Path, default=None, help="default: <state dir>/bench-venv")
    ap.add_argument("--skip-guesslang", action="store_true")
    ap.add_argument(
        "--workers", type=int, default=1, help="processes for our classifier (default 1: the fair comparison)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    profile = load_profile()
    store = open_store(profile.store, profile.state_path)
    if args.eval_manifest and not args.eval_snapshot:
        ap.error("--eval-manifest needs --eval-snapshot (the snapshot name to crawl it as)")
    if args.eval_manifest and not store.list(f"code/raw/{args.eval_snapshot}/"):
        crawl_code(CodeCrawlConfig(manifest=str(args.eval_manifest)), store, args.eval_snapshot)
    if args.eval_snapshot:
        texts, y_true, how, prefix = load_other_snapshot(
            store, args.snapshot, args.eval_snapshot, args.max_files, args.seed
        )
        what = f"files of {args.eval_snapshot} (projects absent from {args.snapshot})"
    else:
        texts, y_true, how, prefix = load_heldout(store, args.snapshot, args.max_files, args.seed)
        what = "held-out files (whole packages/components never seen in training)"
    labels = sorted(set(y_true))
    print(f"{len(texts)} {what}, {len(labels)} "
          f"languages; every method reads the file content only (no names, no extensions); "
          f"{args.workers} process(es) for ours, guesslang one file per call as its API does")  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        key = f"{prefix}/code_language.bin"
        key = key if store.exists(key) else key.removesuffix(".bin") + ".ftz"  # quantized
        model = store.download(key, Path(tmp) / key.rsplit("/", 1)[-1])
        clf = CodeLanguageClassifier.load(model)
        clf.predict_content(texts[:50], k=1)  # warm-up, as guesslang's runner does
        t0 = time.time()
        probs = clf.predict_content(texts, k=1, workers=args.workers)
        ours_s = time.time() - t0
    ours = [max(p, key=p.get) for p in probs]
    pyg, pyg_s = run_pygments(texts)
    speed = {"ours": len(texts) / ours_s, "pygments": len(texts) / pyg_s}
    preds = {"ours": ours, "pygments": pyg}
    if not args.skip_guesslang:
        venv = args.bench_venv or profile.state_path / "bench-venv"
        gl, gl_s = run_guesslang(ensure_bench_venv(venv), texts)
        # its one "Lisp" class stands for both Lisps we label
        preds["guesslang"] = [
            y if (g == "Lisp" and y in GUESSLANG_LISP) else g for g, y in zip(gl, y_true, strict=True)
        ]
        speed["guesslang"] = len(texts) / gl_s
        names = json.loads((venv / "lib/python3.11/site-packages/guesslang/data/languages.json").read_text())
        supported = {GUESSLANG_NAMES.get(n, n) for n in names} | GUESSLANG_LISP
    else:
        supported = set(labels)
    method_names = {"ours": "crucible fastText", "guesslang": "guesslang", "pygments": "pygments guess_lexer"}

    def table(idx: list[int]) -> list[dict]:
        sub = [y_true[i] for i in idx]
        sub_labels = sorted(set(sub))
        return [score(method_names[m], sub, [preds[m][i] for i in idx], speed[m], sub_labels) for m in preds]

    everything = list(range(len(texts)))
    in_guesslang = [i for i in everything if y_true[i] in supported]
    sections = {
        "all held-out files, all languages (a language guesslang lacks counts as its error)": everything,
        "languages guesslang supports": in_guesslang,
    }
    # the headline: labels from unambiguous extensions only; then each label source on its own
    for source in ("extension", "filename", "shebang", "heuristic"):
        idx = [i for i in in_guesslang if how[i] == source]
        if idx:
            sections[f"languages guesslang supports, labelled by {source} only"] = idx
    result: dict = {
        "snapshot": args.snapshot,
        "eval_snapshot": args.eval_snapshot,
        "files": len(texts),
        "languages": len(labels),
        "sections": {},
    }
    for title, idx in sections.items():
        rows = table(idx)
        result["sections"][title] = rows
        print(f"\n## {title}\n" + markdown_table(rows))
    ext_idx = [i for i in everything if how[i] == "extension"]
    if ext_idx:  # the headline: no rule of ours read what labelled these files
        ext = [y_true[i] for i in ext_idx]
        result["headline_extension_only"] = score(method_names["ours"], ext, [ours[i] for i in ext_idx],
                                                  speed["ours"], sorted(set(ext)))  # fmt: skip
        print(f"\nheadline (ours, files labelled by an unambiguous extension, all languages): accuracy "
              f"{result['headline_extension_only']['accuracy']:.4f} on {len(ext_idx)} files")  # fmt: skip
    rep = classification_report(y_true, ours, labels)
    focus = {
        lang: round(rep.per_class[lang]["f1"], 4)
        for lang in ("Scala", "Swift", "Lua")
        if lang in rep.per_class
    }
    result["ours_f1"] = {lang: round(v["f1"], 4) for lang, v in rep.per_class.items()}
    print(f"\nours, per-language F1 (all held-out files): {focus}")
    if "guesslang" in preds:
        ours_g, gl_g = (next(r for r in result["sections"]["languages guesslang supports"] if r["method"] == n)
                        for n in ("crucible fastText", "guesslang"))  # fmt: skip
        ratio = speed["ours"] / speed["guesslang"]
        result["ratios_vs_guesslang"] = {"accuracy_points": round(100 * (ours_g["accuracy"] - gl_g["accuracy"]), 2),
                                         "speed": round(ratio, 2)}  # fmt: skip
        print(f"ratios vs guesslang (same files, languages it supports): accuracy {ours_g['accuracy']:.4f} vs "
              f"{gl_g['accuracy']:.4f} ({100 * (ours_g['accuracy'] - gl_g['accuracy']):+.1f} pts), "
              f"speed {speed['ours']:.0f} vs {speed['guesslang']:.0f} files/s = {ratio:.1f}x")  # fmt: skip
    print(f"ratios vs pygments (all files): speed {speed['ours'] / speed['pygments']:.1f}x")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


# --- issue 19: the frozen protocol (train / dev / test by project), calibration, the `unknown` label -------

DATA_DIR = Path(__file__).resolve().parents[1] / "classifiers" / "data"
FROZEN_TEST = DATA_DIR / "code_language_test_v1.json"
FROZEN_DEV = DATA_DIR / "code_language_dev_v1.json"
# snapshots the classifier is trained from: tiny's crawl (33 languages) + classifiers/data/code_language_extra.yaml
# + code_language_extra2.yaml + code_language_extra3.yaml (more training projects for labels with few)
# the corpus crawl `make run` makes, then the pipeline's label and dev-only snapshots
DEFAULT_DATA = ["code-0001", *CodeLanguageIdConfig().label_snapshots, *CodeLanguageIdConfig().dev_snapshots]


def use_frozen_version(version: str) -> None:
    """Point the driver at `code_language_{test,dev}_<version>.json`: a new version when labels or the split
    rule change (v1 stays as it was, with its scores)."""
    global FROZEN_TEST, FROZEN_DEV
    FROZEN_TEST = DATA_DIR / f"code_language_test_{version}.json"
    FROZEN_DEV = DATA_DIR / f"code_language_dev_{version}.json"


def protocol_files(data: list[str], seed: int, per_group_cap: int, min_files: int) -> tuple[list[dict], dict]:
    """Every labelled file of the `data` snapshots (`[STATE_DIR:]SNAPSHOT`) plus the `unknown` texts, by the
    pipeline's protocol (`pipelines/code/language_protocol.py`)."""
    from pipelines.code.crawl import default_cache_dir
    from pipelines.code.language_protocol import protocol_files as build
    from pipelines.code.language_protocol import unknown_files

    profile = load_profile()
    stats: Counter = Counter()
    files: list[dict] = []
    dev_snapshots = CodeLanguageIdConfig().dev_snapshots
    for spec in data:
        state, _, snapshot = spec.rpartition(":")
        store = open_store(profile.store, Path(state) if state else profile.state_path)
        for f in labelled_files(read_shards(store, f"code/raw/{snapshot}"), CodeLanguageIdConfig(), stats):
            files.append({**f, "dev_only": snapshot in dev_snapshots})
    kept, info = build(files + unknown_files(default_cache_dir(), seed), seed, per_group_cap, min_files)
    info["stats"].update(stats)
    return kept, info


def protocol_seed(seed: int, extend_from: str | None = None) -> int:
    """The seed that picks the held-out files and the `unknown` texts: the frozen set's own once there is one (any
    other gives other files, which the frozen lists then miss), else the version it extends, else `seed`."""
    from classifiers.code_language_protocol import load_frozen

    if FROZEN_TEST.exists():
        return load_frozen(FROZEN_TEST)["seed"]
    if extend_from:
        return load_frozen(DATA_DIR / f"code_language_test_{extend_from}.json")["seed"]
    return seed


def assign_splits(files: list[dict], seed: int, extend_from: str | None = None) -> dict:
    """Split by project, or read the frozen split: the first run freezes test and dev (their groups and file
    hashes, sha256 next to them in classifiers/data/); later runs reuse those groups, so no choice can move them.
    `extend_from` (an earlier version) freezes a new version that keeps the earlier held-out projects and splits
    only labels added since (`code_language_protocol.extend_split`); the projects of dev-only crawls join dev, and
    when the test projects are the earlier version's, its test file is kept byte for byte (same sha256)."""
    from classifiers.code_language_protocol import (
        component_groups,
        extend_split,
        frozen_set,
        load_frozen,
        match_frozen,
        split_groups,
        write_frozen,
    )  # fmt: skip
    from pipelines.code.language_protocol import check_dev_only_groups, drop_held_out_copies, frozen_side

    dev_only = check_dev_only_groups(files)
    made = component_groups(files, min_groups=4)
    capped = [f for f in files if not f["over_cap"] and not f.get("dev_only")]
    earlier_test = None
    if FROZEN_TEST.exists():
        test_groups = set(load_frozen(FROZEN_TEST)["groups"])
        dev_groups = set(load_frozen(FROZEN_DEV)["groups"])
    else:
        if extend_from:  # a new version: the earlier one's held-out projects stay, new labels are split
            earlier = {
                name: DATA_DIR / f"code_language_{name}_{extend_from}.json" for name in ("test", "dev")
            }
            frozen = {name: load_frozen(path) for name, path in earlier.items()}
            previous = {g: name for name, fz in frozen.items() for g in fz["groups"]}
            labels = {label for fz in frozen.values() for _, label in fz["files"]}
            where = extend_split(capped, previous, labels, seed)
        else:
            where = split_groups(capped, seed)
        test_groups = {g for g, side in where.items() if side == "test"}
        dev_groups = {g for g, side in where.items() if side == "dev"} | dev_only
        if extend_from and test_groups <= set(frozen["test"]["groups"]):  # no new test project
            earlier_test, test_groups = earlier["test"], set(frozen["test"]["groups"])
    for f in files:
        f["split"] = frozen_side(f, test_groups, dev_groups)
    dropped = drop_held_out_copies(files)
    drift = {}
    for name, path in (("test", FROZEN_TEST), ("dev", FROZEN_DEV)):
        held = [f for f in files if f["split"] == name]
        if path.exists():
            try:
                drift[name] = match_frozen(held, load_frozen(path))
            except ValueError as e:
                raise SystemExit(f"{path.name}: {e}") from None
            if drift[name]["frozen_missing"] or drift[name]["not_frozen"]:
                log.warning("%s: %s", path.name, drift[name])
        elif name == "test" and earlier_test is not None:  # the same test set: the same bytes and sha256
            # the set itself last, by rename: a killed run leaves no frozen file that is there but unverifiable
            path.with_suffix(".json.sha256").write_text(f"{frozen_digest_of(earlier_test)}  {path.name}\n")
            tmp = path.with_suffix(".json.partial")
            tmp.write_bytes(earlier_test.read_bytes())
            tmp.replace(path)
            drift[name] = match_frozen(held, load_frozen(path))
        else:
            write_frozen(frozen_set(held, name, seed), path)
    return {"split_by_component": made, "held_out_in_train": dropped, "frozen_drift": drift}


def train_main(argv: list[str]) -> dict:
    """Train (epochs chosen on dev), calibrate (temperature on dev), score the frozen test set once, log to MLflow."""
    from dataclasses import replace

    from classifiers.code_language import (
        CHAR_PARAMS,
        fit_char_mix,
        fit_markers,
        train_char_model,
        train_code_language_model,
    )
    from classifiers.code_language_protocol import (
        calibration_report,
        fit_temperature,
        load_frozen,
        paired_project_bootstrap,
    )  # fmt: skip
    from classifiers.fasttext_train import FastTextParams
    from pipelines.code.language_protocol import training_sample

    ap = argparse.ArgumentParser(prog="code_lang_id.py train")
    ap.add_argument("--frozen-version", default="v4", help="which frozen dev / test sets (classifiers/data/)")
    ap.add_argument("--data", nargs="+", default=DEFAULT_DATA, help="[STATE_DIR:]SNAPSHOT of crawled code")
    ap.add_argument("--extend-from", default=None,
                    help="freezing a new version: keep this earlier version's held-out projects (e.g. v2)")  # fmt: skip
    ap.add_argument("--epochs", type=int, nargs="+", default=[40, 120], help="candidates, chosen on dev")
    ap.add_argument(
        "--per-group-cap", type=int, default=60, help="held-out files of one label from one project"
    )
    ap.add_argument(
        "--train-group-cap", type=int, default=300, help="training files of one label from one project"
    )
    ap.add_argument("--max-train-per-label", type=int, default=1500)
    ap.add_argument("--min-files", type=int, default=60, help="labels with fewer files are left out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0,
                    help="the training sample's and fastText's (files and split follow the frozen set's own seed)")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="directory for the model and its calibration")
    ap.add_argument("--dim", type=int, default=100, help="fastText vector size")
    ap.add_argument("--bucket", type=int, default=200_000, help="fastText hash buckets of the word n-grams")
    ap.add_argument("--word-ngrams", type=int, default=2, help="fastText word n-gram length")
    ap.add_argument("--vocabulary-min-groups", type=int, default=6,
                    help="tokens seen in fewer training projects become their shape")  # fmt: skip
    ap.add_argument("--no-char-view", action="store_true",
                    help="the token model alone (no character view mixed in)")  # fmt: skip
    ap.add_argument("--dev-only", action="store_true",
                    help="stop after dev (a recipe sweep): the frozen test set is not predicted or scored")  # fmt: skip
    args = ap.parse_args(argv)
    use_frozen_version(args.frozen_version)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data_seed = protocol_seed(args.seed, args.extend_from)
    files, info = protocol_files(args.data, data_seed, args.per_group_cap, args.min_files)
    info.update(assign_splits(files, data_seed, args.extend_from))
    by = {s: [f for f in files if f["split"] == s] for s in ("train", "dev", "test")}
    train = training_sample(files, args.train_group_cap, args.max_train_per_label, args.seed)
    labels = sorted({f["label"] for f in files})
    print(f"{len(labels)} labels; train {len(train)} files / {len({f['group'] for f in train})} groups, dev "
          f"{len(by['dev'])} / {len({f['group'] for f in by['dev']})}, test {len(by['test'])} / "
          f"{len({f['group'] for f in by['test']})}; {info}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)

    def predict(clf: CodeLanguageClassifier, texts: list[str]) -> list[dict[str, float]]:
        return clf.predict_content(texts, k=-1)

    best, dev_correct = None, {}
    for epoch in args.epochs:  # every choice on dev
        params = FastTextParams(lr=0.5, epoch=epoch, dim=args.dim, word_ngrams=args.word_ngrams, minn=0, maxn=0, min_count=1,
                                bucket=args.bucket, threads=args.threads, seed=args.seed)  # fmt: skip
        t0 = time.time()
        path = args.out / f"code_language_e{epoch}.bin"
        train_code_language_model([(f["label"], f["text"]) for f in train], params, path,
                                  groups=[f["group"] for f in train], min_groups=args.vocabulary_min_groups)  # fmt: skip
        clf = CodeLanguageClassifier.load(path)
        dev_probs = predict(clf, [f["text"] for f in by["dev"]])
        dev_correct[epoch] = [
            max(p, key=p.get) == f["label"] for p, f in zip(dev_probs, by["dev"], strict=True)
        ]
        acc = sum(dev_correct[epoch]) / len(by["dev"])
        print(f"epoch {epoch}: dev accuracy {acc:.4f} ({time.time() - t0:.0f}s)")
        if best is None or acc > best[0]:
            best = (acc, epoch, path, dev_probs)
    dev_acc, epoch, path, dev_probs = best
    # how far dev resolves the choice: the chosen epoch against each other candidate, projects resampled
    margins = {}
    for other in (e for e in args.epochs if e != epoch):
        diff, lo, hi = paired_project_bootstrap(dev_correct[other], dev_correct[epoch],
                                                [f["group"] for f in by["dev"]], seed=args.seed)  # fmt: skip
        margins[str(other)] = {"difference": round(diff, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        print(f"epoch {epoch} - epoch {other}: {diff:+.4f} dev accuracy, 95% [{lo:+.4f}, {hi:+.4f}] over "
              f"resampled projects{'' if lo > 0 else ' (not resolved: the interval holds 0)'}")  # fmt: skip
    dev_true = [f["label"] for f in by["dev"]]
    dev_texts = [f["text"] for f in by["dev"]]
    char_path, mix = None, {"char_weight": 0.0, "char_below": 0.0}
    if not args.no_char_view:  # the character view, mixed in where dev says it helps
        char_path = args.out / CHAR_MODEL
        t0 = time.time()
        clf = CodeLanguageClassifier.load(path)
        clf.char_model = train_char_model([(f["label"], f["text"]) for f in train],
                                          replace(CHAR_PARAMS, threads=args.threads, seed=args.seed), char_path)  # fmt: skip
        fit = fit_char_mix(clf, dev_texts, dev_true)
        mix = {"char_weight": fit["char_weight"], "char_below": fit["char_below"]}
        clf.char_weight, clf.char_below = mix["char_weight"], mix["char_below"]
        dev_probs = predict(clf, dev_texts)
        mixed_correct = [max(p, key=p.get) == y for p, y in zip(dev_probs, dev_true, strict=True)]
        diff, lo, hi = paired_project_bootstrap(dev_correct[epoch], mixed_correct, [f["group"] for f in by["dev"]],
                                                seed=args.seed)  # fmt: skip
        margins["char_view"] = {"difference": round(diff, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        dev_acc = sum(mixed_correct) / len(mixed_correct)
        print(f"character view on dev ({time.time() - t0:.0f}s): {fit}; {diff:+.4f} dev accuracy over the token "
              f"model alone, 95% [{lo:+.4f}, {hi:+.4f}] over resampled projects")  # fmt: skip
        if mix["char_weight"] == 0:
            char_path = None
    temperature = fit_temperature(dev_probs, dev_true)  # marker-decided files do not move with it
    markers = fit_markers(dev_texts, dev_true)
    clf = CodeLanguageClassifier.load(
        path, char_path, temperature=temperature, marker_confidence=markers, **mix
    )
    cal = {"epoch": epoch, "temperature": temperature, "marker_confidence": markers, **mix,
           "dev_accuracy": round(dev_acc, 4),
           "labels": labels, "dev_margin_over": margins,
           "frozen_test_sha256": (FROZEN_TEST.with_suffix(".json.sha256")).read_text().split()[0]}  # fmt: skip
    final = args.out / "code_language.bin"
    final.write_bytes(path.read_bytes())
    (args.out / "calibration.json").write_text(json.dumps(cal, indent=1))
    dev_cal = clf.predict_content(dev_texts, k=-1)
    dev_report = calibration_report(
        dev_true, [max(p, key=p.get) for p in dev_cal], [max(p.values()) for p in dev_cal]
    )
    print(f"chosen on dev: epoch {epoch}, temperature {temperature}; dev calibration {dev_report}")

    if args.dev_only:
        return {**cal, "dev_report": dev_report}
    # the frozen test set: scored once for this model version
    load_frozen(FROZEN_TEST)
    clf = CodeLanguageClassifier.load(
        final, char_path, temperature=temperature, marker_confidence=markers, **mix
    )
    t0 = time.time()
    test_probs = clf.predict_content([f["text"] for f in by["test"]], k=-1)
    secs = time.time() - t0
    train_counts = Counter(f["label"] for f in train)
    (args.out / "train_counts.json").write_text(json.dumps(dict(sorted(train_counts.items())), indent=1))
    return report_frozen_test(
        by["test"], test_probs, secs, labels, {**cal, "info": info}, train_counts, args.out
    )


def report_frozen_test(test: list[dict], probs: list[dict[str, float]], secs: float, labels: list[str], cal: dict,
                       train_counts: dict[str, int] | None, out: Path) -> dict:  # fmt: skip
    """The one scoring of a model version on the frozen test set: per-label P/R/F1, macro-F1, accuracy, ECE,
    errors at >= 0.99, the confusion matrix PNG; written to `out` and logged to MLflow."""
    from classifiers.code_language_protocol import UNKNOWN, calibration_report
    from classifiers.fasttext_train import plot_confusion

    test_true = [f["label"] for f in test]
    test_pred = [max(p, key=p.get) if p else UNKNOWN for p in probs]
    conf = [max(p.values()) if p else 0.0 for p in probs]
    rep = classification_report(test_true, test_pred, labels)
    calib = calibration_report(test_true, test_pred, conf)
    result = {"labels": labels, "accuracy": round(rep.accuracy, 4), "macro_f1": round(rep.macro_f1, 4),
              "files": len(test_true), "groups": len({f["group"] for f in test}),
              "files_per_s": round(len(test_true) / secs, 1), **calib, **cal,
              "per_label": {lab: {k: round(v, 4) for k, v in rep.per_class[lab].items()} for lab in labels}}  # fmt: skip
    rows = [{"label": lab, "precision": round(rep.per_class[lab]["precision"], 3),
             "recall": round(rep.per_class[lab]["recall"], 3), "f1": round(rep.per_class[lab]["f1"], 3),
             "test_files": int(rep.per_class[lab]["support"]),
             "test_projects": len({f["group"] for f in test if f["label"] == lab}),
             **({"train_files": train_counts.get(lab, 0)} if train_counts is not None else {}),
             "ece": calib["ece_per_predicted_label"].get(lab, "")} for lab in labels]  # fmt: skip
    table = markdown_table(rows)
    print(f"\n## frozen test set: {len(test_true)} files, {result['groups']} projects\naccuracy {rep.accuracy:.4f}, "
          f"macro-F1 {rep.macro_f1:.4f}, ECE {calib['ece']}, errors at >= 0.99: {calib['confident_errors']} of "
          f"{calib['confident_predictions']} ({100 * calib['confident_error_rate']:.2f}%)\n{table}")  # fmt: skip
    (out / "test_report.json").write_text(json.dumps(result, indent=1))
    (out / "test_table.md").write_text(table + "\n")
    png = plot_confusion(
        rep, out / "confusion_test.png", f"code language, frozen test ({len(test_true)} files)"
    )
    _log_mlflow(result, [png, out / "test_report.json", out / "test_table.md",
                         out / "calibration.json", FROZEN_TEST.with_suffix(".json.sha256")])  # fmt: skip
    return result


def _log_mlflow(result: dict, artifacts: list[Path]) -> None:
    from infra.tracking import Tracker

    tracker = Tracker.from_profile(load_profile())
    run = tracker.client.create_run(tracker.experiment_id("code_language_id"),
                                    tags={"mlflow.runName": FROZEN_TEST.stem, "issue": "19"})  # fmt: skip
    rid = run.info.run_id
    for key in (
        "accuracy",
        "macro_f1",
        "ece",
        "confident_error_rate",
        "files_per_s",
        "temperature",
        "dev_accuracy",
    ):
        tracker.client.log_metric(rid, f"test/{key}" if key not in ("temperature", "dev_accuracy") else key,
                                  float(result[key]))  # fmt: skip
    for lab, v in result["per_label"].items():
        tracker.client.log_metric(rid, f"test/f1/{lab.replace('+', 'p').replace('#', 'sharp')}", v["f1"])
    tracker.client.log_param(rid, "epoch", result["epoch"])
    tracker.client.log_param(rid, "frozen_test_sha256", result["frozen_test_sha256"])
    for a in artifacts:
        tracker.client.log_artifact(rid, str(a))
    tracker.client.set_terminated(rid)
    print(f"MLflow run {rid} ({tracker.tracking_uri})")


# --- issue 19: ours vs magika (and optionally guesslang) on the frozen test set, in one run ----------------

MAGIKA_PIN = "magika==1.0.3"
# magika content types -> our labels; its text types that are no language of ours are our `unknown`
MAGIKA_NAMES = {
    "python": "Python", "c": "C", "cpp": "C++", "cs": "C#", "java": "Java", "kotlin": "Kotlin", "scala": "Scala",
    "go": "Go", "rust": "Rust", "swift": "Swift", "objectivec": "Objective-C", "javascript": "JavaScript",
    "typescript": "TypeScript", "php": "PHP", "ruby": "Ruby", "perl": "Perl", "shell": "Shell",
    "powershell": "PowerShell", "lua": "Lua", "r": "R", "julia": "Julia", "matlab": "MATLAB", "haskell": "Haskell",
    "ocaml": "OCaml", "erlang": "Erlang", "elixir": "Elixir", "clojure": "Clojure", "dart": "Dart", "zig": "Zig",
    "sql": "SQL", "html": "HTML", "css": "CSS", "scss": "SCSS", "markdown": "Markdown", "yaml": "YAML",
    "json": "JSON", "toml": "TOML", "dockerfile": "Dockerfile", "makefile": "Makefile", "tcl": "Tcl",
    "fortran": "Fortran", "groovy": "Groovy", "gradle": "Groovy", "cmake": "CMake", "latex": "TeX", "xml": "XML",
    "svg": "XML", "verilog": "Verilog", "prolog": "Prolog", "batch": "Batchfile", "gemfile": "Ruby",
    "gemspec": "Ruby", "txt": "unknown", "csv": "unknown", "tsv": "unknown", "unknown": "unknown",
    "rst": "unknown", "jsonl": "JSON",
}  # fmt: skip
MAGIKA_LISP = {
    "Emacs Lisp",
    "Common Lisp",
    "Scheme",
    "Racket",
}  # its one "lisp" stands for each Lisp we label

MAGIKA_RUNNER = r"""
import json, sys, time
from pathlib import Path
from magika import Magika
t0 = time.time()
m = Magika()
load_s = time.time() - t0
paths = [Path(p) for p in json.loads(Path(sys.argv[1]).read_text())]
m.identify_paths(paths[:20])  # warm-up
t0 = time.time()
res = m.identify_paths(paths)
secs = time.time() - t0
print(json.dumps({"predictions": [r.output.label if r.ok else "error" for r in res],
                  "scores": [r.score if r.ok else 0.0 for r in res], "seconds": secs, "load_seconds": load_s}))
"""


def ensure_magika_venv(venv: Path) -> Path:
    """A separate venv with magika (onnxruntime) from PyPI, never the project venv; returns its python."""
    python = venv / "bin" / "python"
    marker = venv / ".magika-ready"
    if marker.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", MAGIKA_PIN], check=True)
    marker.write_text("ok\n")
    return python


def run_magika(python: Path, texts: list[str]) -> tuple[list[str], float]:
    """magika on the same texts (each written to a file without a name hint: `f<N>.txt` is never read by it,
    magika reads content only), through its batch API `identify_paths` at its default settings."""
    with tempfile.TemporaryDirectory(prefix="crucible-magika-") as tmp:
        paths = []
        for i, text in enumerate(texts):
            p = Path(tmp) / f"f{i:06d}"
            p.write_bytes(text.encode("utf-8", "surrogatepass"))
            paths.append(str(p))
        (Path(tmp) / "paths.json").write_text(json.dumps(paths))
        (Path(tmp) / "runner.py").write_text(MAGIKA_RUNNER)
        proc = subprocess.run([str(python), str(Path(tmp) / "runner.py"), str(Path(tmp) / "paths.json")],
                              capture_output=True, text=True, timeout=7200)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"magika runner failed: {proc.stderr[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    return [MAGIKA_NAMES.get(p, f"magika:{p}") for p in result["predictions"]], result["seconds"]


def protocol_bench_main(argv: list[str]) -> dict:
    """The frozen test set (rebuilt from the crawled snapshots and checked against its committed hashes): ours
    (single process, calibrated) vs magika, accuracy on all labels and on the labels magika has, files/s."""
    from classifiers.code_language_protocol import UNKNOWN, load_frozen

    ap = argparse.ArgumentParser(prog="code_lang_id.py protocol")
    ap.add_argument("--frozen-version", default="v4", help="which frozen dev / test sets (classifiers/data/)")
    ap.add_argument("--data", nargs="+", default=DEFAULT_DATA)
    model = ap.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-dir", type=Path, help="output of `code_lang_id.py train`")
    model.add_argument("--model-snapshot", help="the committed `code_language_classifier` of this code snapshot "
                                                "(what `make run` trains), fetched from the profile's store")  # fmt: skip
    ap.add_argument("--magika-venv", type=Path, default=None, help="default: <state dir>/bench-venv-magika")
    ap.add_argument("--per-group-cap", type=int, default=60)
    ap.add_argument("--min-files", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    use_frozen_version(args.frozen_version)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.model_snapshot:
        args.model_dir = fetch_committed_model(args.model_snapshot)
    data_seed = protocol_seed(args.seed)
    files, _ = protocol_files(args.data, data_seed, args.per_group_cap, args.min_files)
    drift = assign_splits(files, data_seed)[
        "frozen_drift"
    ]  # raises if the data no longer gives the frozen sets
    test = sorted((f for f in files if f["split"] == "test"), key=lambda f: f["id"])
    load_frozen(FROZEN_TEST)  # checked against its sha256
    texts, y_true = [f["text"] for f in test], [f["label"] for f in test]
    cal = json.loads((args.model_dir / "calibration.json").read_text())
    char_path = args.model_dir / CHAR_MODEL
    clf = CodeLanguageClassifier.load(
        args.model_dir / "code_language.bin",
        char_path if char_path.exists() else None,
        temperature=cal["temperature"],
        marker_confidence=cal.get("marker_confidence"),  # absent for models calibrated before it existed
        char_weight=cal.get("char_weight", 0.0),
        char_below=cal.get("char_below", 0.0),
    )
    clf.predict_content(texts[:50], k=1)
    t0 = time.time()
    probs = clf.predict_content(texts, k=1)
    ours_s = time.time() - t0
    preds = {"crucible fastText": [max(p, key=p.get) if p else UNKNOWN for p in probs]}
    speed = {"crucible fastText": len(texts) / ours_s}
    venv = args.magika_venv or load_profile().state_path / "bench-venv-magika"
    mg, mg_s = run_magika(ensure_magika_venv(venv), texts)
    preds["magika"] = [
        y if (g == "magika:lisp" and y in MAGIKA_LISP) else g for g, y in zip(mg, y_true, strict=True)
    ]
    speed["magika"] = len(texts) / mg_s
    counts = args.model_dir / "train_counts.json"
    report_frozen_test(test, probs, ours_s, sorted(set(y_true)), {**cal, "frozen_drift": drift},
                       json.loads(counts.read_text()) if counts.exists() else None, args.model_dir)  # fmt: skip
    magika_labels = set(MAGIKA_NAMES.values()) | MAGIKA_LISP
    labels = sorted(set(y_true))
    print(f"frozen test set {FROZEN_TEST.name} (sha256 {frozen_digest_of(FROZEN_TEST)[:16]}): {len(texts)} files, "
          f"{len({f['group'] for f in test})} projects, {len(labels)} labels ({drift['test']['frozen_missing']} frozen "
          f"files missing from the data); content only; ours one process "
          f"(temperature {cal['temperature']}), magika at its default settings (identify_paths)")  # fmt: skip
    sections = {"all files, all labels (a label magika lacks counts as its error)": list(range(len(texts))),
                "labels magika has": [i for i, y in enumerate(y_true) if y in magika_labels]}  # fmt: skip
    result: dict = {"files": len(texts), "labels": labels, "sections": {}}
    for title, idx in sections.items():
        sub = [y_true[i] for i in idx]
        rows = [score(m, sub, [preds[m][i] for i in idx], speed[m], sorted(set(sub))) for m in preds]
        result["sections"][title] = rows
        print(f"\n## {title}\n" + markdown_table(rows))
    ratio = speed["crucible fastText"] / speed["magika"]
    result["speed_ratio_vs_magika"] = round(ratio, 2)
    print(
        f"\nspeed: ours {speed['crucible fastText']:.0f} files/s vs magika {speed['magika']:.0f} files/s = {ratio:.1f}x"
    )
    rep_o = classification_report(y_true, preds["crucible fastText"], labels)
    rep_m = classification_report(y_true, preds["magika"], labels)
    rows = [{"label": lab, "test_files": int(rep_o.per_class[lab]["support"]),
             "ours_f1": round(rep_o.per_class[lab]["f1"], 3), "magika_f1": round(rep_m.per_class[lab]["f1"], 3)}
            for lab in labels]  # fmt: skip
    print("\n## per-label F1 on the frozen test set\n" + markdown_table(rows))
    result["per_label"] = rows
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


def fetch_committed_model(snapshot: str) -> Path:
    """The committed model and calibration of `code_language_classifier` for `snapshot`, in a new directory."""
    from infra.committed import fetch_file, read_committed
    from pipelines.code.language_id import CALIBRATION

    profile = load_profile()
    store = open_store(profile.store, profile.state_path)
    out = read_committed(store, f"code/language_id/{snapshot}")
    if CALIBRATION not in out.files:
        raise SystemExit(f"code/language_id/{snapshot} was trained without the frozen protocol (no {CALIBRATION}): "
                         f"retrain it with `frozen_version` set")  # fmt: skip
    dest = Path(tempfile.mkdtemp(prefix=f"code-lang-{snapshot}-"))
    for name in ("code_language.bin", CALIBRATION, CHAR_MODEL):
        if name in out.files:  # the character view only when dev chose to mix it in
            fetch_file(store, out, name, dest / name)
    print(f"model: code/language_id/{snapshot} version {out.version} -> {dest}")
    return dest


def frozen_digest_of(path: Path) -> str:
    return path.with_suffix(path.suffix + ".sha256").read_text().split()[0]


# training data tried on dev and not (yet) in the model: crawled by `crawl`, used only when `--data` names it
# code-langs-0006 was tried on dev and not adopted (its manifest says why); `crawl` fetches it for a rerun
CANDIDATE_SNAPSHOTS: dict[str, str] = {"code-langs-0006": "classifiers/data/code_language_extra6.yaml"}
# the snapshots DEFAULT_DATA names and the manifests they are crawled from, then the candidates
PROTOCOL_MANIFESTS = {
    "code-0001": "pipelines/code/manifests/tiny.yaml",
    **CodeLanguageIdConfig().label_snapshots,
    **CodeLanguageIdConfig().dev_snapshots,
    **CANDIDATE_SNAPSHOTS,
}


def crawl_main(argv: list[str]) -> None:
    """Crawl the protocol's snapshots into `--state` (a store per the profile); a committed snapshot is kept."""
    ap = argparse.ArgumentParser(prog="code_lang_id.py crawl")
    ap.add_argument("--state", type=Path, default=None, help="state dir (default: the profile's)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    profile = load_profile()
    store = open_store(profile.store, args.state or profile.state_path)
    repo = Path(__file__).resolve().parents[1]
    for snapshot, manifest in PROTOCOL_MANIFESTS.items():
        if store.list(f"code/raw/{snapshot}/"):
            print(f"{snapshot}: already crawled")
            continue
        result = crawl_code(CodeCrawlConfig(manifest=str(repo / manifest)), store, snapshot)
        print(f"{snapshot}: {result.extra.get('languages')}; failed sources: {result.extra.get('errors')}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["crawl"]:
        crawl_main(sys.argv[2:])
    elif sys.argv[1:2] == ["train"]:
        train_main(sys.argv[2:])
    elif sys.argv[1:2] == ["log-test"]:  # log a finished test report again (e.g. the tracking store was down)
        out = Path(sys.argv[2])
        _log_mlflow(json.loads((out / "test_report.json").read_text()),
                    [out / "confusion_test.png", out / "test_report.json", out / "test_table.md",
                     out / "calibration.json", FROZEN_TEST.with_suffix(".json.sha256")])  # fmt: skip
    elif sys.argv[1:2] == ["protocol"]:
        protocol_bench_main(sys.argv[2:])
    else:
        main()
