"""The compiled parts: the code-language tokenizer's per-line loop (classifiers/_codetok.c) and the dedup
fingerprint's shingle hash + MinHash loop (pipelines/dedup/_minhash.c). Everything else is in pyproject.toml;
`pip install -e .` builds the extensions in place."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("classifiers._codetok", ["classifiers/_codetok.c"], extra_compile_args=["-O2"]),
        Extension("pipelines.dedup._minhash", ["pipelines/dedup/_minhash.c"], extra_compile_args=["-O3"]),
    ]
)
