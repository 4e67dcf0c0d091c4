"""Math & science documents from Debian documentation packages (sympy, maxima HTML) and PyPI `champ-dataset`.

HTML pages are split into their main content (the candidate document) and their navigation chrome (menus,
sidebars, prev/next bars), which the probe set uses as known-junk "navigation boilerplate".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lxml import html as lxml_html

# Debian package -> folder of its HTML manual inside the extracted package.
MATH_DOC_PACKAGES = {
    "python-sympy-doc": "usr/share/doc/python-sympy-doc/html",
    "maxima-doc": "usr/share/doc/maxima-doc/html",
}
_MAIN_XPATHS = ("//article", "//*[@role='main']", "//div[@class='body']", "//body")
_CHROME_XPATHS = (
    "//nav",
    "//footer",
    "//header",
    "//*[contains(@class,'sidebar')]",
    "//*[contains(@class,'related')]",
    "//*[@class='nav-panel']",
    "//*[@class='header']",
    "//table[@class='header']",
    "//*[@role='navigation']",
    "//*[contains(@class,'toc')]",
    "//*[@class='page-info']",
    "//*[contains(@class,'skip-to-content')]",
)
_DROP_XPATHS = ("//script", "//style", "//noscript", "//*[contains(@class,'visually-hidden')]", "//svg")
_BLOCK_TAGS = {
    "p",
    "div",
    "pre",
    "li",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "tr",
    "table",
    "dt",
    "dd",
    "blockquote",
    "section",
    "article",
    "br",
    "ul",
    "ol",
    "dl",
}
_SPACES = re.compile(r"[ \t\r\f\v]+")
_BLANKS = re.compile(r"\n\s*\n\s*")


@dataclass
class HtmlPage:
    path: str
    title: str
    main_text: str
    chrome_text: str  # navigation boilerplate: menus, sidebars, prev/next bars
    meta: dict = field(default_factory=dict)


def element_text(elem) -> str:
    """Text of an lxml element with line breaks at block elements (lxml's text_content() glues them)."""
    parts: list[str] = []

    def walk(node) -> None:
        tag = node.tag if isinstance(node.tag, str) else ""
        if tag in _BLOCK_TAGS:
            parts.append("\n")
        if node.text:
            parts.append(node.text)
        if tag == "img" and node.get("alt"):
            parts.append(node.get("alt"))  # Sphinx renders formulas as images whose alt text is the LaTeX
        for child in node:
            walk(child)
            if child.tail:
                parts.append(child.tail)
        if tag in _BLOCK_TAGS:
            parts.append("\n")

    walk(elem)
    text = _SPACES.sub(" ", "".join(parts))
    text = "\n".join(line.strip() for line in text.splitlines())
    return _BLANKS.sub("\n\n", text).strip()


def parse_html_page(path: Path) -> HtmlPage:
    """Split one HTML page into main text and navigation chrome."""
    tree = lxml_html.fromstring(Path(path).read_bytes())
    for xp in _DROP_XPATHS:
        for el in tree.xpath(xp):
            el.drop_tree()
    title = (tree.findtext(".//title") or "").strip()
    chrome: list[str] = []
    for xp in _CHROME_XPATHS:
        for el in tree.xpath(xp):
            if el.getparent() is not None:
                chrome.append(element_text(el))
                el.drop_tree()
    main = next((found[0] for xp in _MAIN_XPATHS if (found := tree.xpath(xp))), tree)
    return HtmlPage(str(path), title, element_text(main), "\n".join(c for c in chrome if c))


def doc_page_paths(root: Path) -> list[Path]:
    """HTML files under `root`, sorted (reproducible), without index/search pages."""
    return [
        p
        for p in sorted(Path(root).rglob("*.html"))
        if p.name not in {"genindex.html", "search.html", "py-modindex.html"}
    ]


def iter_doc_pages(root: Path, min_chars: int = 400, paths: list[Path] | None = None) -> Iterator[HtmlPage]:
    """Pages (all under `root`, or just `paths`) whose main text has >= min_chars."""
    for path in paths if paths is not None else doc_page_paths(root):
        page = parse_html_page(path)
        if len(page.main_text) >= min_chars:
            yield page


def champ_problems() -> list[dict]:
    """Competition problems from PyPI `champ-dataset` (MIT): {'id', 'category', 'problem', 'solution'}."""
    import champ_dataset

    data = json.loads((Path(champ_dataset.__file__).parent / "dataset_files" / "v0.json").read_text())
    out = []
    for pid, prob in sorted(data["problems"].items()):
        steps = [s["_text"] for s in prob.get("solution", {}).get("steps", [])]
        out.append(
            {
                "id": pid,
                "category": prob.get("category", ""),
                "problem": prob["_text"],
                "solution": " ".join(steps),
            }
        )
    return out
