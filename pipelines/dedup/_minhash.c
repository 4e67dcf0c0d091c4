/* The dedup fingerprint's hot loop in C: word n-gram shingles hashed with xxh64, then MinHash over the seeded
 * universal hashes. Each function has a Python/numpy reference in pipelines/dedup/fingerprints.py
 * (MinHasher._shingle_hashes_py, MinHasher._signature_py) that the tests compare it with and that serves where
 * this module was not built:
 *   shingle_hashes(tokens, n) -> bytes: uint64 xxh64 (seed 0) of the UTF-8 of " ".join(window) for every
 *       window of n tokens (one window, the whole " ".join(tokens), when there are <= n tokens): the same
 *       values as xxhash.xxh64_intdigest on each window string, i.e. datatrove's shingle hash;
 *   minhash(hashes, a, b) -> bytes: uint64 min over the hashes x of ((a_i * x + b_i) mod 2^64), reduced
 *       mod 2^61 - 1 by one Mersenne shift-add (exactly the numpy reference's arithmetic);
 *   minhash_tokens(tokens, n, a, b) -> bytes: both, without the intermediate Python object. */
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
    if (ntok <= n) {
        out = PyMem_Malloc(sizeof(uint64_t));
        if (!out) { PyErr_NoMemory(); goto fail; }
        out[0] = xxh64(joined, ntok ? total - 1 : 0);
        *count = 1;
    } else {
        Py_ssize_t c = ntok - n + 1;
        out = PyMem_Malloc(sizeof(uint64_t) * c);
        if (!out) { PyErr_NoMemory(); goto fail; }
        for (Py_ssize_t i = 0; i < c; i++)
            out[i] = xxh64(joined + starts[i], (size_t)(starts[i + n] - 1 - starts[i]));
        *count = c;
    }
    PyMem_Free(data); PyMem_Free(lens); PyMem_Free(starts); PyMem_Free(joined);
    Py_DECREF(seq);
    return out;
fail:
    PyMem_Free(data); PyMem_Free(lens); PyMem_Free(starts); PyMem_Free(joined);
    Py_DECREF(seq);
    return NULL;
}

static void minhash_into(const uint64_t *x, Py_ssize_t nx, const uint64_t *a, const uint64_t *b, Py_ssize_t k,
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

static PyMethodDef methods[] = {
    {"shingle_hashes", py_shingle_hashes, METH_VARARGS, "uint64 xxh64 of every n-token window, as bytes"},
    {"minhash", py_minhash, METH_VARARGS, "MinHash signature (uint64 bytes) of uint64 hashes"},
    {"minhash_tokens", py_minhash_tokens, METH_VARARGS, "shingle_hashes then minhash, as bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_minhash", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minhash(void) { return PyModule_Create(&module); }
