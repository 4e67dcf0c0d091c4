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
  per document, no per-shingle Python objects); `_shingle_hashes_py` / `_signature_py` are its numpy reference
  (tests compare them) and serve where the extension was not built. Same values either way.
- Bands: each band of `rows_per_band` values is folded into one signed 64-bit key (Spark has no unsigned).
- Signatures are kept as the low 32 bits of each value: enough to estimate Jaccard as the fraction of
  equal values when verifying candidate pairs.
"""

from __future__ import annotations

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
        tokens = self.tokens(text)
        sig = self.token_signature(tokens)
        return Fingerprint(
            tokens=len(tokens),
            content_hash=self.content_hash(text, tokens),
            url_hash=self.url_hash(url),
            bands=self.band_keys(sig),
            sig=(sig & _LOW32).astype("<u4").tobytes(),
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


def sig_matrix(sigs: list[bytes]) -> np.ndarray:
    """Stack signatures (bytes of uint32) into an (n, num_perm) uint32 matrix."""
    if not sigs:
        return np.zeros((0, 0), dtype=np.uint32)
    return np.frombuffer(b"".join(sigs), dtype="<u4").reshape(len(sigs), -1)


def estimated_jaccard(sigs_a: np.ndarray, sigs_b: np.ndarray) -> np.ndarray:
    """Row-wise fraction of equal MinHash values of two (n, num_perm) uint32 matrices (float64)."""
    if len(sigs_a) == 0:
        return np.zeros(0, dtype=np.float64)
    return (sigs_a == sigs_b).sum(axis=1).astype(np.float64) / sigs_a.shape[1]


def passes_verification(est: np.ndarray, threshold: float) -> np.ndarray:
    """The one comparison both engines use, so float rounding cannot make them disagree."""
    return est >= threshold if threshold > 0 else np.ones(len(est), dtype=bool)
