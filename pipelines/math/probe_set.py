"""Build the judge probe set: documents of known educational-math character from license-clean sources.

    python -m pipelines.math.probe_set classifiers/data/probe_edu_math_v1.jsonl

Grades (0-5, the rubric's scale) come from the source kind, not from anyone's opinion of a single text:
  5  competition problem with its worked solution        champ-dataset (MIT)
  4  SymPy tutorial / guide page (math with explanations) python-sympy-doc (BSD-3-Clause)
  3  competition problem statement, no solution           champ-dataset (MIT)
  1  non-math reference entry (hacker jargon)             dict-jargon (public domain)
  0  fortune cookie, recipe / food talk, navigation boilerplate       fortunes (BSD), python-sympy-doc page chrome
The file is shipped with the project; rebuilding it gives the same bytes.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from infra.local_web import fetch_doc_package
from pipelines.knowledge.dictd import dictd_databases, read_dictd
from pipelines.knowledge.fortunes import fortune_files, read_fortunes
from pipelines.math.doc_pages import champ_problems, iter_doc_pages

_RECIPE = re.compile(
    r"\b(cups?|tablespoons?|teaspoons?|tbsp|tsp|bake|boil|stir|oven|dough|flour|sugar|butter|"
    r"pour|recipe|cook|fry|salt|pepper|simmer)\b",
    re.I,
)
_MATHY = re.compile(r"\b(math|calculus|theorem|equation|number|probability)\b", re.I)
COUNTS = {
    "champ_solution": 16,
    "sympy_doc": 16,
    "champ_problem": 10,
    "jargon_entry": 12,
    "fortune": 16,
    "recipe": 8,
    "navigation": 16,
}
MAX_CHARS = 1200


def build_probe_set(seed: int = 0, cache_dir: Path | None = None) -> list[dict]:
    rng = random.Random(seed)
    items: list[dict] = []

    def add(kind: str, grade: int, text: str, source: str, license_: str, ref: str) -> None:
        items.append(
            {
                "id": f"{kind}-{len([i for i in items if i['kind'] == kind]):02d}",
                "kind": kind,
                "grade": grade,
                "text": text[:MAX_CHARS].strip(),
                "source": source,
                "license": license_,
                "ref": ref,
            }
        )

    champ = champ_problems()
    rng.shuffle(champ)
    for p in champ[: COUNTS["champ_solution"]]:
        add(
            "champ_solution",
            5,
            f"Problem: {p['problem']}\n\nSolution: {p['solution']}",
            "champ-dataset",
            "MIT",
            p["id"],
        )
    for p in champ[COUNTS["champ_solution"] : COUNTS["champ_solution"] + COUNTS["champ_problem"]]:
        add("champ_problem", 3, p["problem"], "champ-dataset", "MIT", p["id"])

    sympy_root = fetch_doc_package("python-sympy-doc", cache_dir) / "usr/share/doc/python-sympy-doc/html"
    pages = [p for sub in ("tutorials", "guides", "explanation") for p in iter_doc_pages(sympy_root / sub)]
    rng.shuffle(pages)
    for page in pages[: COUNTS["sympy_doc"]]:
        add(
            "sympy_doc",
            4,
            page.main_text,
            "python-sympy-doc",
            "BSD-3-Clause",
            str(Path(page.path).relative_to(sympy_root)),
        )
    chrome = sorted({p.chrome_text for p in pages if len(p.chrome_text) > 200})
    rng.shuffle(chrome)
    for text in chrome[: COUNTS["navigation"]]:
        start = rng.randrange(0, max(1, len(text) - MAX_CHARS))  # a window of the menu, not always its top
        add("navigation", 0, text[start:], "python-sympy-doc", "BSD-3-Clause", "page chrome")

    jargon = [
        e
        for idx in dictd_databases(fetch_doc_package("dict-jargon", cache_dir))
        for e in read_dictd(idx, min_chars=300)
        if not _MATHY.search(e.text)
    ]
    for e in rng.sample(jargon, COUNTS["jargon_entry"]):
        add("jargon_entry", 1, e.text, "dict-jargon", "public-domain", e.headword)

    fortunes_root = fetch_doc_package("fortunes", cache_dir)
    cookies = [
        f
        for path in fortune_files(fortunes_root)
        if path.name not in {"food", "science", "education"}
        for f in read_fortunes(path, min_chars=150)
        if not _MATHY.search(f.text)
    ]
    for f in rng.sample(cookies, COUNTS["fortune"]):
        add("fortune", 0, f.text, "fortunes", "BSD", f"{f.collection}:{f.index}")
    food = [
        f
        for path in fortune_files(fortunes_root)
        if path.name == "food"
        for f in read_fortunes(path, min_chars=150)
    ]
    # the few real recipes first, then other food talk (the Debian archive ships no recipe collection)
    food.sort(key=lambda f: -min(2, len(_RECIPE.findall(f.text))))
    for f in food[: COUNTS["recipe"]]:
        add("recipe", 0, f.text, "fortunes", "BSD", f"{f.collection}:{f.index}")
    return items


def main(argv: list[str] | None = None) -> None:
    argv = argv if argv is not None else sys.argv[1:]
    out = Path(argv[0] if argv else "classifiers/data/probe_edu_math_v1.jsonl")
    items = build_probe_set()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(i, ensure_ascii=False, sort_keys=True) + "\n" for i in items))
    print(f"wrote {len(items)} probes to {out}")


if __name__ == "__main__":
    main()
