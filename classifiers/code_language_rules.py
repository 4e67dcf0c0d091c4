"""Linguist-style language priors: file extensions and names, shebangs, editor modelines, and content
heuristics for the extensions that more than one language uses (`.h`, `.m`, `.pl`, `.v`, `.ts`).

The content classifier (`classifiers/code_language.py`) is trained on files whose extension is
unambiguous; the heuristics here resolve ambiguous extensions only when a strong marker is present.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

# extension -> language, for extensions one language owns (lower-case, with the dot)
EXTENSIONS: dict[str, str] = {
    ".py": "Python", ".pyi": "Python",
    ".c": "C",
    ".cc": "C++", ".cpp": "C++", ".cxx": "C++", ".c++": "C++", ".hpp": "C++", ".hh": "C++", ".hxx": "C++",
    ".h++": "C++", ".ipp": "C++", ".tpp": "C++",
    ".java": "Java",
    ".go": "Go",
    ".rs": "Rust",
    ".js": "JavaScript", ".mjs": "JavaScript", ".cjs": "JavaScript", ".jsx": "JavaScript",
    ".tsx": "TypeScript", ".mts": "TypeScript", ".cts": "TypeScript",
    ".rb": "Ruby", ".rake": "Ruby", ".gemspec": "Ruby",
    ".php": "PHP",
    ".pm": "Perl",
    ".sh": "Shell", ".bash": "Shell",
    ".lua": "Lua", ".rockspec": "Lua",
    ".scala": "Scala", ".sc": "Scala",
    ".swift": "Swift",
    ".kt": "Kotlin", ".kts": "Kotlin",
    ".mm": "Objective-C",
    ".hs": "Haskell", ".lhs": "Haskell",
    ".erl": "Erlang", ".hrl": "Erlang",
    ".el": "Emacs Lisp",
    ".tcl": "Tcl", ".tm": "Tcl",
    ".r": "R",
    ".sql": "SQL",
    ".sv": "Verilog", ".svh": "Verilog", ".vh": "Verilog",
    ".clj": "Clojure", ".cljs": "Clojure", ".cljc": "Clojure",
    ".lisp": "Common Lisp", ".asd": "Common Lisp",
    ".scm": "Scheme", ".rkt": "Racket",
    ".ml": "OCaml", ".mli": "OCaml",
    ".f90": "Fortran", ".f95": "Fortran", ".f03": "Fortran",
    ".cs": "C#",
    ".dart": "Dart",
    ".ex": "Elixir", ".exs": "Elixir",
    ".jl": "Julia",
    ".groovy": "Groovy", ".gradle": "Groovy",
    ".md": "Markdown", ".markdown": "Markdown",
    ".json": "JSON",
    ".yml": "YAML", ".yaml": "YAML",
    ".html": "HTML", ".htm": "HTML", ".xhtml": "HTML",
    ".css": "CSS", ".scss": "SCSS",
    ".xml": "XML", ".xsd": "XML", ".xsl": "XML", ".xslt": "XML", ".svg": "XML",
    ".mk": "Makefile", ".mak": "Makefile",
    ".cmake": "CMake",
    ".tex": "TeX", ".sty": "TeX", ".cls": "TeX",
    ".toml": "TOML",
    ".bat": "Batchfile", ".cmd": "Batchfile",
    ".ps1": "PowerShell",
}  # fmt: skip

# file names that fix the language regardless of extension
FILENAMES: dict[str, str] = {
    "makefile": "Makefile", "gnumakefile": "Makefile", "cmakelists.txt": "CMake", "dockerfile": "Dockerfile",
    "rakefile": "Ruby", "gemfile": "Ruby", "build.gradle": "Groovy", "meson.build": "Meson",
}  # fmt: skip

# extensions shared by several languages: the first is what an extension-only system records
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    ".h": ("C", "C++", "Objective-C"),
    ".m": ("Objective-C", "MATLAB"),
    ".pl": ("Perl", "Prolog"),
    ".v": ("Verilog", "Coq"),
    ".ts": ("TypeScript", "XML"),
}

INTERPRETERS: dict[str, str] = {
    "python": "Python", "python2": "Python", "python3": "Python", "pypy": "Python", "pypy3": "Python",
    "perl": "Perl", "perl5": "Perl", "ruby": "Ruby", "jruby": "Ruby",
    "sh": "Shell", "bash": "Shell", "dash": "Shell", "ksh": "Shell", "zsh": "Shell", "ash": "Shell",
    "lua": "Lua", "luajit": "Lua", "lua5.1": "Lua", "lua5.2": "Lua", "lua5.3": "Lua", "lua5.4": "Lua",
    "texlua": "Lua", "node": "JavaScript", "nodejs": "JavaScript", "deno": "TypeScript", "ts-node": "TypeScript",
    "php": "PHP", "tclsh": "Tcl", "wish": "Tcl", "expect": "Tcl", "rscript": "R", "escript": "Erlang",
    "runhaskell": "Haskell", "runghc": "Haskell", "swift": "Swift", "scala": "Scala", "kotlin": "Kotlin",
    "emacs": "Emacs Lisp", "swipl": "Prolog", "guile": "Scheme", "racket": "Racket", "sbcl": "Common Lisp",
    "julia": "Julia", "elixir": "Elixir", "groovy": "Groovy", "make": "Makefile", "octave": "MATLAB",
}  # fmt: skip

# editor modeline names -> language (Emacs `-*- mode: X -*-`, Vim `vim: ft=X`)
MODELINE_NAMES: dict[str, str] = {
    "python": "Python", "perl": "Perl", "cperl": "Perl", "ruby": "Ruby", "sh": "Shell", "bash": "Shell",
    "shell-script": "Shell", "lua": "Lua", "c": "C", "c++": "C++", "cpp": "C++", "objc": "Objective-C",
    "objective-c": "Objective-C", "java": "Java", "javascript": "JavaScript", "js": "JavaScript",
    "typescript": "TypeScript", "tcl": "Tcl", "scala": "Scala", "swift": "Swift", "haskell": "Haskell",
    "erlang": "Erlang", "emacs-lisp": "Emacs Lisp", "elisp": "Emacs Lisp", "lisp": "Common Lisp",
    "prolog": "Prolog", "coq": "Coq", "verilog": "Verilog", "matlab": "MATLAB", "octave": "MATLAB",
    "php": "PHP", "r": "R", "sql": "SQL", "makefile": "Makefile", "make": "Makefile", "go": "Go", "rust": "Rust",
    "kotlin": "Kotlin", "scheme": "Scheme", "clojure": "Clojure", "tex": "TeX", "latex": "TeX",
}  # fmt: skip

_SHEBANG = re.compile(r"^#!\s*(\S+)(?:\s+(.*))?")
_EMACS_MODE = re.compile(r"-\*-.*?(?:mode:\s*)?([\w+#-]+)\s*(?:;.*)?-\*-", re.I)
_EMACS_MODE_KEY = re.compile(r"-\*-.*?\bmode:\s*([\w+#-]+)", re.I)
_VIM_FT = re.compile(r"\b(?:vim?|ex):.*?\b(?:ft|filetype|syntax)=([\w+#-]+)", re.I)


def extension_of(path: str) -> str:
    return PurePosixPath(path).suffix.lower()


def language_from_path(path: str) -> str | None:
    """The language a path's name or extension fixes, or None (unknown or ambiguous extension)."""
    name = PurePosixPath(path).name.lower()
    if name in FILENAMES:
        return FILENAMES[name]
    return EXTENSIONS.get(extension_of(path))


def declared_language(path: str) -> str | None:
    """What an extension-only metadata system records: unambiguous mapping, else the first candidate."""
    lang = language_from_path(path)
    if lang:
        return lang
    candidates = AMBIGUOUS.get(extension_of(path))
    return candidates[0] if candidates else None


def language_from_shebang(text: str) -> str | None:
    first = text[:200].split("\n", 1)[0]
    m = _SHEBANG.match(first)
    if not m:
        return None
    prog = PurePosixPath(m.group(1)).name
    if prog == "env" and m.group(2):
        args = [a for a in m.group(2).split() if not a.startswith("-") and "=" not in a]
        prog = args[0] if args else prog
    prog = prog.lower()
    if prog in INTERPRETERS:
        return INTERPRETERS[prog]
    base = re.sub(r"[\d.]+$", "", prog)
    return INTERPRETERS.get(base)


def language_from_modeline(text: str) -> str | None:
    """Emacs modeline in the first two lines or a Vim modeline in the first/last five lines."""
    lines = text.split("\n")
    for line in lines[:2]:
        m = _EMACS_MODE_KEY.search(line) or _EMACS_MODE.search(line)
        if m and m.group(1).lower() in MODELINE_NAMES:
            return MODELINE_NAMES[m.group(1).lower()]
    for line in lines[:5] + lines[-5:]:
        m = _VIM_FT.search(line)
        if m and m.group(1).lower() in MODELINE_NAMES:
            return MODELINE_NAMES[m.group(1).lower()]
    return None


# --- heuristics for ambiguous extensions (each returns a language only on a strong marker) ---

_OBJC = re.compile(
    r"^\s*(@interface|@implementation|@protocol|@end\b|@property|#import\s)|\bNS[A-Z]\w+\s*\*", re.M
)
_CPP = re.compile(
    r"^\s*(template\s*<|namespace\s+\w*\s*\{|class\s+\w+[^;]*\{|using\s+namespace\b|public:|private:|protected:)"
    r"|\bstd::|#include\s*<(iostream|string|vector|memory|map|algorithm|utility|type_traits|cstddef|cstdint)>"
    r"|\b(constexpr|nullptr|static_cast|dynamic_cast|reinterpret_cast|noexcept)\b",
    re.M,
)
_MATLAB = re.compile(r"^\s*(function\s+(\[[^\]]*\]\s*=\s*)?\w+|%\s|%%|end(function)?\s*$|endif|endfor)", re.M)
_PROLOG = re.compile(r"^\s*:-\s*\w+|^[a-z]\w*(\([^)]*\))?\s*:-\s*$|^[a-z]\w*\(.*\)\s*:-", re.M)
_PERL = re.compile(
    r"\buse\s+(strict|warnings|vars|lib)\b|^\s*my\s*[$@%(]|\bsub\s+\w+\s*\{|^\s*package\s+\w+(::\w+)*;|^#!.*perl",
    re.M,
)
_COQ = re.compile(
    r"^\s*(Theorem|Lemma|Proof\.|Qed\.|Require\s+(Import|Export)|Definition|Inductive|Fixpoint|Module\s+\w+\s*:?)\b",
    re.M,
)
_VERILOG = re.compile(
    r"^\s*(module\s+\w+\s*[#(;]|endmodule\b|always\s*@|assign\s+\w+|input\s+(wire|reg|\[)|output\s+(wire|reg|\[)|`timescale)",
    re.M,
)
# an HTML doctype opening the file (after blanks and SGML comments): HTML whatever follows; generated docs
# (Sphinx, DocBook with upper-case tags) otherwise read as XML or Shell. 638/638 training files with it are HTML
_HTML_DOCTYPE = re.compile(r"\s*(?:<!--.*?-->\s*)*<!doctype\s+html", re.I | re.S)
_QT_TS = re.compile(r"\A\s*(<\?xml[^>]*>\s*)?(<!DOCTYPE\s+TS>|<TS\b)", re.S)
_XML = re.compile(r"\A\s*<\?xml\b")


def language_from_content_marker(text: str) -> str | None:
    """A language that a file's first bytes fix whatever the rest says (`<!DOCTYPE html` -> HTML), else None."""
    return "HTML" if _HTML_DOCTYPE.match(text, 0, 3000) else None


def resolve_ambiguous(ext: str, text: str) -> str | None:
    """Linguist-style heuristics for `.h .m .pl .v .ts`; None when no strong marker fires."""
    head = text[:20000]
    if ext == ".h":
        if _OBJC.search(head):
            return "Objective-C"
        if _CPP.search(head):
            return "C++"
        return None
    if ext == ".m":
        if _OBJC.search(head):
            return "Objective-C"
        if _MATLAB.search(head):
            return "MATLAB"
        return None
    if ext == ".pl":
        perl, prolog = bool(_PERL.search(head)), bool(_PROLOG.search(head))
        return "Perl" if perl and not prolog else "Prolog" if prolog and not perl else None
    if ext == ".v":
        coq, verilog = bool(_COQ.search(head)), bool(_VERILOG.search(head))
        return "Coq" if coq and not verilog else "Verilog" if verilog and not coq else None
    if ext == ".ts":
        if _QT_TS.search(head) or _XML.search(head):
            return "XML"
        return "TypeScript"
    return None


@dataclass(frozen=True)
class Prior:
    language: str | None
    source: str  # filename | extension | shebang | modeline | heuristic | none
    ambiguous: bool = False


def language_prior(path: str, text: str) -> Prior:
    """The strongest non-learned evidence for a file's language (Linguist order: name/extension, shebang,
    modeline, heuristics)."""
    name = PurePosixPath(path).name.lower()
    if name in FILENAMES:
        return Prior(FILENAMES[name], "filename")
    ext = extension_of(path)
    if ext in EXTENSIONS:
        return Prior(EXTENSIONS[ext], "extension")
    if lang := language_from_shebang(text):
        return Prior(lang, "shebang")
    if lang := language_from_modeline(text):
        return Prior(lang, "modeline")
    if ext in AMBIGUOUS:
        return Prior(resolve_ambiguous(ext, text), "heuristic", ambiguous=True)
    return Prior(None, "none")
