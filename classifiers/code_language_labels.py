"""Labels for training and evaluating the code-language classifier: what a file is *called* (its name or an
unambiguous extension), optionally strong markers for an ambiguous extension, or the `#!` line of an
extension-less script.

This rule set is the labeller's own. Nothing here predicts, and nothing here is shared with the prediction
rules (`code_language_rules.py`: content markers, script headers, corrections): a rule tuned to raise the score
cannot move the labels it is scored against. Some constructs are read by both sides all the same (a `#!` line;
`@interface`, `std::`, `function y = f(`, an XML declaration): the files labelled by them are scored apart, and
the headline `accuracy/extension_only` counts only files whose label came from an unambiguous extension.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from classifiers.code_language_rules import AMBIGUOUS, EXTENSIONS, FILENAMES, extension_of, is_dockerfile_name

# where a label came from; only the first two never read the file's content
LABEL_SOURCES = ("extension", "filename", "shebang", "heuristic")
NAME_SOURCES = frozenset({"extension", "filename"})

# interpreters whose `#!` line labels an extension-less script
LABEL_INTERPRETERS: dict[str, str] = {
    "python": "Python", "python2": "Python", "python3": "Python", "pypy": "Python", "pypy3": "Python",
    "perl": "Perl", "perl5": "Perl", "ruby": "Ruby", "jruby": "Ruby",
    "sh": "Shell", "bash": "Shell", "dash": "Shell", "ksh": "Shell", "zsh": "Shell", "ash": "Shell",
    "lua": "Lua", "luajit": "Lua", "texlua": "Lua", "node": "JavaScript", "nodejs": "JavaScript",
    "deno": "TypeScript", "ts-node": "TypeScript", "php": "PHP", "tclsh": "Tcl", "wish": "Tcl", "expect": "Tcl",
    "rscript": "R", "escript": "Erlang", "runhaskell": "Haskell", "runghc": "Haskell", "swift": "Swift",
    "scala": "Scala", "kotlin": "Kotlin", "emacs": "Emacs Lisp", "swipl": "Prolog", "guile": "Scheme",
    "racket": "Racket", "sbcl": "Common Lisp", "julia": "Julia", "elixir": "Elixir", "groovy": "Groovy",
    "make": "Makefile", "octave": "MATLAB",
}  # fmt: skip
_LABEL_SHEBANG = re.compile(r"#![ \t]*(\S+)[ \t]*([^\n]*)")
# a shell script that hands itself to another interpreter (`exec tclsh "$0"`): its language is not the shebang's
_LABEL_REEXEC = re.compile(r"^[ \t]*exec[ \t]+\S+[ \t].*\$0", re.M)

# markers for ambiguous extensions (Linguist's heuristics, as strict as labels need)
_L_OBJC = re.compile(
    r"^\s*(@interface|@implementation|@protocol|@end\b|@property|#import\s)|\bNS[A-Z]\w+\s*\*", re.M
)
_L_CPP = re.compile(
    r"^\s*(template\s*<|namespace\s+\w*\s*\{|class\s+\w+[^;]*\{|using\s+namespace\b|public:|private:|protected:)"
    r"|\bstd::|#include\s*<(iostream|string|vector|memory|map|algorithm|utility|type_traits|cstddef|cstdint)>"
    r"|\b(constexpr|nullptr|static_cast|dynamic_cast|reinterpret_cast|noexcept)\b",
    re.M,
)
_L_MATLAB = re.compile(
    r"^\s*(function\s+(\[[^\]]*\]\s*=\s*)?\w+|%\s|%%|end(function)?\s*$|endif|endfor)", re.M
)
_L_PROLOG = re.compile(r"^\s*:-\s*\w+|^[a-z]\w*(\([^)]*\))?\s*:-\s*$|^[a-z]\w*\(.*\)\s*:-", re.M)
_L_PERL = re.compile(
    r"\buse\s+(strict|warnings|vars|lib)\b|^\s*my\s*[$@%(]|\bsub\s+\w+\s*\{|^\s*package\s+\w+(::\w+)*;|^#!.*perl",
    re.M,
)
_L_COQ = re.compile(
    r"^\s*(Theorem|Lemma|Proof\.|Qed\.|Require\s+(Import|Export)|Definition|Inductive|Fixpoint|Module\s+\w+\s*:?)\b",
    re.M,
)
_L_VERILOG = re.compile(
    r"^\s*(module\s+\w+\s*[#(;]|endmodule\b|always\s*@|assign\s+\w+|input\s+(wire|reg|\[)|output\s+(wire|reg|\[)|`timescale)",
    re.M,
)
_L_QT_TS = re.compile(r"\A\s*(<\?xml[^>]*>\s*)?(<!DOCTYPE\s+TS>|<TS\b)", re.S)
_L_XML_DECLARATION = re.compile(r"\A\s*<\?xml\b")


def label_from_shebang(text: str) -> str | None:
    """The language of the interpreter an extension-less script's `#!` line names (through `env`), or None:
    an unknown interpreter, or a shell script that re-executes itself (`exec X ... $0`) in its first five lines."""
    m = _LABEL_SHEBANG.match(text, 0, 200)
    if m is None:
        return None
    prog, args = PurePosixPath(m.group(1)).name, m.group(2).split()
    if prog == "env":
        args = [a for a in args if not a.startswith("-") and "=" not in a]
        prog = PurePosixPath(args[0]).name if args else ""
    prog = prog.lower()
    lang = LABEL_INTERPRETERS.get(prog) or LABEL_INTERPRETERS.get(re.sub(r"[\d.]+$", "", prog))
    if lang == "Shell" and _LABEL_REEXEC.search("\n".join(text[:1000].split("\n", 5)[:5])):  # its first lines
        return None
    return lang


def label_ambiguous_extension(ext: str, text: str) -> str | None:
    """The language of a file with an ambiguous extension (`.h .m .pl .v .ts`) when a strong marker says it,
    else None (a plain C header is not guessed)."""
    head = text[:20000]
    if ext == ".h":
        return "Objective-C" if _L_OBJC.search(head) else "C++" if _L_CPP.search(head) else None
    if ext == ".m":
        return "Objective-C" if _L_OBJC.search(head) else "MATLAB" if _L_MATLAB.search(head) else None
    if ext == ".pl":
        perl, prolog = bool(_L_PERL.search(head)), bool(_L_PROLOG.search(head))
        return "Perl" if perl and not prolog else "Prolog" if prolog and not perl else None
    if ext == ".v":
        coq, verilog = bool(_L_COQ.search(head)), bool(_L_VERILOG.search(head))
        return "Coq" if coq and not verilog else "Verilog" if verilog and not coq else None
    if ext == ".ts":  # Qt Linguist translations share `.ts` with TypeScript
        return "XML" if _L_QT_TS.search(head) or _L_XML_DECLARATION.search(head) else "TypeScript"
    return None


def training_label(
    path: str, text: str, use_heuristics: bool = True, use_shebang: bool = True
) -> tuple[str | None, str]:
    """The label a file gets for training and evaluation, and its source (`LABEL_SOURCES`; `ambiguous` or
    `none` when unlabelled): its name or an unambiguous extension; optionally a strong marker for an ambiguous
    extension, or the shebang of an extension-less script."""
    name = PurePosixPath(path).name.lower()
    if name in FILENAMES:
        return FILENAMES[name], "filename"
    if is_dockerfile_name(name):
        return "Dockerfile", "filename"
    ext = extension_of(path)
    if ext in EXTENSIONS:
        return EXTENSIONS[ext], "extension"
    if ext in AMBIGUOUS:
        return (label_ambiguous_extension(ext, text), "heuristic") if use_heuristics else (None, "ambiguous")
    if use_shebang and not ext and (lang := label_from_shebang(text)):
        return lang, "shebang"
    return None, "none"
