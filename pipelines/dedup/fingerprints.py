"""The shared core of both engines: normalise -> tokenise -> shingle -> MinHash -> LSH bands.

The datatrove engine and the Spark engine call exactly these functions (Spark inside `mapPartitions`), so
the same text always gets the same tokens, shingles, signature and band keys, whatever runs it.

- Tokens (web default, `tokenizer="datatrove"`): datatrove's `simplify_text` rules (lowercase, numbers -> 0,
  its punctuation set -> space, combining accents dropped) and a whitespace split, in place of datatrove's
  spaCy word tokeniser (same words on simplified text, ~20x faster). Code (`"words"`): `\\w+` runs, case kept.
- Shingles: every window of `ngram_size` tokens, hashed as the string `" ".join(window)` with 64-bit xxh64
  (or sha1): datatrove's definition. `shingle_hash="xxh3_tokens"` instead hashes each token once and
  combines the window in numpy (faster, different values).
- MinHash: `num_bands * rows_per_band` universal hashes h_i(x) = (a_i * x + b_i) mod p, p = 2^61 - 1, with
  (a_i, b_i) drawn from `numpy.random.RandomState(seed)` exactly as datatrove draws them: the product wraps
  mod 2^64 as in datatrove/datasketch, and the reduction mod p is the Mersenne shift-add (no division; it
  can leave p <= value < p + 8, which happens with probability ~2^-58 per value). So with the same seed and
  tokens our signature equals datatrove's `MinhashDedupSignature` signature (a test checks it).
- Speed: for `shingle_hash="xxh64"` the window hashing and the MinHash loop run in C (`_minhash.c`: one call
  per document, no per-shingle Python objects, AVX2 where the CPU has it); `_shingle_hashes_py` /
  `_signature_py` are its numpy reference (tests compare them) and serve where the extension was not built.
  With the datatrove tokeniser the normalisation and split run in C too (`_minhash.simplify`, one pass over
  the text with a per-character table built here from datatrove's own sets), giving the tokens joined by
  spaces; `tokens()` is its reference, and the rare text it cannot take (a character outside the BMP, or one
  whose NFD decomposition involves digits, punctuation or spaces) goes through `tokens()`. Same tokens either
  way (tests compare them on fuzzed Unicode).
- Bands: each band of `rows_per_band` values is folded into one signed 64-bit key (Spark has no unsigned).
- Signatures are kept as the low 32 bits of each value: enough to estimate Jaccard as the fraction of
  equal values when verifying candidate pairs.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from itertools import accumulate
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import regex
import xxhash
from datatrove.utils.text import NUMBERS_PATTERN, PUNCTUATION_TRANS

from pipelines.dedup.config import DedupConfig

try:  # the C loop (pipelines/dedup/_minhash.c, built by `pip install -e .`); the numpy reference otherwise
    from pipelines.dedup import _minhash
except ImportError:  # pragma: no cover - exercised where the extension was not built
    _minhash = None

MERSENNE_61 = np.uint64((1 << 61) - 1)
_SHIFT_61 = np.uint64(61)
_ROW_CHUNK = 4096  # shingles per matrix block: bounds memory at 4096 x num_perm x 8 bytes
_WORDS = re.compile(r"\w+")
_DIGITS = re.compile(r"\d+")
_NONSPACING_MARKS = regex.compile(r"\p{Mn}+")  # what datatrove drops after NFD, one char at a time
# datatrove's PUNCTUATION_TRANS maps every key to " ": one character class substitution does the same ~3x
# faster than str.translate's per-character dict look-ups, and ASCII text goes through bytes.translate.
_PUNCT_TO_SPACE = dict(PUNCTUATION_TRANS)
if not all(v in (32, " ") for v in _PUNCT_TO_SPACE.values()):  # pragma: no cover - a datatrove change
    raise ImportError("datatrove's PUNCTUATION_TRANS no longer maps punctuation to spaces only")
_PUNCTUATION = re.compile("[" + "".join(re.escape(chr(k)) for k in sorted(_PUNCT_TO_SPACE)) + "]")
_ASCII_PUNCT = bytes.maketrans(
    bytes(k for k in sorted(_PUNCT_TO_SPACE) if k < 128), b" " * sum(1 for k in _PUNCT_TO_SPACE if k < 128)
)
_CH_DIGIT, _CH_SEP, _CH_BREAK, _CH_MARK = 1, 2, 4, 8  # _minhash.c's CH_* flags
_SIMPLIFY_DIGITS, _SIMPLIFY_MARKS = 1, 2
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_LOW32 = np.uint64(0xFFFFFFFF)


def fmix64(x: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser (a bijection that mixes every input bit into every output bit), in place."""
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


@functools.cache
def _simplify_table() -> tuple[bytes, re.Pattern]:
    """Per-BMP-character flags for `_minhash.simplify`, from datatrove's NUMBERS_PATTERN and punctuation set
    and `str.isspace` (what `str.split` splits on); and a pattern of the characters whose NFD decomposition
    would let the C pass (which sees the text after NFD) disagree with `tokens()` (which applies the digit
    and punctuation rules before NFD), plus everything outside the BMP."""
    bmp = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)  # no lone surrogates
    table = bytearray(0x10000)
    # one regex pass each: digits are the single characters NUMBERS_PATTERN matches; separators the x in
    # "1x1" it matches whole (\x00 between candidates is neither)
    for m in NUMBERS_PATTERN.finditer("\x00".join(bmp)):
        table[ord(m.group())] |= _CH_DIGIT
    for m in NUMBERS_PATTERN.finditer("\x00".join(f"1{ch}1" for ch in bmp)):
        if len(m.group()) == 3 and not table[ord(m.group()[1])] & _CH_DIGIT:
            table[ord(m.group()[1])] |= _CH_SEP
    for ch in bmp:
        if ch.isspace():
            table[ord(ch)] |= _CH_BREAK
    for c in _PUNCT_TO_SPACE:
        if c < 0x10000:
            table[c] |= _CH_BREAK
    for m in _NONSPACING_MARKS.finditer(bmp):
        for ch in m.group():
            table[ord(ch)] |= _CH_MARK
    ruled = _CH_DIGIT | _CH_SEP | _CH_BREAK
    unsafe = [
        ch
        for ch in bmp
        if not unicodedata.is_normalized("NFD", ch)
        and any(ord(d) > 0xFFFF or table[ord(d)] & ruled for d in ch + unicodedata.normalize("NFD", ch))
    ]
    pattern = re.compile("[" + "".join(re.escape(ch) for ch in unsafe) + "\U00010000-\U0010ffff]")
    return bytes(table), pattern


def _sha1_64(token: str) -> int:
    return int.from_bytes(hashlib.sha1(token.encode()).digest()[:8], "little")


def to_int64(value: int) -> int:
    """An unsigned 64-bit hash as the signed value Spark and parquet store."""
    return value - (1 << 64) if value >= (1 << 63) else value


@dataclass(frozen=True)
class Fingerprint:
    """What dedup needs to know about one document (its text is not kept)."""

    tokens: int
    content_hash: int  # signed 64-bit
    url_hash: int | None  # signed 64-bit, None without a URL or with URL dedup off
    bands: np.ndarray  # (num_bands,) int64
    sig: bytes  # num_perm little-endian uint32: low 32 bits of each MinHash value


@dataclass
class MinHasher:
    """Seeded shingling + MinHash + banding for one config. Cheap to build; picklable for Spark/datatrove."""

    config: DedupConfig
    _a: np.ndarray = field(init=False, repr=False)
    _b: np.ndarray = field(init=False, repr=False)
    _pos: np.ndarray = field(init=False, repr=False)
    _rows: np.ndarray = field(init=False, repr=False)
    _band_salt: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cfg = self.config
        gen = np.random.RandomState(cfg.seed)
        # Same draw as datatrove's MinhashDedupSignature.parameters for the same seed and num_perm.
        self._a = gen.randint(1, MERSENNE_61, dtype=np.uint64, size=cfg.num_perm)
        self._b = gen.randint(0, MERSENNE_61, dtype=np.uint64, size=cfg.num_perm)
        odd = np.uint64(1)
        self._pos = gen.randint(1, 1 << 62, dtype=np.uint64, size=cfg.ngram_size) | odd
        self._rows = gen.randint(1, 1 << 62, dtype=np.uint64, size=cfg.rows_per_band) | odd
        self._band_salt = gen.randint(1, 1 << 62, dtype=np.uint64, size=cfg.num_bands)
        self._hash = {"xxh64": xxhash.xxh64_intdigest, "sha1": _sha1_64}.get(
            cfg.shingle_hash, xxhash.xxh3_64_intdigest
        )

    def __getstate__(self) -> dict:
        return {"config": self.config}

    def __setstate__(self, state: dict) -> None:
        self.config = state["config"]
        self.__post_init__()

    # -- text -> tokens ---------------------------------------------------------------------------------------
    def tokens(self, text: str) -> list[str]:
        """Normalised word tokens (see the module docstring)."""
        cfg = self.config
        if cfg.lowercase:
            text = text.lower()
        if cfg.tokenizer == "datatrove":
            if cfg.normalize_digits:
                text = NUMBERS_PATTERN.sub("0", text)
            if text.isascii():
                return text.encode("ascii").translate(_ASCII_PUNCT).decode("ascii").split()
            text = _PUNCTUATION.sub(" ", text)
            if cfg.strip_accents and not text.isascii():
                text = _NONSPACING_MARKS.sub("", unicodedata.normalize("NFD", text))
            return text.split()
        if cfg.strip_accents and not text.isascii():
            text = _NONSPACING_MARKS.sub("", unicodedata.normalize("NFD", text))
        tokens = _WORDS.findall(text)
        if cfg.normalize_digits:  # per token: isalpha() is far cheaper than a regex pass over the text
            tokens = [t if t.isalpha() else _DIGITS.sub("0", t) for t in tokens]
        return tokens

    def simplified(self, text: str) -> tuple[bytes, int] | None:
        """`" ".join(self.tokens(text))` as UTF-8 and the token count, from the C pass; None where only
        `tokens()` applies (see the module docstring)."""
        cfg = self.config
        if cfg.tokenizer != "datatrove" or _minhash is None:
            return None
        if cfg.lowercase:
            text = text.lower()
        table, unsafe = _simplify_table()
        if cfg.strip_accents and not text.isascii() and not unicodedata.is_normalized("NFD", text):
            if unsafe.search(text):
                return None
            text = unicodedata.normalize("NFD", text)
        flags = (_SIMPLIFY_DIGITS if cfg.normalize_digits else 0) | (
            _SIMPLIFY_MARKS if cfg.strip_accents else 0
        )
        return _minhash.simplify(text, table, flags)

    # -- tokens -> shingle hashes -> signature -> bands ---------------------------------------------------------
    def shingle_hashes(self, tokens: list[str]) -> np.ndarray:
        """uint64 hash of every `ngram_size`-token window (one window if the text is shorter)."""
        if self.config.shingle_hash == "xxh3_tokens":
            return self._combined_token_hashes(tokens)
        if self.config.shingle_hash == "xxh64" and _minhash is not None:
            return np.frombuffer(_minhash.shingle_hashes(tokens, self.config.ngram_size), dtype=np.uint64)
        return self._shingle_hashes_py(tokens)

    def _shingle_hashes_py(self, tokens: list[str]) -> np.ndarray:
        """The reference of `_minhash.shingle_hashes` (and the sha1 path)."""
        n = self.config.ngram_size
        if len(tokens) <= n:
            return np.array([self._hash(" ".join(tokens))], dtype=np.uint64)
        # window i is joined[start_i : end_{i+n-1}]: slicing one joined string beats joining every window
        joined = " ".join(tokens)
        ends = list(accumulate(len(t) + 1 for t in tokens))
        count = len(tokens) - n + 1
        starts = [0, *ends[: count - 1]]
        stops = [e - 1 for e in ends[n - 1 :]]
        windows = map(joined.__getitem__, map(slice, starts, stops))
        return np.fromiter(map(self._hash, windows), dtype=np.uint64, count=count)

    def _combined_token_hashes(self, tokens: list[str]) -> np.ndarray:
        n = self.config.ngram_size
        th = np.fromiter(map(self._hash, tokens), dtype=np.uint64, count=len(tokens))
        if len(th) == 0:
            th = np.zeros(1, dtype=np.uint64)
        width = min(n, len(th))
        count = len(th) - width + 1
        out = th[:count] * self._pos[0]
        for k in range(1, width):
            out += th[k : k + count] * self._pos[k]
        return fmix64(out)

    def signature(self, shingles: np.ndarray) -> np.ndarray:
        """(num_perm,) uint64 MinHash values: min over shingles of (a*x + b) mod (2^61 - 1)."""
        if _minhash is not None:
            shingles = np.ascontiguousarray(shingles, dtype=np.uint64)
            return np.frombuffer(_minhash.minhash(shingles, self._a, self._b), dtype=np.uint64)
        return self._signature_py(shingles)

    def token_signature(self, tokens: list[str]) -> np.ndarray:
        """`signature(shingle_hashes(tokens))`, in one C call where the shingle hash allows it."""
        if self.config.shingle_hash == "xxh64" and _minhash is not None:
            sig = _minhash.minhash_tokens(tokens, self.config.ngram_size, self._a, self._b)
            return np.frombuffer(sig, dtype=np.uint64)
        return self.signature(self.shingle_hashes(tokens))

    def _signature_py(self, shingles: np.ndarray) -> np.ndarray:
        """The numpy reference of `_minhash.minhash`."""
        sig = None
        for start in range(0, len(shingles), _ROW_CHUNK):
            y = np.multiply.outer(shingles[start : start + _ROW_CHUNK], self._a)
            y += self._b
            r = y & MERSENNE_61
            y >>= _SHIFT_61
            r += y  # x mod (2^61-1) == (x & p) + (x >> 61), up to one final subtraction we do not need
            block = r.min(axis=0)
            sig = block if sig is None else np.minimum(sig, block)
        return sig

    def band_keys(self, sig: np.ndarray) -> np.ndarray:
        """(num_bands,) int64: each band's rows folded with seeded odd multipliers, then fmix64."""
        cfg = self.config
        rows = sig.reshape(cfg.num_bands, cfg.rows_per_band) * self._rows
        keys = rows.sum(axis=1, dtype=np.uint64) + self._band_salt
        return fmix64(keys).view(np.int64)

    # -- one document ---------------------------------------------------------------------------------------------
    def content_hash(self, text: str, tokens: list[str]) -> int:
        how = self.config.exact_match_on
        key = " ".join(tokens) if how == "words" else " ".join(text.split()) if how == "whitespace" else text
        return to_int64(xxhash.xxh3_64_intdigest(key))

    def url_hash(self, url: str | None) -> int | None:
        if not self.config.url_dedup or not url:
            return None
        return to_int64(xxhash.xxh3_64_intdigest(normalise_url(url)))

    def fingerprint(self, text: str, url: str | None = None) -> Fingerprint:
        cfg = self.config
        fast = self.simplified(text) if cfg.shingle_hash == "xxh64" else None
        if fast is not None:
            joined, count = fast
            sig = np.frombuffer(_minhash.minhash_joined(joined, cfg.ngram_size, self._a, self._b), np.uint64)
            content_hash = (
                to_int64(xxhash.xxh3_64_intdigest(joined))
                if cfg.exact_match_on == "words"
                else self.content_hash(text, [])
            )
        else:
            tokens = self.tokens(text)
            sig, count = self.token_signature(tokens), len(tokens)
            content_hash = self.content_hash(text, tokens)
        if _minhash is not None:
            bands, low32 = _minhash.finish(sig, self._rows, self._band_salt)
            bands = np.frombuffer(bands, dtype=np.int64)
        else:
            bands, low32 = self.band_keys(sig), (sig & _LOW32).astype("<u4").tobytes()
        return Fingerprint(
            tokens=count, content_hash=content_hash, url_hash=self.url_hash(url), bands=bands, sig=low32
        )


def normalise_url(url: str) -> str:
    """Lowercase scheme and host, drop the fragment and default ports, '' path -> '/'."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return url.strip()
    host = (parts.hostname or "").lower()
    port = parts.port if parts.port not in (None, 80, 443) else None
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", parts.query, ""))


def estimated_jaccard(sigs_a: np.ndarray, sigs_b: np.ndarray) -> np.ndarray:
    """Row-wise fraction of equal MinHash values of two (n, num_perm) uint32 matrices (float64)."""
    if len(sigs_a) == 0:
        return np.zeros(0, dtype=np.float64)
    return (sigs_a == sigs_b).sum(axis=1).astype(np.float64) / sigs_a.shape[1]


def passes_verification(est: np.ndarray, threshold: float) -> np.ndarray:
    """The one comparison both engines use, so float rounding cannot make them disagree."""
    return est >= threshold if threshold > 0 else np.ones(len(est), dtype=bool)
