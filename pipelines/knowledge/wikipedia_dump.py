"""Streaming reader for MediaWiki XML dumps (`pages-articles*.xml[.bz2]`) with a wiki-markup stripper.

The `tiny` default is the real (shortened) English dump that ships in the gensim wheel; a full dump file
works the same way, streamed page by page with constant memory.
"""

from __future__ import annotations

import bz2
import gzip
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WikiArticle:
    page_id: int
    title: str
    text: str  # plain text, markup stripped, paragraphs separated by blank lines
    revision_id: int | None = None


def gensim_sample_dump() -> Path:
    """The real enwiki dump sample (106 articles) shipped inside the gensim wheel."""
    import gensim

    return (
        Path(gensim.__file__).parent
        / "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    )


def _open(path: Path):
    path = Path(path)
    if path.suffix == ".bz2":
        return bz2.open(path, "rb")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def iter_dump_pages(path: Path) -> Iterator[dict]:
    """Raw pages: {'id', 'title', 'ns', 'redirect', 'revision_id', 'wikitext'}; elements freed as we go."""
    with _open(path) as fh:
        for _event, elem in ET.iterparse(fh, events=("end",)):
            if _local(elem.tag) != "page":
                continue
            page: dict = {"redirect": False, "wikitext": "", "revision_id": None, "ns": 0}
            for child in elem:
                name = _local(child.tag)
                if name == "title":
                    page["title"] = child.text or ""
                elif name == "ns":
                    page["ns"] = int(child.text or 0)
                elif name == "id":
                    page["id"] = int(child.text or 0)
                elif name == "redirect":
                    page["redirect"] = True
                elif name == "revision":
                    for field in child:
                        if _local(field.tag) == "id":
                            page["revision_id"] = int(field.text or 0)
                        elif _local(field.tag) == "text":
                            page["wikitext"] = field.text or ""
            elem.clear()
            yield page


def read_wikipedia_articles(
    path: Path, min_chars: int = 200, stats: dict | None = None
) -> Iterator[WikiArticle]:
    """Main-namespace, non-redirect articles as plain text; `stats` counts what was skipped and why."""
    stats = stats if stats is not None else {}
    for page in iter_dump_pages(path):
        if page["ns"] != 0:
            stats["skipped/not_article_namespace"] = stats.get("skipped/not_article_namespace", 0) + 1
            continue
        if page["redirect"] or page["wikitext"].lstrip().lower().startswith("#redirect"):
            stats["skipped/redirect"] = stats.get("skipped/redirect", 0) + 1
            continue
        text = strip_wiki_markup(page["wikitext"])
        if len(text) < min_chars:
            stats["skipped/too_short"] = stats.get("skipped/too_short", 0) + 1
            continue
        stats["articles"] = stats.get("articles", 0) + 1
        yield WikiArticle(page["id"], page["title"], text, page["revision_id"])


_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.DOTALL | re.IGNORECASE)
_DROP_TAGS = re.compile(
    r"<(gallery|timeline|imagemap|score|syntaxhighlight|source)[^>]*>.*?</\1>", re.DOTALL | re.I
)
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|[^{}]*?\|\}", re.DOTALL)
_FILE_LINK = re.compile(  # captions may hold single-bracket text like "[above]"
    r"\[\[(?:File|Image|Media|Category|[a-z]{2,3}(?:-[a-z]+)?):(?:[^\[\]]|\[[^\[\]]*\])*\]\]", re.IGNORECASE
)
_LINK = re.compile(r"\[\[(?!(?:File|Image|Media|Category):)([^\[\]|]*)(?:\|([^\[\]]*))?\]\]", re.IGNORECASE)
_EXT_LINK = re.compile(r"\[(?:https?|ftp)://[^\s\]]+\s*([^\]]*)\]")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$", re.MULTILINE)
_TAG = re.compile(r"</?[a-zA-Z][^>]*>")
_QUOTES = re.compile(r"'{2,}")
_LIST_MARK = re.compile(r"^[*#:;]+\s*", re.MULTILINE)
_MAGIC = re.compile(r"__[A-Z]+__")
_SPACES = re.compile(r"[ \t]+")
_BLANKS = re.compile(r"\n\s*\n\s*")
# Sections that list sources and links rather than prose.
_TAIL_SECTIONS = (
    "references",
    "external links",
    "see also",
    "further reading",
    "notes",
    "bibliography",
    "sources",
    "footnotes",
    "citations",
)


def _remove_nested(pattern: re.Pattern, text: str) -> str:
    while True:  # innermost first, until nothing nested is left
        new = pattern.sub("", text)
        if new == text:
            return new
        text = new


def strip_wiki_markup(wikitext: str) -> str:
    """Wikitext -> plain prose: drops templates, tables, refs, files, categories and list/link syntax."""
    text = html.unescape(wikitext)
    text = _COMMENT.sub("", text)
    text = _REF.sub("", text)
    text = _DROP_TAGS.sub("", text)
    text = _remove_nested(_TEMPLATE, text)
    text = _remove_nested(_TABLE, text)
    while True:  # links nest inside file captions: resolve inner links, then drop the file, repeat
        new = _LINK.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(1), text)
        new = _FILE_LINK.sub("", new)
        if new == text:
            break
        text = new
    text = _EXT_LINK.sub(lambda m: m.group(1), text)
    text = _drop_tail_sections(text)
    text = _HEADING.sub(lambda m: "\n" + m.group(2) + "\n", text)
    text = _TAG.sub("", text)
    text = _QUOTES.sub("", text)
    text = _MAGIC.sub("", text)
    text = _LIST_MARK.sub("", text)
    text = text.replace("{{", "").replace("}}", "").replace("{|", "").replace("|}", "")
    text = _SPACES.sub(" ", text)
    lines = [line.strip() for line in text.splitlines()]
    text = "\n".join(line for line in lines if not line.startswith("|") and not line.startswith("!"))
    return _BLANKS.sub("\n\n", text).strip()


def _drop_tail_sections(text: str) -> str:
    out: list[str] = []
    skipping_level = 0
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m:
            level = len(m.group(1))
            if skipping_level and level > skipping_level:
                continue
            skipping_level = level if m.group(2).strip().lower() in _TAIL_SECTIONS else 0
        if not skipping_level:
            out.append(line)
    return "\n".join(out)


def split_paragraph_passages(text: str, min_chars: int = 300, max_chars: int = 1500) -> list[str]:
    """Group consecutive paragraphs into passages of about min..max characters (one training example each)."""
    passages: list[str] = []
    current: list[str] = []
    size = 0
    for para in text.split("\n\n"):
        para = para.strip()
        if not para:
            continue
        if size and size + len(para) > max_chars:
            passages.append("\n\n".join(current))
            current, size = [], 0
        current.append(para[:max_chars])
        size += len(para)
        if size >= min_chars:
            passages.append("\n\n".join(current))
            current, size = [], 0
    if current and size >= min_chars // 2:
        passages.append("\n\n".join(current))
    return passages
