"""The one compiled part: the code-language tokenizer's per-line loop (classifiers/_codetok.c). Everything else
is in pyproject.toml; `pip install -e .` builds the extension in place."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("classifiers._codetok", ["classifiers/_codetok.c"], extra_compile_args=["-O2"])])
