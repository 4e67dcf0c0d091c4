/* The dedup fingerprint's hot loop in C: datatrove's text normalisation and whitespace split, word n-gram
 * shingles hashed with xxh64, MinHash over the seeded universal hashes, LSH band keys. Each function has a
 * Python/numpy reference in pipelines/dedup/fingerprints.py that the tests compare it with and that serves
 * where this module was not built:
 *   shingle_hashes(tokens, n) -> bytes: uint64 xxh64 (seed 0) of the UTF-8 of " ".join(window) for every
 *       window of n tokens (one window, the whole " ".join(tokens), when there are <= n tokens): the same
 *       values as xxhash.xxh64_intdigest on each window string, i.e. datatrove's shingle hash
 *       (reference MinHasher._shingle_hashes_py);
 *   minhash(hashes, a, b) -> bytes: uint64 min over the hashes x of ((a_i * x + b_i) mod 2^64), reduced
 *       mod 2^61 - 1 by one Mersenne shift-add (MinHasher._signature_py's arithmetic; AVX2 where available);
 *   minhash_tokens(tokens, n, a, b) -> bytes: both, without the intermediate Python object;
 *   simplify(text, table, flags) -> (joined, ntokens) | None: MinHasher.tokens() for the datatrove tokeniser,
 *       as the UTF-8 of the tokens joined by single spaces;
 *   minhash_joined(joined, n, a, b) -> bytes: minhash_tokens over those joined tokens;
 *   finish(sig, rows, salt) -> (bands, low32): MinHasher.band_keys and the signature's low 32 bits. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const uint64_t P1 = 11400714785074694791ULL, P2 = 14029467366897019727ULL, P3 = 1609587929392839161ULL,
                      P4 = 9650029242287828579ULL, P5 = 2870177450012600261ULL;
static const uint64_t MERSENNE_61 = (1ULL << 61) - 1;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t read64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t read32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t xround(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}
static inline uint64_t xmerge(uint64_t acc, uint64_t val) {
    acc ^= xround(0, val);
    return acc * P1 + P4;
}

/* XXH64 with seed 0 (little-endian reads: x86-64 and aarch64 as built here). */
static uint64_t xxh64(const unsigned char *p, size_t len) {
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const unsigned char *limit = end - 32;
        uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = (uint64_t)0 - P1;
        do {
            v1 = xround(v1, read64(p));
            v2 = xround(v2, read64(p + 8));
            v3 = xround(v3, read64(p + 16));
            v4 = xround(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xmerge(h, v1);
        h = xmerge(h, v2);
        h = xmerge(h, v3);
        h = xmerge(h, v4);
    } else {
        h = P5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= xround(0, read64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* xxh64 of every n-token window of `joined` (tokens separated by single spaces, `len` bytes without a trailing
 * space; token t starts at starts[t], starts[ntok] = len + 1): ntok - n + 1 values, or one hash of the whole
 * text when ntok <= n. */
static inline Py_ssize_t window_count(Py_ssize_t ntok, Py_ssize_t n) { return ntok > n ? ntok - n + 1 : 1; }
static void hash_windows(const unsigned char *joined, size_t len, const Py_ssize_t *starts, Py_ssize_t ntok,
                         Py_ssize_t n, uint64_t *out) {
    if (ntok <= n) {
        out[0] = xxh64(joined, len);
        return;
    }
    for (Py_ssize_t i = 0; i < ntok - n + 1; i++)
        out[i] = xxh64(joined + starts[i], (size_t)(starts[i + n] - 1 - starts[i]));
}

/* Window hashes of a token list into a new malloc'd array (*count set); NULL with an exception on error. */
static uint64_t *window_hashes(PyObject *tokens, Py_ssize_t n, Py_ssize_t *count) {
    PyObject *seq = PySequence_Fast(tokens, "tokens must be a sequence of str");
    if (!seq) return NULL;
    Py_ssize_t ntok = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    const char **data = NULL;
    Py_ssize_t *lens = NULL, *starts = NULL;
    unsigned char *joined = NULL;
    uint64_t *out = NULL;
    size_t total = 0;
    if (ntok > 0) {
        data = PyMem_Malloc(sizeof(char *) * ntok);
        lens = PyMem_Malloc(sizeof(Py_ssize_t) * ntok);
        starts = PyMem_Malloc(sizeof(Py_ssize_t) * (ntok + 1));
        if (!data || !lens || !starts) { PyErr_NoMemory(); goto fail; }
    }
    for (Py_ssize_t i = 0; i < ntok; i++) {
        if (!PyUnicode_Check(items[i])) { PyErr_SetString(PyExc_TypeError, "tokens must be str"); goto fail; }
        data[i] = PyUnicode_AsUTF8AndSize(items[i], &lens[i]);
        if (!data[i]) goto fail;
        total += (size_t)lens[i] + 1;
    }
    joined = PyMem_Malloc(total ? total : 1);
    if (!joined) { PyErr_NoMemory(); goto fail; }
    {
        size_t pos = 0;
        for (Py_ssize_t i = 0; i < ntok; i++) {
            starts[i] = (Py_ssize_t)pos;
            memcpy(joined + pos, data[i], lens[i]);
            pos += lens[i];
            joined[pos++] = ' ';
        }
        if (ntok > 0) starts[ntok] = (Py_ssize_t)pos; /* one past the trailing space */
    }
    *count = window_count(ntok, n);
    out = PyMem_Malloc(sizeof(uint64_t) * *count);
    if (!out) { PyErr_NoMemory(); goto fail; }
    hash_windows(joined, ntok ? total - 1 : 0, starts, ntok, n, out);
    PyMem_Free(data); PyMem_Free(lens); PyMem_Free(starts); PyMem_Free(joined);
    Py_DECREF(seq);
    return out;
fail:
    PyMem_Free(data); PyMem_Free(lens); PyMem_Free(starts); PyMem_Free(joined);
    Py_DECREF(seq);
    return NULL;
}

/* r = (a*x + b mod 2^64) reduced by one Mersenne shift-add is < 2^61 + 8 < 2^63, so signed 64-bit compares
 * order it correctly: AVX2 has a signed 64-bit compare but no unsigned one and no 64-bit multiply (built from
 * three 32x32 multiplies below). Same values as the scalar loop; chosen at run time by the CPU's features. */
static void minhash_scalar(const uint64_t *x, Py_ssize_t nx, const uint64_t *a, const uint64_t *b, Py_ssize_t k,
                           uint64_t *sig) {
    for (Py_ssize_t i = 0; i < k; i++) sig[i] = UINT64_MAX;
    for (Py_ssize_t j = 0; j < nx; j++) {
        const uint64_t v = x[j];
        for (Py_ssize_t i = 0; i < k; i++) {
            uint64_t y = a[i] * v + b[i];
            uint64_t r = (y & MERSENNE_61) + (y >> 61);
            sig[i] = r < sig[i] ? r : sig[i];
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
__attribute__((target("avx2"))) static void minhash_avx2(const uint64_t *x, Py_ssize_t nx, const uint64_t *a,
                                                          const uint64_t *b, Py_ssize_t k, uint64_t *sig) {
    Py_ssize_t k4 = k & ~(Py_ssize_t)3;
    const __m256i p61 = _mm256_set1_epi64x((long long)MERSENNE_61);
    for (Py_ssize_t i0 = 0; i0 < k4; i0 += 4) {
        const __m256i va = _mm256_loadu_si256((const __m256i *)(a + i0));
        const __m256i va_hi = _mm256_srli_epi64(va, 32);
        const __m256i vb = _mm256_loadu_si256((const __m256i *)(b + i0));
        __m256i best = _mm256_set1_epi64x(INT64_MAX);
        for (Py_ssize_t j = 0; j < nx; j++) {
            const __m256i v = _mm256_set1_epi64x((long long)x[j]);
            const __m256i v_hi = _mm256_srli_epi64(v, 32);
            /* a*v mod 2^64 = lo(a)lo(v) + ((hi(a)lo(v) + lo(a)hi(v)) << 32) */
            __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(va_hi, v), _mm256_mul_epu32(va, v_hi));
            __m256i y = _mm256_add_epi64(_mm256_mul_epu32(va, v), _mm256_slli_epi64(cross, 32));
            y = _mm256_add_epi64(y, vb);
            __m256i r = _mm256_add_epi64(_mm256_and_si256(y, p61), _mm256_srli_epi64(y, 61));
            best = _mm256_blendv_epi8(best, r, _mm256_cmpgt_epi64(best, r));
        }
        _mm256_storeu_si256((__m256i *)(sig + i0), best);
    }
    if (k4 < k) minhash_scalar(x, nx, a + k4, b + k4, k - k4, sig + k4);
    if (nx == 0)
        for (Py_ssize_t i = 0; i < k; i++) sig[i] = UINT64_MAX;
}
#endif

static void minhash_into(const uint64_t *x, Py_ssize_t nx, const uint64_t *a, const uint64_t *b, Py_ssize_t k,
                         uint64_t *sig) {
#ifdef HAVE_AVX2_PATH
    if (__builtin_cpu_supports("avx2")) {
        minhash_avx2(x, nx, a, b, k, sig);
        return;
    }
#endif
    minhash_scalar(x, nx, a, b, k, sig);
}

static int get_u64(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len % 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: length is not a multiple of 8 bytes", what);
        return -1;
    }
    return 0;
}

static PyObject *py_shingle_hashes(PyObject *self, PyObject *args) {
    PyObject *tokens;
    Py_ssize_t n, count = 0;
    if (!PyArg_ParseTuple(args, "On", &tokens, &n)) return NULL;
    if (n < 1) { PyErr_SetString(PyExc_ValueError, "n must be >= 1"); return NULL; }
    uint64_t *h = window_hashes(tokens, n, &count);
    if (!h) return NULL;
    PyObject *res = PyBytes_FromStringAndSize((const char *)h, count * 8);
    PyMem_Free(h);
    return res;
}

static PyObject *sig_bytes(const uint64_t *x, Py_ssize_t nx, PyObject *ao, PyObject *bo) {
    Py_buffer a, b;
    if (get_u64(ao, &a, "a") < 0) return NULL;
    if (get_u64(bo, &b, "b") < 0) { PyBuffer_Release(&a); return NULL; }
    PyObject *res = NULL;
    if (a.len != b.len) {
        PyErr_SetString(PyExc_ValueError, "a and b differ in length");
    } else {
        res = PyBytes_FromStringAndSize(NULL, a.len);
        if (res) {
            uint64_t *sig = (uint64_t *)PyBytes_AS_STRING(res);
            Py_BEGIN_ALLOW_THREADS
            minhash_into(x, nx, (const uint64_t *)a.buf, (const uint64_t *)b.buf, a.len / 8, sig);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return res;
}

static PyObject *py_minhash(PyObject *self, PyObject *args) {
    PyObject *xo, *ao, *bo;
    if (!PyArg_ParseTuple(args, "OOO", &xo, &ao, &bo)) return NULL;
    Py_buffer x;
    if (get_u64(xo, &x, "hashes") < 0) return NULL;
    PyObject *res = sig_bytes((const uint64_t *)x.buf, x.len / 8, ao, bo);
    PyBuffer_Release(&x);
    return res;
}

static PyObject *py_minhash_tokens(PyObject *self, PyObject *args) {
    PyObject *tokens, *ao, *bo;
    Py_ssize_t n, count = 0;
    if (!PyArg_ParseTuple(args, "OnOO", &tokens, &n, &ao, &bo)) return NULL;
    if (n < 1) { PyErr_SetString(PyExc_ValueError, "n must be >= 1"); return NULL; }
    uint64_t *h = window_hashes(tokens, n, &count);
    if (!h) return NULL;
    PyObject *res = sig_bytes(h, count, ao, bo);
    PyMem_Free(h);
    return res;
}

/* ---- datatrove's simplify_text + whitespace split, in one pass over the code points -------------------------
 * simplify(text, table, flags) -> (joined, ntokens) | None. `table` has one byte of CH_* flags per BMP code
 * point, built in Python from datatrove's own sets (fingerprints.py): the caller has already lowercased (and,
 * with accent stripping, NFD-normalised) the text. Numbers \p{Nd}+([sep]\p{Nd}+)? become "0" (before the
 * punctuation rule, as datatrove orders them), punctuation and whitespace end a token, nonspacing marks are
 * dropped. `joined` is the UTF-8 of the tokens joined by single spaces. None for a code point outside the BMP:
 * the caller takes the Python path. */
enum { CH_DIGIT = 1, CH_SEP = 2, CH_BREAK = 4, CH_MARK = 8 };
enum { SIMPLIFY_DIGITS = 1, SIMPLIFY_MARKS = 2 };

/* The scan over one storage kind of str (1, 2 or 4 bytes per code point): returns the bytes written to `out`,
 * or -1 at a code point outside the BMP (or a lone surrogate). */
#define DEFINE_SIMPLIFY(NAME, T)                                                                              \
    static Py_ssize_t NAME(const T *d, Py_ssize_t len, const unsigned char *table, int flags,                \
                           unsigned char *out, Py_ssize_t *ntok_out) {                                        \
        Py_ssize_t pos = 0, ntok = 0;                                                                         \
        int in_token = 0;                                                                                     \
        for (Py_ssize_t i = 0; i < len;) {                                                                    \
            Py_UCS4 c = d[i];                                                                                 \
            if (c > 0xFFFF || (c >= 0xD800 && c <= 0xDFFF)) return -1;                                        \
            unsigned char f = table[c];                                                                       \
            if ((flags & SIMPLIFY_DIGITS) && (f & CH_DIGIT)) {                                                \
                Py_ssize_t j = i + 1;                                                                         \
                while (j < len && d[j] <= 0xFFFF && (table[d[j]] & CH_DIGIT)) j++;                            \
                if (j + 1 < len && d[j] <= 0xFFFF && (table[d[j]] & CH_SEP) && d[j + 1] <= 0xFFFF &&          \
                    (table[d[j + 1]] & CH_DIGIT)) {                                                           \
                    j += 2;                                                                                   \
                    while (j < len && d[j] <= 0xFFFF && (table[d[j]] & CH_DIGIT)) j++;                        \
                }                                                                                             \
                if (!in_token) {                                                                              \
                    if (ntok) out[pos++] = ' ';                                                               \
                    ntok++;                                                                                   \
                    in_token = 1;                                                                             \
                }                                                                                             \
                out[pos++] = '0';                                                                             \
                i = j;                                                                                        \
                continue;                                                                                     \
            }                                                                                                 \
            i++;                                                                                              \
            if (f & CH_BREAK) {                                                                               \
                in_token = 0;                                                                                 \
                continue;                                                                                     \
            }                                                                                                 \
            if ((flags & SIMPLIFY_MARKS) && (f & CH_MARK)) continue;                                          \
            if (!in_token) {                                                                                  \
                if (ntok) out[pos++] = ' ';                                                                   \
                ntok++;                                                                                       \
                in_token = 1;                                                                                 \
            }                                                                                                 \
            if (c < 0x80) {                                                                                   \
                out[pos++] = (unsigned char)c;                                                                \
            } else if (c < 0x800) {                                                                           \
                out[pos++] = (unsigned char)(0xC0 | (c >> 6));                                                \
                out[pos++] = (unsigned char)(0x80 | (c & 0x3F));                                              \
            } else {                                                                                          \
                out[pos++] = (unsigned char)(0xE0 | (c >> 12));                                               \
                out[pos++] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));                                       \
                out[pos++] = (unsigned char)(0x80 | (c & 0x3F));                                              \
            }                                                                                                 \
        }                                                                                                     \
        *ntok_out = ntok;                                                                                     \
        return pos;                                                                                           \
    }
DEFINE_SIMPLIFY(simplify_ucs1, Py_UCS1)
DEFINE_SIMPLIFY(simplify_ucs2, Py_UCS2)
DEFINE_SIMPLIFY(simplify_ucs4, Py_UCS4)

static PyObject *py_simplify(PyObject *self, PyObject *args) {
    PyObject *text;
    Py_buffer tbl;
    int flags;
    if (!PyArg_ParseTuple(args, "Uy*i", &text, &tbl, &flags)) return NULL;
    if (tbl.len != 65536) {
        PyBuffer_Release(&tbl);
        PyErr_SetString(PyExc_ValueError, "table must have 65536 entries");
        return NULL;
    }
    const Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    /* a BMP code point is at most 3 UTF-8 bytes; '0' replaces >= 1 code point, spaces collapse */
    PyObject *joined = PyBytes_FromStringAndSize(NULL, len * 3);
    if (!joined) {
        PyBuffer_Release(&tbl);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(joined);
    Py_ssize_t ntok = 0, pos;
    const void *data = PyUnicode_DATA(text);
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_1BYTE_KIND: pos = simplify_ucs1(data, len, tbl.buf, flags, out, &ntok); break;
    case PyUnicode_2BYTE_KIND: pos = simplify_ucs2(data, len, tbl.buf, flags, out, &ntok); break;
    default: pos = simplify_ucs4(data, len, tbl.buf, flags, out, &ntok); break;
    }
    PyBuffer_Release(&tbl);
    if (pos < 0) {
        Py_DECREF(joined);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&joined, pos) < 0) return NULL;
    return Py_BuildValue("(Nn)", joined, ntok);
}

/* minhash_joined(joined, n, a, b) -> bytes: minhash_tokens(joined.split(b" "), n, a, b) without the list: a
 * window of n tokens is a slice of the joined bytes. `joined` has single spaces and no leading/trailing one. */
static PyObject *py_minhash_joined(PyObject *self, PyObject *args) {
    Py_buffer j;
    Py_ssize_t n;
    PyObject *ao, *bo;
    if (!PyArg_ParseTuple(args, "y*nOO", &j, &n, &ao, &bo)) return NULL;
    if (n < 1) {
        PyBuffer_Release(&j);
        PyErr_SetString(PyExc_ValueError, "n must be >= 1");
        return NULL;
    }
    const unsigned char *s = j.buf;
    const Py_ssize_t len = j.len;
    Py_ssize_t ntok = len ? 1 : 0;
    for (Py_ssize_t i = 0; i < len; i++) ntok += s[i] == ' ';
    /* starts[t] = offset of token t; starts[ntok] = len + 1 (one past a virtual trailing space) */
    Py_ssize_t *starts = PyMem_Malloc(sizeof(Py_ssize_t) * (ntok + 1));
    Py_ssize_t count = window_count(ntok, n);
    uint64_t *h = PyMem_Malloc(sizeof(uint64_t) * count);
    if (!starts || !h) {
        PyMem_Free(starts);
        PyMem_Free(h);
        PyBuffer_Release(&j);
        return PyErr_NoMemory();
    }
    Py_ssize_t t = 0;
    if (len) starts[t++] = 0;
    for (Py_ssize_t i = 0; i < len; i++)
        if (s[i] == ' ') starts[t++] = i + 1;
    starts[ntok] = len + 1;
    hash_windows(s, (size_t)len, starts, ntok, n, h);
    PyObject *res = sig_bytes(h, count, ao, bo);
    PyMem_Free(starts);
    PyMem_Free(h);
    PyBuffer_Release(&j);
    return res;
}

/* finish(sig, rows, salt) -> (bands, low32): MinHasher.band_keys (each band's values times seeded odd
 * multipliers, summed mod 2^64, plus the band's salt, then murmur3's fmix64; int64 bytes) and the low 32 bits
 * of every value (uint32 bytes), as the numpy code computes them. */
static PyObject *py_finish(PyObject *self, PyObject *args) {
    PyObject *so, *ro, *to;
    if (!PyArg_ParseTuple(args, "OOO", &so, &ro, &to)) return NULL;
    Py_buffer sig, rows, salt;
    if (get_u64(so, &sig, "sig") < 0) return NULL;
    if (get_u64(ro, &rows, "rows") < 0) { PyBuffer_Release(&sig); return NULL; }
    if (get_u64(to, &salt, "salt") < 0) { PyBuffer_Release(&sig); PyBuffer_Release(&rows); return NULL; }
    Py_ssize_t k = sig.len / 8, r = rows.len / 8, nb = salt.len / 8;
    PyObject *res = NULL;
    if (r * nb != k) {
        PyErr_SetString(PyExc_ValueError, "len(sig) != len(rows) * len(salt)");
        goto done;
    }
    PyObject *bands = PyBytes_FromStringAndSize(NULL, nb * 8);
    PyObject *low = PyBytes_FromStringAndSize(NULL, k * 4);
    if (!bands || !low) { Py_XDECREF(bands); Py_XDECREF(low); goto done; }
    const uint64_t *s = sig.buf, *m = rows.buf, *t = salt.buf;
    uint64_t *bo = (uint64_t *)PyBytes_AS_STRING(bands);
    uint32_t *lo = (uint32_t *)PyBytes_AS_STRING(low);
    for (Py_ssize_t b = 0; b < nb; b++) {
        uint64_t acc = 0;
        for (Py_ssize_t j = 0; j < r; j++) acc += s[b * r + j] * m[j];
        acc += t[b];
        acc ^= acc >> 33; acc *= 0xFF51AFD7ED558CCDULL;
        acc ^= acc >> 33; acc *= 0xC4CEB9FE1A85EC53ULL;
        acc ^= acc >> 33;
        bo[b] = acc;
    }
    for (Py_ssize_t i = 0; i < k; i++) lo[i] = (uint32_t)s[i];
    res = Py_BuildValue("(NN)", bands, low);
done:
    PyBuffer_Release(&sig); PyBuffer_Release(&rows); PyBuffer_Release(&salt);
    return res;
}

static PyMethodDef methods[] = {
    {"shingle_hashes", py_shingle_hashes, METH_VARARGS, "uint64 xxh64 of every n-token window, as bytes"},
    {"minhash", py_minhash, METH_VARARGS, "MinHash signature (uint64 bytes) of uint64 hashes"},
    {"minhash_tokens", py_minhash_tokens, METH_VARARGS, "shingle_hashes then minhash, as bytes"},
    {"simplify", py_simplify, METH_VARARGS, "datatrove's simplify_text + split: (joined UTF-8, ntokens) or None"},
    {"minhash_joined", py_minhash_joined, METH_VARARGS, "minhash_tokens of space-joined UTF-8 tokens"},
    {"finish", py_finish, METH_VARARGS, "band keys (int64 bytes) and low 32 bits (uint32 bytes) of a signature"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_minhash", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minhash(void) { return PyModule_Create(&module); }
