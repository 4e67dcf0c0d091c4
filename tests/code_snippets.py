"""Small, seeded, realistic-looking source files per language, for fast classifier tests (no network), and real
files shipped on this machine for tests on code the classifier has never seen."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

TEMPLATES: dict[str, tuple[str, str]] = {
    # language: (extension, template with {a} {b} {c} {n} placeholders)
    "C": (".c", '#include <stdio.h>\n#include <stdlib.h>\n\nstatic int {a}(int {b}, const char *{c})\n{{\n'
          '    if ({b} < {n}) {{\n        return -1;\n    }}\n    printf("%s %d\\n", {c}, {b});\n'
          '    return {b} * 2;\n}}\n\nint main(void)\n{{\n    int {c}_len = {a}({n}, "x");\n    '
          'struct {b}_s *p = malloc(sizeof(*p));\n    free(p);\n    return 0;\n}}\n'),
    "C++": (".cpp", '#include <vector>\n#include <string>\n\nnamespace {a} {{\n\ntemplate <typename T>\n'
            'class {b} {{\npublic:\n    explicit {b}(std::vector<T> {c}) : {c}_(std::move({c})) {{}}\n'
            '    auto size() const noexcept {{ return {c}_.size(); }}\nprivate:\n    std::vector<T> {c}_;\n}};\n\n'
            'std::string {c}_name() {{ return std::string("{a}") + std::to_string({n}); }}\n}}  // namespace {a}\n'),
    "Objective-C": (".mm", '#import <Foundation/Foundation.h>\n\n@interface {b} : NSObject\n'
                    '@property (nonatomic, strong) NSString *{c};\n- (instancetype)initWith{b}:(NSInteger){a};\n'
                    '@end\n\n@implementation {b}\n- (instancetype)initWith{b}:(NSInteger){a} {{\n'
                    '  if (self = [super init]) {{\n    _{c} = [NSString stringWithFormat:@"%ld", (long){a}];\n  }}\n'
                    '  return self;\n}}\n@end\n'),
    "MATLAB": (".m", "function [{a}, {b}] = {c}(x, n)\n% {c} computes something useful\n%   [{a}, {b}] = {c}(x, {n})\n"
               "  if nargin < 2\n    n = {n};\n  endif\n  {a} = zeros(n, 1);\n  for k = 1:n\n"
               "    {a}(k) = sum(x(1:k)) ./ k;\n  end\n  {b} = {a}' * 2;\nendfunction\n"),
    "Perl": (".pm", "package {b}::{c};\nuse strict;\nuse warnings;\n\nsub {a} {{\n    my ($self, %args) = @_;\n"
             "    my @{c} = grep {{ $_ > {n} }} @{{ $args{{items}} }};\n    return scalar @{c};\n}}\n\n"
             "sub new {{ my $class = shift; return bless {{ @_ }}, $class; }}\n\n1;\n"),
    "Prolog": (".pl", ":- module({a}, [{b}/2]).\n:- use_module(library(lists)).\n\n{b}([], 0).\n"
               "{b}([H|T], N) :-\n    {b}(T, N0),\n    N is N0 + H.\n\n{c}(X) :- member(X, [{n}, 2, 3]), X > 1.\n"),
    "Verilog": (".sv", "`timescale 1ns / 1ps\nmodule {a} #(parameter W = {n}) (\n  input wire clk,\n"
                "  input wire [W-1:0] {b},\n  output reg [W-1:0] {c}\n);\n  always @(posedge clk) begin\n"
                "    {c} <= {b} + 1'b1;\n  end\n  assign {a}_ok = |{c};\nendmodule\n"),
    "Coq": (".v", "Require Import Arith.\nRequire Import List.\n\nDefinition {a} (n : nat) : nat := n + {n}.\n\n"
            "Fixpoint {b} (l : list nat) : nat :=\n  match l with\n  | nil => 0\n  | x :: xs => x + {b} xs\n  end.\n\n"
            "Lemma {c}_plus : forall n, {a} n = n + {n}.\nProof.\n  intros n. unfold {a}. reflexivity.\nQed.\n"),
    "TypeScript": (".tsx", "import {{ {b} }} from './{a}';\n\nexport interface {b}Props {{\n  {c}: string;\n"
                   "  count?: number;\n}}\n\nexport function {a}(props: {b}Props): number {{\n"
                   "  const {c}: number[] = [];\n  for (let i = 0; i < {n}; i++) {{\n    {c}.push(i);\n  }}\n"
                   "  return props.count ?? {c}.length;\n}}\n\ntype {b}Map = Record<string, {b}Props>;\n"),
    "XML": (".xml", '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE TS>\n<TS version="2.1" language="de_DE">\n'
            "<context>\n    <name>{b}</name>\n    <message>\n        <source>{a} {c}</source>\n"
            "        <translation>{c} {a} {n}</translation>\n    </message>\n</context>\n</TS>\n"),
    "Lua": (".lua", "local {a} = {{}}\n\n-- {c}: returns the {b} of a table\nfunction {a}.{b}(t, n)\n"
            "  local {c} = 0\n  for i, v in ipairs(t) do\n    if v > {n} then\n      {c} = {c} + v\n    end\n"
            "  end\n  return {c}, #t\nend\n\nlocal ok, err = pcall(require, '{c}')\nreturn {a}\n"),
    "Python": (".py", "import os\nfrom typing import Any\n\n\nclass {b}:\n    \"\"\"{c} helper.\"\"\"\n\n"
               "    def __init__(self, {c}: int = {n}) -> None:\n        self.{c} = {c}\n\n"
               "    def {a}(self, items: list[Any]) -> int:\n        return sum(1 for x in items if x)\n\n\n"
               "if __name__ == '__main__':\n    print({b}().{a}(os.listdir('.')))\n"),
}  # fmt: skip

WORDS = ["alpha", "beta", "gamma", "delta", "count", "value", "index", "buffer", "parse", "render", "state",
         "node", "tree", "cache", "frame", "token", "stream", "queue", "score", "total"]  # fmt: skip


def snippet(language: str, rng: random.Random) -> str:
    ext, template = TEMPLATES[language]
    a, b, c = rng.sample(WORDS, 3)
    return template.format(a=a, b=b.capitalize(), c=c, n=rng.randint(1, 99))


def corpus(per_language: int, seed: int = 0, languages=None) -> list[tuple[str, str, str]]:
    """(language, path, text) triples."""
    rng = random.Random(seed)
    out = []
    for lang in languages or TEMPLATES:
        ext = TEMPLATES[lang][0]
        for i in range(per_language):
            out.append((lang, f"src/{lang.lower().replace(' ', '_')}_{i}{ext}", snippet(lang, rng)))
    return out


# --- real files shipped on this machine (the interpreter's stdlib and headers, the venv's pinned packages) ---

_PATHS = sysconfig.get_paths()
STDLIB, SITE, INCLUDE = Path(_PATHS["stdlib"]), Path(_PATHS["purelib"]), Path(_PATHS["include"])

# language -> (training sources, test sources): (root, glob) pairs; a language's train and test files come from
# different projects, and none of them from the templates above or from a manifest's packages
REAL_SOURCES: dict[str, tuple[list[tuple[Path, str]], list[tuple[Path, str]]]] = {
    "Python": (
        [(STDLIB, "email/*.py"), (STDLIB, "asyncio/*.py"), (STDLIB, "json/*.py"), (STDLIB, "http/*.py"),
         (STDLIB, "logging/*.py"), (STDLIB, "*.py")],
        [(SITE, "click/*.py"), (SITE, "yaml/*.py"), (SITE, "jinja2/*.py"), (SITE, "requests/*.py")],
    ),
    "C": (  # CPython's headers vs libxml2's and NumPy's
        [(INCLUDE, "*.h"), (INCLUDE, "cpython/*.h"), (INCLUDE, "internal/*.h")],
        [(SITE, "lxml/includes/libxml/*.h"), (SITE, "numpy/_core/include/numpy/**/*.h")],
    ),
    "C++": (  # PyTorch's c10 vs DeepSpeed's kernels and pybind11
        [(SITE, "torch/include/c10/**/*.h")],
        [(SITE, "deepspeed/ops/csrc/**/*.cpp"), (SITE, "pybind11/include/pybind11/**/*.h")],
    ),
    "CMake": ([(SITE, "torch/share/cmake/**/*.cmake")], [(SITE, "pybind11/share/cmake/**/*.cmake")]),
    "Markdown": (
        [(SITE, "mlflow/**/*.md")],
        [(SITE, "fastapi/**/*.md"), (SITE, "skops/**/*.md"), (SITE, "dagster/**/*.md"), (SITE, "sklearn/**/*.md"),
         (SITE, "huggingface_hub/**/*.md"), (SITE, "sentence_transformers/**/*.md")],
    ),
}  # fmt: skip


def real_files(
    split: str, per_language: int, seed: int = 0, max_chars: int = 20_000, min_chars: int = 200
) -> list[tuple[str, str, str]]:
    """(language, path, text) of up to `per_language` real files per language of `REAL_SOURCES` from its
    `split` ("train" or "test") sources, a seeded sample; each text cut to `max_chars`."""
    rng = random.Random(seed)
    out = []
    for lang, (train, test) in REAL_SOURCES.items():
        paths = sorted(
            {p for root, pattern in (train if split == "train" else test) for p in root.glob(pattern)}
        )
        texts = []
        for p in paths:
            text = p.read_text(errors="replace")[:max_chars]
            if len(text.strip()) >= min_chars:
                texts.append((lang, str(p), text))
        out += rng.sample(texts, min(per_language, len(texts)))
    return out
