/* Two hot loops of the code-language classifier in C, each with a Python reference in
 * classifiers/code_language.py that tests compare it with and that serves where this module was not built:
 *   line_tokens: the per-line tokenizer (_line_tokens_py): tokens, line-start markers, prose collapsing;
 *   feature_line: tokens -> model features (TokenFeatures.line_py): vocabulary tokens stay, others become
 *   their shape (token_shape), through a memo dict; joined by spaces. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *NL, *NL_DEEPER, *NL_SAME, *NL_SHALLOWER, *PROSE;

/* re.ASCII classes of the Python pattern: \w is [A-Za-z0-9_], \s is [ \t\n\r\f\v] */
static inline int is_word(Py_UCS4 c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static inline int is_ident_start(Py_UCS4 c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static inline int is_space(Py_UCS4 c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static inline int is_sigil(Py_UCS4 c) { return c == '#' || c == '@' || c == '$' || c == '%'; }

/* Tokens of text[start:end] (one line) appended to `line`:
 *   [#@$%]?[A-Za-z_]\w*[?!]?  |  \d[\w.]*  |  [^\w\s]{1,3} */
static int tokenize_line(PyObject *text, int kind, const void *data, Py_ssize_t start, Py_ssize_t end,
                         PyObject *line) {
    Py_ssize_t i = start;
    while (i < end) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        Py_ssize_t s = i;
        if (is_ident_start(c) || (is_sigil(c) && i + 1 < end && is_ident_start(PyUnicode_READ(kind, data, i + 1)))) {
            i += is_sigil(c) ? 2 : 1;
            while (i < end && is_word(PyUnicode_READ(kind, data, i))) i++;
            if (i < end) {
                Py_UCS4 q = PyUnicode_READ(kind, data, i);
                if (q == '?' || q == '!') i++;
            }
        } else if (c >= '0' && c <= '9') {
            i++;
            while (i < end) {
                Py_UCS4 d = PyUnicode_READ(kind, data, i);
                if (!(is_word(d) || d == '.')) break;
                i++;
            }
        } else if (!is_space(c)) {
            i++;
            while (i < end && i - s < 3) {
                Py_UCS4 d = PyUnicode_READ(kind, data, i);
                if (is_word(d) || is_space(d)) break;
                i++;
            }
        } else {
            i++;
            continue;
        }
        PyObject *tok = PyUnicode_Substring(text, s, i);
        if (tok == NULL || PyList_Append(line, tok) < 0) {
            Py_XDECREF(tok);
            return -1;
        }
        Py_DECREF(tok);
    }
    return 0;
}

static inline int starts_alpha(PyObject *tok) { return Py_UNICODE_ISALPHA(PyUnicode_READ_CHAR(tok, 0)); }

/* 1 if the line is prose (see _line_tokens_py), 0 if code, -1 on error; *keep_first: whether its first token
 * (the comment marker) stays */
static int prose_line(PyObject *line, PyObject *stopwords, int *keep_first) {
    Py_ssize_t n = PyList_GET_SIZE(line);
    *keep_first = 0;
    if (n < 4) return 0;
    PyObject *first = PyList_GET_ITEM(line, 0);
    Py_UCS4 c = PyUnicode_READ_CHAR(first, 0);
    Py_ssize_t words = 0;
    if (!(Py_UNICODE_ISALPHA(c) || c == '_')) {
        for (Py_ssize_t k = 0; k < n; k++) words += starts_alpha(PyList_GET_ITEM(line, k));
        if (words >= 3 && (double)words >= 0.6 * (double)(n - 1)) {
            *keep_first = 1;
            return 1;
        }
        return 0;
    }
    PyObject *seen = NULL; /* two distinct stopwords make the line a candidate */
    int distinct = 0;
    for (Py_ssize_t k = 0; k < n && distinct < 2; k++) {
        PyObject *tok = PyList_GET_ITEM(line, k);
        if (!starts_alpha(tok)) continue;
        int hit = PySet_Contains(stopwords, tok);
        if (hit < 0) return -1;
        if (!hit) continue;
        if (seen == NULL) {
            seen = tok;
            distinct = 1;
        } else if (PyUnicode_Compare(seen, tok) != 0) {
            distinct = 2;
        }
    }
    if (distinct < 2) return 0;
    for (Py_ssize_t k = 0; k < n; k++) words += starts_alpha(PyList_GET_ITEM(line, k));
    return (double)words >= 0.7 * (double)n;
}

static PyObject *line_tokens(PyObject *self, PyObject *args) {
    PyObject *text, *stopwords;
    Py_ssize_t max_tokens;
    if (!PyArg_ParseTuple(args, "UnO", &text, &max_tokens, &stopwords)) return NULL;
    if (!PyAnySet_Check(stopwords)) {
        PyErr_SetString(PyExc_TypeError, "stopwords must be a set or frozenset");
        return NULL;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    PyObject *out = PyList_New(0), *line = PyList_New(0);
    if (out == NULL || line == NULL) goto error;
    Py_ssize_t prev = 0, pos = 0;
    while (pos <= n && PyList_GET_SIZE(out) < max_tokens) {
        Py_ssize_t end = pos;
        while (end < n && PyUnicode_READ(kind, data, end) != '\n') end++;
        if (PyList_SetSlice(line, 0, PY_SSIZE_T_MAX, NULL) < 0) goto error;
        if (tokenize_line(text, kind, data, pos, end, line) < 0) goto error;
        if (PyList_GET_SIZE(line) > 0) {
            /* indentation as a step: deeper / same / shallower than the previous non-blank line */
            Py_ssize_t ind = pos;
            while (ind < end) {
                Py_UCS4 c = PyUnicode_READ(kind, data, ind);
                if (c != ' ' && c != '\t') break;
                ind++;
            }
            ind -= pos;
            PyObject *mark = ind == 0 ? NL : ind > prev ? NL_DEEPER : ind == prev ? NL_SAME : NL_SHALLOWER;
            prev = ind;
            if (PyList_Append(out, mark) < 0) goto error;
            int keep_first;
            int prose = prose_line(line, stopwords, &keep_first);
            if (prose < 0) goto error;
            if (prose) {
                if (keep_first && PyList_Append(out, PyList_GET_ITEM(line, 0)) < 0) goto error;
                if (PyList_Append(out, PROSE) < 0) goto error;
            } else {
                Py_ssize_t at = PyList_GET_SIZE(out);
                if (PyList_SetSlice(out, at, at, line) < 0) goto error;
                if (PyList_GET_SIZE(out) >= max_tokens) break;
            }
        }
        pos = end + 1;
    }
    Py_DECREF(line);
    if (PyList_GET_SIZE(out) > max_tokens && PyList_SetSlice(out, max_tokens, PY_SSIZE_T_MAX, NULL) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
error:
    Py_XDECREF(out);
    Py_XDECREF(line);
    return NULL;
}

/* str.isupper() of s[start:] */
static int str_isupper(PyObject *s, Py_ssize_t start) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int cased = 0;
    for (Py_ssize_t i = start; i < n; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        if (Py_UNICODE_ISLOWER(ch) || Py_UNICODE_ISTITLE(ch)) return 0;
        if (Py_UNICODE_ISUPPER(ch)) cased = 1;
    }
    return cased;
}

/* code_language.token_shape, for a non-empty token (a new reference) */
static PyObject *token_shape(PyObject *tok) {
    int kind = PyUnicode_KIND(tok);
    const void *data = PyUnicode_DATA(tok);
    Py_ssize_t n = PyUnicode_GET_LENGTH(tok);
    Py_UCS4 c0 = PyUnicode_READ(kind, data, 0);
    if (n >= 2 && c0 == 'N' && PyUnicode_READ(kind, data, 1) == 'L') return Py_NewRef(tok);
    if (Py_UNICODE_ISDIGIT(c0)) return PyUnicode_FromString("0");
    Py_ssize_t start = (is_sigil(c0) && n > 1) ? 1 : 0; /* core = tok[start:] */
    Py_UCS4 first = PyUnicode_READ(kind, data, start);
    if (!(Py_UNICODE_ISALPHA(first) || first == '_')) return PyUnicode_FromString("P");
    Py_ssize_t lo = start, hi = n; /* core.strip("_") */
    while (lo < hi && PyUnicode_READ(kind, data, lo) == '_') lo++;
    while (hi > lo && PyUnicode_READ(kind, data, hi - 1) == '_') hi--;
    int inner_underscore = 0, any_upper = 0;
    for (Py_ssize_t i = lo; i < hi; i++) inner_underscore |= PyUnicode_READ(kind, data, i) == '_';
    for (Py_ssize_t i = start; i < n; i++) any_upper |= Py_UNICODE_ISUPPER(PyUnicode_READ(kind, data, i)) != 0;
    const char *shape;
    if (inner_underscore) shape = str_isupper(tok, start) ? "A_A" : "a_a";
    else if (n - start > 1 && str_isupper(tok, start)) shape = "AA";
    else if (Py_UNICODE_ISUPPER(first)) shape = "Aa";
    else if (any_upper) shape = "aA";
    else shape = "a";
    if (start == 0) return PyUnicode_FromFormat("~%s", shape);
    return PyUnicode_FromFormat("%c~%s", (int)c0, shape);
}

/* TokenFeatures.feature for a token the memo does not hold */
static PyObject *feature_of(PyObject *tok, PyObject *vocabulary) {
    if (PyUnicode_GET_LENGTH(tok) == 0) return Py_NewRef(tok);
    int in_vocab = PySet_Contains(vocabulary, tok);
    if (in_vocab < 0) return NULL;
    if (in_vocab && !Py_UNICODE_ISDIGIT(PyUnicode_READ_CHAR(tok, 0))) return Py_NewRef(tok);
    return token_shape(tok);
}

static PyObject *feature_line(PyObject *self, PyObject *args) {
    PyObject *tokens, *vocabulary, *memo;
    Py_ssize_t max_memo;
    if (!PyArg_ParseTuple(args, "O!OO!n", &PyList_Type, &tokens, &vocabulary, &PyDict_Type, &memo, &max_memo))
        return NULL;
    if (!PyAnySet_Check(vocabulary)) {
        PyErr_SetString(PyExc_TypeError, "vocabulary must be a set or frozenset");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(tokens);
    PyObject *feats = PyList_New(n), *sep = NULL, *line = NULL;
    if (feats == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *tok = PyList_GET_ITEM(tokens, i);
        if (!PyUnicode_Check(tok)) {
            PyErr_SetString(PyExc_TypeError, "tokens must be str");
            goto done;
        }
        PyObject *feat = PyDict_GetItemWithError(memo, tok); /* borrowed */
        if (feat != NULL) {
            Py_INCREF(feat);
        } else {
            if (PyErr_Occurred()) goto done;
            feat = feature_of(tok, vocabulary);
            if (feat == NULL) goto done;
            if (PyDict_GET_SIZE(memo) < max_memo && PyDict_SetItem(memo, tok, feat) < 0) {
                Py_DECREF(feat);
                goto done;
            }
        }
        PyList_SET_ITEM(feats, i, feat);
    }
    sep = PyUnicode_FromString(" ");
    if (sep != NULL) line = PyUnicode_Join(sep, feats);
done:
    Py_XDECREF(sep);
    Py_DECREF(feats);
    return line;
}

static PyMethodDef methods[] = {
    {"line_tokens", line_tokens, METH_VARARGS,
     "line_tokens(text, max_tokens, stopwords) -> list[str]: see code_language._line_tokens_py"},
    {"feature_line", feature_line, METH_VARARGS,
     "feature_line(tokens, vocabulary, memo, max_memo) -> str: see code_language.TokenFeatures.line_py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codetok", NULL, -1, methods};

PyMODINIT_FUNC PyInit__codetok(void) {
    NL = PyUnicode_InternFromString("NL");
    NL_DEEPER = PyUnicode_InternFromString("NL>");
    NL_SAME = PyUnicode_InternFromString("NL=");
    NL_SHALLOWER = PyUnicode_InternFromString("NL<");
    PROSE = PyUnicode_InternFromString("PROSE");
    if (!NL || !NL_DEEPER || !NL_SAME || !NL_SHALLOWER || !PROSE) return NULL;
    return PyModule_Create(&module);
}
