"""Linguist-style language priors: file extensions and names, shebangs, editor modelines, and content
heuristics for the extensions that more than one language uses (`.h`, `.m`, `.pl`, `.v`, `.ts`).

These are the prediction side's rules: the priors of `CodeLanguageClassifier.decide` and the content markers,
script headers and corrections of `predict_content`. The labels the classifier is trained and scored on come
from `classifiers/code_language_labels.py`, which shares no rule with this module (only the extension and file
name tables), so tuning a rule here cannot move a label.
"""

from __future__ import annotations

import json
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
    ".f90": "Fortran", ".f95": "Fortran", ".f03": "Fortran", ".f08": "Fortran", ".f": "Fortran", ".for": "Fortran",
    ".f77": "Fortran",
    ".zig": "Zig",
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
    ".ps1": "PowerShell", ".psm1": "PowerShell", ".psd1": "PowerShell",
}  # fmt: skip

# file names that fix the language regardless of extension
FILENAMES: dict[str, str] = {
    "makefile": "Makefile", "gnumakefile": "Makefile", "cmakelists.txt": "CMake", "dockerfile": "Dockerfile",
    "containerfile": "Dockerfile",
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
# the polyglot trick `#!/bin/sh` + `exec tclsh "$0" "$@"`: the script is the exec'd interpreter's (Linguist's rule)
_SHELL_REEXEC = re.compile(r"^\s*exec\s+(\S+)\s.*\$0\b", re.M)
_EMACS_MODE = re.compile(r"-\*-.*?(?:mode:\s*)?([\w+#-]+)\s*(?:;.*)?-\*-", re.I)
_EMACS_MODE_KEY = re.compile(r"-\*-.*?\bmode:\s*([\w+#-]+)", re.I)
_VIM_FT = re.compile(r"\b(?:vim?|ex):.*?\b(?:ft|filetype|syntax)=([\w+#-]+)", re.I)


def extension_of(path: str) -> str:
    return PurePosixPath(path).suffix.lower()


_DOCKERFILE_NAME = re.compile(r"(?:dockerfile|containerfile)\.[\w.-]+|[\w.-]+\.dockerfile")
# `Dockerfile.<x>` whose suffix is another format's: editor bundles (`Dockerfile.tmPreferences` is an XML plist)
_NOT_DOCKERFILE_SUFFIXES = frozenset({".tmpreferences", ".tmlanguage", ".tmsnippet", ".plist", ".sublime-syntax",
                                      ".vim", ".orig", ".rej", ".patch", ".diff", ".txt", ".rst"})  # fmt: skip


def is_dockerfile_name(name: str) -> bool:
    """A lower-cased file name that is a Dockerfile's by convention, unless its suffix is a known other format."""
    if not _DOCKERFILE_NAME.fullmatch(name) or name.endswith(".dockerfile"):
        return bool(_DOCKERFILE_NAME.fullmatch(name))
    suffix = extension_of(name)
    return suffix not in EXTENSIONS and suffix not in _NOT_DOCKERFILE_SUFFIXES


def language_from_path(path: str) -> str | None:
    """The language a path's name or extension fixes, or None (unknown or ambiguous extension)."""
    name = PurePosixPath(path).name.lower()
    if name in FILENAMES:
        return FILENAMES[name]
    if is_dockerfile_name(name):  # Dockerfile.alpine, Containerfile.test, base.dockerfile
        return "Dockerfile"
    return EXTENSIONS.get(extension_of(path))


def declared_language(path: str) -> str | None:
    """What an extension-only metadata system records: unambiguous mapping, else the first candidate."""
    lang = language_from_path(path)
    if lang:
        return lang
    candidates = AMBIGUOUS.get(extension_of(path))
    return candidates[0] if candidates else None


def language_from_shebang(text: str) -> str | None:
    """The interpreter named on the `#!` line; a shell script that re-executes itself under another
    interpreter within its first five lines is that interpreter's (None when that one is unknown)."""
    first = text[:200].split("\n", 1)[0]
    m = _SHEBANG.match(first)
    if not m:
        return None
    prog = PurePosixPath(m.group(1)).name
    if prog == "env" and m.group(2):
        args = [a for a in m.group(2).split() if not a.startswith("-") and "=" not in a]
        prog = args[0] if args else prog
    lang = _interpreter_language(prog)
    if lang == "Shell" and (exe := _SHELL_REEXEC.search("\n".join(text[:1000].split("\n", 5)[:5]))):
        return _interpreter_language(PurePosixPath(exe.group(1).strip("'\"")).name)
    return lang


def _interpreter_language(prog: str) -> str | None:
    prog = prog.lower()
    if prog in INTERPRETERS:
        return INTERPRETERS[prog]
    return INTERPRETERS.get(re.sub(r"[\d.]+$", "", prog))


def language_from_modeline(text: str) -> str | None:
    """Emacs modeline in the first two lines or a Vim modeline in the first/last five lines."""
    head = text[:2000].split("\n", 5)[:5]  # bounded windows: the check runs on every file
    for line in head[:2]:
        if "-*-" not in line:
            continue
        m = _EMACS_MODE_KEY.search(line) or _EMACS_MODE.search(line)
        if m and m.group(1).lower() in MODELINE_NAMES:
            return MODELINE_NAMES[m.group(1).lower()]
    tail = text[-2000:].rsplit("\n", 5)[-5:] if len(head) == 5 else []
    for line in head + tail:
        if ":" not in line:
            continue
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
# Content strategies (Linguist's XML strategy and the like): markers at the top of a file that fix its
# language whatever the model says. Counts are over the labelled files of the tiny crawl (code-0001).
# An HTML doctype, after an optional XML declaration (XHTML) and SGML comments: 1,052 of 1,055 are HTML;
# generated docs (AsciiDoc, Sphinx, DocBook) otherwise read as C++, JavaScript, XML or Shell.
_HTML_DOCTYPE = re.compile(r"<!doctype\s+html", re.I)
_QT_TS = re.compile(r"\A\s*(<\?xml[^>]*>\s*)?(<!DOCTYPE\s+TS>|<TS\b)", re.S)
_XML = re.compile(r"\A\s*<\?xml\b")
# an XML declaration with no html element near the top: 984 of 984 are XML (with one: a quarter are XHTML)
_HTML_ELEMENT = re.compile(r"<html\b|<!doctype\s+html", re.I)
# a root element with a namespace (XSLT, SVG, WordML), not <html>: 127 of 127 are XML
_XMLNS_ROOT = re.compile(r"<(?!html\b)[\w:.-]+\s[^>]*?\bxmlns(?::\w+)?=", re.I)
# a root element that is no HTML element (and no custom element: those have a hyphen), after comments and a
# doctype: on code-0001 files outside the test packages it fires on 421 of 810 XML files (147 of them not
# caught by the declaration and xmlns markers) and on none of 850 HTML, 713 PHP and 36 Markdown files
_ROOT_ELEMENT = re.compile(r"<([A-Za-z][\w:.-]*)")
_HTML_ELEMENT_NAMES = frozenset(
    "a abbr address area article aside audio b base bdi bdo blockquote body br button canvas caption cite code "
    "col colgroup data datalist dd del details dfn dialog div dl dt em embed fieldset figcaption figure footer "
    "form h1 h2 h3 h4 h5 h6 head header hgroup hr html i iframe img input ins kbd label legend li link main map "
    "mark menu meta meter nav noscript object ol optgroup option output p param picture pre progress q rp rt "
    "ruby s samp script search section select slot small source span strong style sub summary sup table tbody "
    "td template textarea tfoot th thead time title tr track u ul var video wbr center font frameset frame "
    "noframes big tt acronym applet basefont dir strike marquee nobr svg math".split()
)
_LITERATE_HASKELL = re.compile(r"\A\s*\\begin\{code\}")  # .lhs in LaTeX style: 30 of 30 are Haskell
# Decisive constructs for pairs of languages the model confuses, with how often they fire on the crawl's
# files of the other language. C++: `template <`, `std::`, `a::b` outside a comment line (2 of 2,232 C files); an
# include of a standard header without `.h` (`<vector>`, `<cstdio>`) or of a `.hpp`/`.hh` header (0 C files)
_CPP_ONLY = re.compile(
    r"^\s*(template\s*<|namespace\s+\w*\s*\{|using\s+namespace\b)|\bstd::|^[^/*\n:]*\w::[A-Za-z_~]"
    r"|\b(nullptr|static_cast|reinterpret_cast)\b",
    re.M,
)
_CPP_INCLUDE = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*(<[A-Za-z_]\w*>|[\"<][^\">\n]*\.(hpp|hh|hxx|h\+\+|ipp|tcc|tpp)[\">])", re.M
)
# MATLAB/Octave: `function [a, b] = name(` (1,477 of 1,531 MATLAB files; 4 of 1,606 HTML files, Octave's docs)
_MATLAB_FUNCTION = re.compile(r"^\s*function\s+(\[[\w\s,~]*\]|\w+)\s*=\s*[\w.]+\s*(\(|$)", re.M)
# Ruby: a `module X` / `class X < Y` line and later a bare `end` (1,245 of 1,394 Ruby files; 5 Markdown files with
# Ruby snippets, 1 YAML file, no others)
_RUBY_BLOCK = re.compile(
    r"^[ \t]*(module|class)[ \t]+[A-Z][\w:]*([ \t]*<[ \t]*[A-Z][\w:]*)?[ \t]*\n(.*\n)*?[ \t]*end[ \t]*$", re.M
)
# an ES module import (TypeScript 2,810 of 3,458 files, JavaScript 1,011 of 3,641, Markdown 34, no others)
_ES_IMPORT = re.compile(
    r"^import\s+(type\s+)?(\*\s+as\s+\w+|\{[^}]*\}|\w+)(\s*,\s*(\{[^}]*\}|\*\s+as\s+\w+))?\s+from\s+[\"']",
    re.M,
)
# Java's `package a.b;` (2,219 of 2,264 Java files; Kotlin 1 of 2,251, but Scala 44 and Perl 77)
_JAVA_PACKAGE = re.compile(r"^package\s+[\w.]+\s*;", re.M)
# R's `f <- function(` (602 of 981 R files, no others); a Markdown code fence vetoes (R snippets in docs)
_R_FUNCTION = re.compile(r"^[ \t]*[\w.]+[ \t]*<<?-[ \t]*function[ \t]*\(", re.M)
# make's special targets, or a recipe running make (144 of 372 Makefiles; 3 of 921 Shell files, 2 of 31 others)
_MAKE_SPECIAL_TARGET = re.compile(
    r"^\.(POSIX|PHONY|DEFAULT|SUFFIXES)\s*:|^\t[@+-]?(\$\(MAKE\)|g?make\b)", re.M
)
# Lua: `local x =`, `local function`, `require "x"` (95% of Lua files, 0 of 778 Haskell files); Haskell's `--`
# comments otherwise pull comment-heavy Lua (Lmod) to Haskell
_LUA_ONLY = re.compile(r"^\s*local\s+(function\s+)?[A-Za-z_][\w,\s]*(=|$)|^\s*require\s*\(?\s*[\"']", re.M)
# `local function f(` or `local a, b = ` (spaces around `=`, unlike a shell `local a=1`): 94% of Lua files, 1 of
# 790 Shell and 17 Markdown files (Lua snippets in docs), none in other languages
_LUA_LOCAL = re.compile(
    r"^\s*local\s+(function\s+[\w.:]+\s*\(|[A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*\s+=\s)", re.M
)
# Kotlin's `fun`, `const val`, `data class`, `import kotlin.` (86% of Kotlin files, 0 of 1,632 Scala);
# Scala's `import a._`, `import a.{`, `def f(`, `case class`, `implicit`, `class A extends` (92% of Scala files,
# 2 of 2,085 Kotlin)
_KOTLIN_ONLY = re.compile(
    r"^\s*((private|public|internal|protected|override|suspend|inline|operator|open|abstract)\s+)*fun\s"
    r"|\bconst\s+val\b|^\s*import\s+kotlinx?\.|^\s*data\s+class\b",
    re.M,
)
_SCALA_ONLY = re.compile(
    r"^\s*import\s+[\w.]+\._\s*$|^\s*import\s+[\w.]+\.\{|^\s*((override|private|protected|final|implicit)\s+)*"
    r"def\s+\w+[\[(:=]|\bcase\s+class\b|\bimplicit\b|^\s*(sealed\s+|abstract\s+|final\s+)*(class|object|trait)\s+\w+.*"
    r"\bextends\b",
    re.M,
)
# Scala declarations C++ never has: `object A`, `trait A`, `import a._`, `case class`, a `package a.b` line
# without `;` (91% of Scala files, 1 of 2,782 C++)
_SCALA_DECL = re.compile(
    r"^\s*(case\s+)?(object|trait)\s+\w+|^\s*import\s+[\w.]+\._\s*$|\bcase\s+class\b|^package\s+[\w.]+\s*$",
    re.M,
)
# Java always ends `package` and `import` lines with `;`; Groovy need not (a semicolon-less one in 125 of 237
# Groovy training files, 0 of 1,027 Java; Kotlin and Scala, which omit it too, veto on their own syntax)
_IMPORT_WITHOUT_SEMICOLON = re.compile(
    r"^(?:package|import)[ \t]+(?:static[ \t]+)?[\w.]+(?:\.\*)?[ \t]*$", re.M
)
# Fortran's fixed-form declarations in upper case from column 7 (`      SUBROUTINE X(`, `      IMPLICIT NONE`,
# `      DOUBLE PRECISION A`) or an `end subroutine` / `END PROGRAM` line (597 of 1,131 Fortran training files, none
# of any other label); LAPACK's `*>` doc comments otherwise read as Markdown
_FORTRAN_DECLARATION = re.compile(
    r"^ {6,}(?:SUBROUTINE|(?:(?:INTEGER|REAL|DOUBLE PRECISION|COMPLEX|LOGICAL)(?:\*\d+)? )?FUNCTION|PROGRAM"
    r"|IMPLICIT NONE|IMPLICIT (?:DOUBLE PRECISION|REAL|INTEGER)|DOUBLE PRECISION|COMMON|DIMENSION|EXTERNAL"
    r"|INTRINSIC) [\w(/]|^[ \t]*(?:end|END)[ \t]*(?:subroutine|SUBROUTINE|program|PROGRAM)\b",
    re.M,
)
# Dart's `import 'package:`, `import 'dart:`, `part of x;`, `library x;` (99 of 112 Dart training files; none of
# 11,166 Java, JavaScript, C#, TypeScript, Kotlin, Scala, Groovy, C++ or Swift files)
_DART_DIRECTIVE = re.compile(
    r"^(?:import|export|part) '(?:package|dart):|^(?:part of|library) [\w.'/]+;|^part '[\w./]+\.dart';", re.M
)
# SCSS next to CSS: `//` comments, `$var:`, `@mixin` / `@include` / `@extend` / `@use`, `#{$`, nested `&` (375 of 445
# SCSS training files, 0 of 410 CSS)
_SCSS_ONLY = re.compile(
    r"^[ \t]*//|^[ \t]*\$[\w-]+[ \t]*:|@(?:mixin|include|extend|use|forward|each)\b|#\{\$|^[ \t]*&[:.\-\[ ]",
    re.M,
)
# Markdown syntax: a heading, a list item, a code fence, a link, inline code or bold, a quote, a table row. 866 of
# 915 Markdown training files have one (the rest are a sentence or two of prose); on dev v4 the model's Markdown
# without any was never right (49 files: TOML such as rpmlint's configs, HTML fragments, prose)
_MARKDOWN_SYNTAX = re.compile(
    r"^#{1,6}[ \t]+\S|^\S[^\n]*\n(?:={3,}|-{3,})[ \t]*$|^[ \t]{0,3}(?:[-*+]|\d{1,3}[.)])[ \t]+\S"
    r"|^[ \t]{0,3}(?:```|~~~)|\[[^\]\n]+\]\([^)\s]+[^)\n]*\)|^\[[^\]\n]+\]:[ \t]+\S|`[^`\n]+`|\*\*[^*\n]+\*\*"
    r"|^>[ \t]|^\|.*\|[ \t]*$",
    re.M,
)
# a Python `def f(...):` line (1,060 of 1,438 .py files of code-0001; 4 Scala files, whose `def f(a: A):` has its
# result type on the next line, vetoed below; no Kotlin, Swift or Ruby file)
_PYTHON_DEF = re.compile(r"^\s*(async\s+)?def\s+\w+\s*\([^)]*\)\s*(->\s*[^:\n]+)?:\s*$", re.M)
# Haskell: a type signature `f :: T`, `module A where`, a `{-# PRAGMA`, `import qualified` (99% of Haskell files,
# none of Python, Erlang, Lua, Go, Rust or C; Ruby's bare `module A` lines match, so Ruby is not corrected)
_HASKELL_DECL = re.compile(
    r"^[a-z]\w*\s*::\s|^module\s+[A-Z][\w.]*\s*(\(|where\b|$)|\{-#\s*[A-Z]|^import\s+qualified\s", re.M
)
# Emacs Lisp's `(provide '`, `(defcustom`, `(interactive`, `lexical-binding` (94% of Emacs Lisp, 4 of 542
# Common Lisp files); Common Lisp's `(in-package`, `(defpackage`, `(asdf:` (98% of Common Lisp, 0 Emacs Lisp)
_ELISP_ONLY = re.compile(
    r"\(provide\s+'|\(defcustom\b|\(interactive\b|lexical-binding|^;;; [\w-]+\.el\b|\(require\s+'", re.M
)
_COMMON_LISP_ONLY = re.compile(r"\(in-package\b|\(defpackage\b|\(asdf:|\(defsystem\b|\(uiop:")
# Objective-C's `#import "x"`, `@interface`, `@implementation`, `@end` (99% of Objective-C, 3 of 2,780 C++ and
# no C, JavaScript or TypeScript files); licence-headed headers otherwise read as C, C++ or TypeScript
_OBJC_ONLY = re.compile(r"^\s*#import\s*[\"<]|^\s*@(interface|implementation|protocol)\b|^\s*@end\b", re.M)
# TypeScript's `interface A {`, `type A =`, `import type`, `(x: number`, `): void {` outside comments (86% of
# TypeScript files, 6 of 3,707 JavaScript files); Flow-typed JavaScript has them too, hence the `@flow` veto
_TYPESCRIPT_ONLY = re.compile(
    r"^\s*(export\s+)?(declare\s+)?interface\s+[A-Z]\w*(<[^>\n]*>)?\s*(extends\s+[\w.<>, ]+)?\{"
    r"|^\s*(export\s+)?type\s+[A-Z]\w*(<[^>\n]*>)?\s*=|^\s*import\s+type\s"
    r"|^(?!\s*(\*|//|/\*))[^\n{]*?[(,][ \t]*\w+\??[ \t]*:[ \t]*(number|string|boolean|any|unknown)(\[\])?[ \t]*[,)=]"
    r"|^(?!\s*(\*|//|/\*))[^\n]*\)[ \t]*:[ \t]*(Promise<[\w<>\[\]]+>|void|number|string|boolean)[ \t]*(\{|=>)",
    re.M,
)
# any TypeScript syntax (declarations, modifiers, annotations, casts, generic calls, `!.`): in 2,212 of 2,393
# TypeScript files of code-0001 outside the test packages, 27 of 2,553 JavaScript files (the rest are
# re-export index files, also valid JavaScript)
_NOT_COMMENT = r"^(?!\s*(?:\*|//|/\*))[^\n]*"
_TYPESCRIPT_SYNTAX = re.compile(
    "|".join([
        r"^\s*(export\s+)?(declare\s+)?(interface|type|enum|namespace|module)\s+[A-Za-z_$][\w$]*",
        r"^\s*(export\s+)?(declare|abstract)\s|^\s*import\s+type\b|^\s*export\s+type\b|\bimplements\s+[A-Z]",
        r"^\s*(public|private|protected|readonly)\s+[\w$]|\b(public|private|protected|readonly)\s+[\w$]+\s*[:?;=,)]",
        _NOT_COMMENT + r"\([ \t]*[\w$]+\??[ \t]*:[ \t]*[\w$.]+(<[^>\n]*>)?(\[\])*[ \t]*[,)=]",
        _NOT_COMMENT + r"\)[ \t]*:[ \t]*[\w$.]+(<[^>\n]*>)?(\[\])*[ \t]*(\{|=>)",
        _NOT_COMMENT + r"[\w$)\]?][ \t]*:[ \t]*(string|number|boolean|any|void|unknown|never)(\[\])?[ \t]*[;,)=|&>{]",
        r"[\w$)\]]\s+as\s+(const|any|unknown|string|number|boolean|[A-Z][\w$.]*)\s*(<|\[\]|[;),])",
        r"^\s*(let|const|var)\s+[\w$]+\s*[?!]?:\s*[\w$]",
        r"[\w$]<[A-Z][\w$]*(\[\])?(\s*,\s*[A-Z][\w$]*)*>\s*\(|[\w$)\]]!\.",
    ]),
    re.M,
)  # fmt: skip
_FLOW = re.compile(r"@flow\b")
_PHP_TAG = re.compile(r"<\?php\b")
# JavaScript declarations and modules: `const x = `, `import a from "b"`, `exports.x =`, `"use strict";` (92% of
# JavaScript files; 1 of 453 YAML, 2 of 825 PHP, 3 of 1,003 Ruby, 3 of 1,097 Python, no Shell, C, C++ or Java)
_JAVASCRIPT_DECL = re.compile(
    r"^\s*(const|let|var)\s+[\w$]+\s*=\s|^\s*import\s.*\sfrom\s+[\"']|^\s*(module\.)?exports(\.[\w$]+)?\s*="
    r"|^\s*[\"']use strict[\"'];",
    re.M,
)
_JSON_MAX_CHARS = 200_000  # larger files are left to the model: parsing them would cost more than it fixes


_YAML_PARSE_CHARS = 4000
_YAML_DOC_START = re.compile(r"---[ \t]*\r?\n")


def _is_yaml_mapping_document(text: str) -> bool:
    """A file opening with a `---` line whose head parses as one YAML mapping: 51 of 51 such crawled files are
    YAML (Markdown front matter is followed by a second document; Lua/Haskell `-----` banners never start so).
    Only the head (`_YAML_PARSE_CHARS`, cut at a line end) is parsed: parsing long YAML files whole (up to 160 ms
    each) took more time than all the other marker checks together, and on tiny's held-out files the head decides
    the same as the whole file, besides 4 YAML files over the old 200,000-char cap now found."""
    return _YAML_DOC_START.match(text) is not None and _parses_as_yaml_mapping(text)


def _parses_as_yaml_mapping(text: str, min_keys: int = 1) -> bool:
    """The file's head (`_YAML_PARSE_CHARS`, cut at a line end) parses as one YAML mapping whose keys are written as
    YAML keys, with `min_keys`+ of them counting those of the mappings nested in it."""
    import yaml

    from infra.yaml_text import load_yaml

    head = text if len(text) <= _YAML_PARSE_CHARS else text[: text.rfind("\n", 0, _YAML_PARSE_CHARS) + 1]
    try:
        doc = load_yaml(head)
    except yaml.YAMLError:
        return False
    if not isinstance(doc, dict) or not all(_YAML_KEY.match(str(k)) for k in doc):
        return False
    return len(doc) >= min_keys or len(doc) + _nested_yaml_keys(doc.values()) >= min_keys


def _nested_yaml_keys(values, depth: int = 0) -> int:
    """Keys written as YAML keys in the mappings under these values (a locale file's `en:` holds the rest)."""
    n = 0
    for v in values:
        if depth < 8 and isinstance(v, dict):
            n += sum(bool(_YAML_KEY.match(str(k))) for k in v) + _nested_yaml_keys(v.values(), depth + 1)
        elif depth < 8 and isinstance(v, list):
            n += _nested_yaml_keys(v, depth + 1)
    return n


# a key as YAML files write them; code read as YAML gives keys like `const y = cond ? f(x)`
_YAML_KEY = re.compile(r"[\w$:.\-/ ]+\Z")


_FRONT_MATTER_END = re.compile(r"^(?:---|\.\.\.)[ \t]*\r?$", re.M)


def front_matter_body(text: str) -> str | None:
    """What follows a leading YAML front matter block (`---` ... `---`, as Jekyll, Hugo and pandoc Markdown
    open), if it is not blank: the block says nothing of the language of the rest."""
    start = _YAML_DOC_START.match(text)
    end = start and _FRONT_MATTER_END.search(text, start.end(), _YAML_PARSE_CHARS)
    if not end:
        return None
    body = text[end.end() :].removeprefix("\n")
    return body if body.strip() else None


def _is_json_document(text: str) -> bool:
    """A JSON object or array that parses (720 of 722 such files are JSON; 2 YAML files are valid JSON)."""
    head = text[:256].lstrip()[:1]
    if head not in ("{", "[") or len(text) > _JSON_MAX_CHARS:
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _markup_start(text: str, skip_xml_declaration: bool = False, limit: int = 3000, pos: int = 0) -> int:
    """Where a markup file's first element starts (from `pos`): after blanks, SGML comments and, optionally,
    the XML declaration (found with str.find: a regex over nested comments backtracks badly)."""
    head = text[pos:limit]
    pos += len(head) - len(head.lstrip())
    if skip_xml_declaration and text.startswith("<?xml", pos):
        end = text.find("?>", pos, limit)
        pos = end + 2 if end >= 0 else pos
    while pos < limit:
        while pos < limit and text[pos : pos + 1].isspace():
            pos += 1
        if not text.startswith("<!--", pos):
            break
        end = text.find("-->", pos + 4, limit)
        if end < 0:
            break
        pos = end + 3
    return pos


def _root_is_not_html(text: str, limit: int = 3000) -> bool:
    """The first element (after comments and a non-HTML doctype) is named as no HTML or custom element is."""
    pos = _markup_start(text, limit=limit)
    if text.startswith("<!", pos):  # a doctype (`<!DOCTYPE book PUBLIC ...>`); comments are already skipped
        end = text.find(">", pos, limit)
        if end < 0:
            return False
        pos = _markup_start(text, limit=limit, pos=end + 1)
    m = _ROOT_ELEMENT.match(text, pos, limit)
    return m is not None and "-" not in m.group(1) and m.group(1).lower() not in _HTML_ELEMENT_NAMES


# Ruby's magic comment in a file's first lines: 910 of 1,394 crawled Ruby files, no other file
_RUBY_MAGIC_COMMENT = re.compile(r"(#.*\n){0,3}#\s*(-\*-.*)?frozen_string_literal:\s*(true|false)")


def language_from_script_header(text: str) -> str | None:
    """A script's own declaration of its language: its `#!` line, else an editor modeline or Ruby's
    `# frozen_string_literal:` magic comment."""
    lang = language_from_shebang(text) if text.startswith("#!") else None
    if lang is None and text.startswith("#") and _RUBY_MAGIC_COMMENT.match(text):
        return "Ruby"
    return lang or language_from_modeline(text)


def language_from_content_marker(text: str) -> str | None:
    """A language that a file's content fixes whatever the model says, else None: `<?php` first -> PHP, an HTML
    doctype -> HTML, an XML declaration without an html element, an xmlns root or a root element HTML does not
    have -> XML, literate Haskell, a YAML mapping document, a parsing JSON object/array -> JSON."""
    head = text[:256].lstrip()
    first = head[:1]  # one cheap look decides which checks can fire
    if first == "<":
        if head.startswith("<?php"):  # all 1,422 such files outside the frozen test set are PHP
            return "PHP"
        if _HTML_DOCTYPE.match(text, _markup_start(text, skip_xml_declaration=True)):
            return "HTML"
        if _XML.match(text):
            return None if _HTML_ELEMENT.search(text, 0, 5000) else "XML"
        if _XMLNS_ROOT.match(text, _markup_start(text), 5000):
            return "XML"
        return "XML" if _root_is_not_html(text) else None
    if first == "\\" and _LITERATE_HASKELL.match(text):
        return "Haskell"
    if first == "-" and _is_yaml_mapping_document(text):
        return "YAML"
    if _is_json_document(text):
        return "JSON"
    return None


@dataclass(frozen=True)
class Construct:
    """A regex with the literal strings one of which any match contains: a substring test (C speed) skips the
    regex on the many files that cannot match, which keeps the corrections cheap next to the model."""

    pattern: re.Pattern
    needles: tuple[str, ...]

    def search(self, text: str) -> bool:
        window = text[:_CORRECTION_SCAN_CHARS]
        return any(n in window for n in self.needles) and self.pattern.search(window) is not None


class AnyOf:
    """Constructs of which any one is decisive: each keeps its own needles, so one whose needle is in every file of
    a language (`include` in C) does not make the others' slower regexes run on all of them."""

    def __init__(self, *constructs: Construct):
        self.constructs = constructs

    def search(self, text: str) -> bool:
        return any(c.search(text) for c in self.constructs)


class AllOf(AnyOf):
    """Constructs that must all be there."""

    def search(self, text: str) -> bool:
        return all(c.search(text) for c in self.constructs)


class YamlMapping:
    """A head that parses as a YAML mapping of 2+ keys written as YAML keys, nested ones included (locale files hold
    one `en:` key): of the training files of dev v4's protocol, 506 YAML, 3 unknown and 2 OCaml ones, no others
    (JSON, which parses too, is decided before the model, and does not open with a `key:` line)."""

    def search(self, text: str) -> bool:
        return _YAML_FIRST_KEY.match(text) is not None and _parses_as_yaml_mapping(text, min_keys=2)


# a mapping's first key, after blank and comment lines: rules out most code before the (slower) parse. A comment
# stops before `\r`: if it could end either side of it, CRLF comment lines would backtrack exponentially
_YAML_FIRST_KEY = re.compile(r"(?:[ \t]*(?:#[^\r\n]*)?\r?\n)*(?:---[ \t]*\r?\n)?[\w$:.\-/ ]+:(?:[ \t]|\r?\n)")


_CORRECTION_SCAN_CHARS = 8000
_OBJC = Construct(_OBJC_ONLY, ("#import", "@interface", "@implementation", "@protocol", "@end"))
_CPP_CONSTRUCT = AnyOf(
    Construct(_CPP_ONLY, ("::", "template", "namespace", "nullptr", "_cast")),
    Construct(_CPP_INCLUDE, ("include",)),
)
_MATLAB_DECL = Construct(_MATLAB_FUNCTION, ("function",))
_RUBY = Construct(_RUBY_BLOCK, ("end",))
_MAKEFILE = Construct(_MAKE_SPECIAL_TARGET, (".PHONY", ".POSIX", ".DEFAULT", ".SUFFIXES", "make", "MAKE"))
_ES_MODULE = Construct(_ES_IMPORT, ("import",))
_JAVA = Construct(_JAVA_PACKAGE, ("package",))
_R = Construct(_R_FUNCTION, ("function",))
_MARKDOWN_FENCE = Construct(re.compile(r"^[ \t]*```", re.M), ("```",))
_LUA_REQUIRE = Construct(_LUA_ONLY, ("local", "require"))
_LUA_LOCAL_DECL = Construct(_LUA_LOCAL, ("local",))
_TS = Construct(
    _TYPESCRIPT_ONLY, ("interface", "type", "number", "string", "boolean", "any", "unknown", "void")
)
_JS = Construct(_JAVASCRIPT_DECL, ("const", "let", "var", "import", "exports", "use strict"))
_KOTLIN = Construct(_KOTLIN_ONLY, ("fun", "const val", "import kotlin", "data class"))
_SCALA = Construct(_SCALA_ONLY, ("import", "def", "case class", "implicit", "extends"))
_SCALA_DECLARATION = Construct(_SCALA_DECL, ("object", "trait", "import", "case class", "package"))
# Scala that Groovy and Java never are: `import a._`, `import a.{`, `case class`, an `object A` line, `implicit def`,
# `val x =`, `def f(...): T` (1,396 of 1,553 Scala training files; 0 of 237 Groovy, 2 of 1,027 Java); dev v4's
# Scala read as Groovy (Gradle's Play samples) has them
# (each with its own needles: most Java files say "import" and "object")
_SCALA_NOT_GROOVY_DECL = AnyOf(
    Construct(re.compile(r"^import [\w.]+\.(?:_|\{)", re.M), ("._", ".{")),
    Construct(re.compile(r"\bcase (?:class|object)\b"), ("case class", "case object")),
    Construct(re.compile(r"^[ \t]*(?:private |final )?(?:case )?object \w+", re.M), ("object ",)),
    Construct(re.compile(r"\bimplicit (?:def|val|class|object|lazy)\b"), ("implicit ",)),
    Construct(re.compile(r"\bval \w+\s*[:=]"), ("val ",)),
    Construct(re.compile(r"\bdef \w+(?:\[[^\]\n]*\])?\([^)\n]*\)\s*:\s*[A-Z]"), ("def ",)),
)
_GROOVY_IMPORT = Construct(_IMPORT_WITHOUT_SEMICOLON, ("package", "import"))
_FORTRAN = Construct(
    _FORTRAN_DECLARATION,
    ("      SUBROUTINE", " FUNCTION", "      PROGRAM", "      IMPLICIT", "      DOUBLE PRECISION", "      COMMON",
     "      DIMENSION", "      EXTERNAL", "      INTRINSIC", "subroutine", "SUBROUTINE", "program", "PROGRAM"),
)  # fmt: skip
_DART = Construct(_DART_DIRECTIVE, ("import '", "export '", "part", "library "))
_SCSS = Construct(_SCSS_ONLY, ("//", "$", "@mixin", "@include", "@extend", "@use", "@forward", "@each", "&"))
_PYTHON = Construct(_PYTHON_DEF, ("def",))
_HASKELL = Construct(_HASKELL_DECL, ("::", "module", "{-#", "import qualified"))
_ELISP = Construct(
    _ELISP_ONLY, ("(provide", "(defcustom", "(interactive", "lexical-binding", ";;; ", "(require")
)
_COMMON_LISP = Construct(_COMMON_LISP_ONLY, ("(in-package", "(defpackage", "(asdf:", "(defsystem", "(uiop:"))
_FLOW_MARK = Construct(_FLOW, ("@flow",))
_TS_SYNTAX = Construct(_TYPESCRIPT_SYNTAX, (":", "as", "!.", "type", "interface", "enum", "namespace", "module",
                                            "declare", "abstract", "implements", "public", "private", "protected",
                                            "readonly", "<"))  # fmt: skip
_PHP = Construct(_PHP_TAG, ("<?php",))

_LANGUAGES = frozenset(EXTENSIONS.values()).union(FILENAMES.values(), *AMBIGUOUS.values())
_NOT_ES_MODULE = _LANGUAGES - {"JavaScript", "TypeScript", "Markdown", "HTML"}
# what the model took MATLAB for (HTML is left out: Octave's HTML docs carry MATLAB functions)
_NOT_MATLAB = frozenset(
    "Verilog C C++ Markdown R Python Ruby Lua Perl Coq Prolog Shell Objective-C Scala Rust Go".split()
)
# (languages the model said, the correction, a construct decisive for it (None: none needed), one that vetoes it)
Evidence = Construct | AnyOf | YamlMapping  # anything with .search(text) -> bool
_PAIR_CORRECTIONS: list[tuple[frozenset[str], str, Evidence | None, Evidence | None]] = [
    (_NOT_MATLAB, "MATLAB", _MATLAB_DECL, None),
    (frozenset({"C", "C++", "TypeScript", "JavaScript"}), "Objective-C", _OBJC, None),
    (frozenset({"C"}), "C++", _CPP_CONSTRUCT, None),
    (frozenset({"Haskell"}), "Lua", _LUA_REQUIRE, None),
    (
        frozenset({"Python", "Erlang", "Lua", "Go", "Rust", "C", "Emacs Lisp", "Common Lisp"}),
        "Haskell",
        _HASKELL,
        None,
    ),
    (_LANGUAGES - {"Lua", "Markdown", "C++", "Shell"}, "Lua", _LUA_LOCAL_DECL, None),
    (_LANGUAGES - {"Makefile", "Shell"}, "Makefile", _MAKEFILE, None),
    (
        frozenset({"YAML", "Python", "C++", "Shell", "Perl", "Lua", "Scala", "Kotlin", "Swift"}),
        "Ruby",
        _RUBY,
        None,
    ),
    (frozenset({"JavaScript"}), "TypeScript", _TS, _FLOW_MARK),
    # an ES module the model took for another language: TypeScript with TypeScript-only syntax, else JavaScript
    (_NOT_ES_MODULE, "TypeScript", AllOf(_ES_MODULE, _TS), _FLOW_MARK),
    (_NOT_ES_MODULE, "JavaScript", _ES_MODULE, None),
    (frozenset({"Kotlin"}), "Java", _JAVA, None),
    (_LANGUAGES - {"R"}, "R", _R, _MARKDOWN_FENCE),
    (frozenset({"YAML", "Ruby", "Shell", "Python", "C", "C++", "Java"}), "JavaScript", _JS, _TS),
    (frozenset({"PHP"}), "JavaScript", _JS, _PHP),
    (frozenset({"Scala"}), "Kotlin", _KOTLIN, None),
    (frozenset({"Kotlin"}), "Scala", _SCALA, _KOTLIN),
    (frozenset({"C++"}), "Scala", _SCALA_DECLARATION, _KOTLIN),
    (frozenset({"Groovy", "Java"}), "Scala", _SCALA_NOT_GROOVY_DECL, _KOTLIN),
    (frozenset({"Java"}), "Groovy", _GROOVY_IMPORT, AnyOf(_KOTLIN, *_SCALA_NOT_GROOVY_DECL.constructs)),
    (frozenset("Java JavaScript C# TypeScript Kotlin Scala Groovy C++ Swift".split()), "Dart", _DART, None),
    (frozenset({"CSS"}), "SCSS", _SCSS, None),
    (_LANGUAGES - {"Fortran"}, "Fortran", _FORTRAN, None),
    # Scala's `def f(a: A):` with the result type on the next line is no Python `def`: a Scala declaration vetoes
    (frozenset({"Scala", "Kotlin", "Swift", "Ruby"}), "Python", _PYTHON, _SCALA_DECLARATION),
    (frozenset({"Emacs Lisp"}), "Common Lisp", _COMMON_LISP, None),
    (frozenset({"Common Lisp"}), "Emacs Lisp", _ELISP, _COMMON_LISP),
    # "C++" with no C++-only construct is C (C with C++-ish style: gnulib, libuv); last, after the C++ -> X rules
    (frozenset({"C++"}), "C", None, _CPP_CONSTRUCT),
    # "TypeScript" with no TypeScript syntax at all is JavaScript (ES-module JavaScript: moment's locales)
    (frozenset({"TypeScript"}), "JavaScript", None, _TS_SYNTAX),
    # last: any construct above is more specific than "it parses as YAML"
    (_LANGUAGES - {"YAML"} | {"unknown"}, "YAML", YamlMapping(), None),
]
_CORRECTED_LANGUAGES = frozenset().union(*(p for p, *_ in _PAIR_CORRECTIONS))
# the corrections that still apply where the model is sure: on a dev split of package-held-out files they were the
# only ones that fired there (24 fixed, 2 broken); checking the others there cost ~35 us/file for no fix. Dart,
# Scala (over Groovy and Java) and SCSS on their own syntax: 7 more fixed on dev v4, none broken (YAML there broke 9:
# OCaml's `external f : t` lines parse as YAML keys)
_CORRECTIONS_WHEN_SURE = [
    r
    for r in _PAIR_CORRECTIONS
    if (r[1] in {"Objective-C", "C++", "TypeScript"} and r[2])
    or r[2] in (_DART, _SCSS, _SCALA_NOT_GROOVY_DECL)
]
_SURE_CORRECTED_LANGUAGES = frozenset().union(*(p for p, *_ in _CORRECTIONS_WHEN_SURE))


def lacks_markdown_syntax(text: str) -> bool:
    """No heading, list, fence, link, inline code, quote or table in the head the corrections scan."""
    return _MARKDOWN_SYNTAX.search(text, 0, _CORRECTION_SCAN_CHARS) is None


def correct_content_prediction(text: str, language: str, sure: bool = False) -> str:
    """The model's top language, corrected where the file has a construct decisive for the language the model
    confuses it with (C with `std::` is C++, "Haskell" with `local x =` is Lua). When the model is `sure`, only
    the corrections to Objective-C, C++ and TypeScript on such positive evidence apply."""
    if language not in (_SURE_CORRECTED_LANGUAGES if sure else _CORRECTED_LANGUAGES):
        return language
    for predicted, corrected, decisive, veto in _CORRECTIONS_WHEN_SURE if sure else _PAIR_CORRECTIONS:
        if (
            language in predicted
            and (decisive is None or decisive.search(text))
            and (veto is None or not veto.search(text))
        ):
            return corrected
    return language


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
