/* One SQLite SELECT straight into Arrow-ready column buffers (sqlite_common.fetch's fast path).
 *
 * No SQLite header and no -lsqlite3: the few C API functions used are declared here (the
 * C API is stable) and resolved at run time with dlopen/dlsym in the library Python's own
 * _sqlite3 module already loaded (sqlite_common passes the candidates). Where none binds,
 * bind() returns None and fetch keeps its json_array path; so the module builds wherever
 * Python builds extensions, with or without libsqlite3's headers.
 *
 *   bind(candidates)                   -> the candidate that bound, or None
 *   read(uri, sql, params, kinds)      -> (n_rows, columns) | ("bad", row, column, type) | None
 *
 * kinds holds one letter per result column: 'i' int64 (INTEGER or NULL), 's' string (TEXT
 * or NULL; a BLOB is its bytes, as Python's sqlite3 hands it over with text_factory=bytes).
 * An int column is (values: bytes of int64, validity: bytes | None, null_count); a string
 * column (offsets: bytes of int32, data: bytes, validity: bytes | None, null_count); a
 * validity bitmap is Arrow's (bit i of byte i/8, set where valid). A value of another storage
 * class stops the read: ("bad", row, column, sqlite type). None: anything else (open, prepare
 * or step failed, a parameter it does not bind, more than 2 GiB of text): the caller takes the
 * json_array path, which raises as it always has. The GIL is released while stepping, and taken
 * back every CHUNK_ROWS rows to look at signals (Ctrl-C interrupts a long read).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef _WIN32
#include <dlfcn.h>
#endif

/* --- the SQLite C API, declared here -------------------------------------------------- */

typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct sqlite3_value sqlite3_value;
typedef long long sq_int64;

#define SQ_OK 0
#define SQ_ROW 100
#define SQ_DONE 101
#define SQ_INTEGER 1
#define SQ_FLOAT 2
#define SQ_TEXT 3
#define SQ_BLOB 4
#define SQ_NULL 5
#define SQ_OPEN_READONLY 0x00000001
#define SQ_OPEN_URI 0x00000040
#define SQ_OPEN_NOMUTEX 0x00008000 /* the connection lives in this call's thread only */
#define SQ_TRANSIENT ((void (*)(void *))-1)

static struct {
    int (*open_v2)(const char *, sqlite3 **, int, const char *);
    int (*close)(sqlite3 *);
    int (*prepare_v2)(sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
    int (*step)(sqlite3_stmt *);
    int (*finalize)(sqlite3_stmt *);
    int (*column_count)(sqlite3_stmt *);
    const unsigned char *(*column_text)(sqlite3_stmt *, int);
    const void *(*column_blob)(sqlite3_stmt *, int);
    int (*column_bytes)(sqlite3_stmt *, int);
    int (*bind_int64)(sqlite3_stmt *, int, sq_int64);
    int (*bind_double)(sqlite3_stmt *, int, double);
    int (*bind_null)(sqlite3_stmt *, int);
    int (*bind_text)(sqlite3_stmt *, int, const char *, int, void (*)(void *));
    int (*bind_blob)(sqlite3_stmt *, int, const void *, int, void (*)(void *));
    int (*bind_parameter_count)(sqlite3_stmt *);
    sqlite3_value *(*column_value)(sqlite3_stmt *, int);
    int (*value_type)(sqlite3_value *);
    sq_int64 (*value_int64)(sqlite3_value *);
} api;

static int bound = 0;
typedef char api_is_a_run_of_pointers[sizeof(api) == 18 * sizeof(void *) ? 1 : -1];

static const char *const api_names[] = {
    "sqlite3_open_v2",     "sqlite3_close",       "sqlite3_prepare_v2",  "sqlite3_step",
    "sqlite3_finalize",    "sqlite3_column_count",
    "sqlite3_column_text", "sqlite3_column_blob", "sqlite3_column_bytes", "sqlite3_bind_int64",
    "sqlite3_bind_double", "sqlite3_bind_null",   "sqlite3_bind_text",   "sqlite3_bind_blob",
    "sqlite3_bind_parameter_count", "sqlite3_column_value", "sqlite3_value_type", "sqlite3_value_int64",
};
#define N_API (sizeof(api_names) / sizeof(api_names[0]))
typedef char one_name_per_pointer[N_API == 18 ? 1 : -1];

#ifndef _WIN32
/* every function from one handle, or none (api untouched) */
static int bind_handle(void *handle) {
    void *found[N_API];
    for (size_t i = 0; i < N_API; i++) {
        found[i] = dlsym(handle, api_names[i]);
        if (found[i] == NULL)
            return 0;
    }
    /* the struct is a run of function pointers in api_names' order */
    memcpy(&api, found, sizeof(found));
    return 1;
}

static int try_open(const char *name, int flags) {
    void *handle = dlopen(name, flags);
    if (handle == NULL)
        return 0;
    if (bind_handle(handle))
        return 1; /* kept open: the functions live there */
    dlclose(handle);
    return 0;
}
#endif

PyDoc_STRVAR(bind_doc, "bind(candidates) -> str | None\n\n"
                       "Resolve the SQLite C API in the first candidate library already loaded in this\n"
                       "process (RTLD_NOLOAD), else in the first one that loads; the candidate that bound,\n"
                       "or None (then read() must not be called).");

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq))
        return NULL;
    PyObject *items = PySequence_Fast(seq, "bind: candidates must be a sequence");
    if (items == NULL)
        return NULL;
    PyObject *result = Py_None;
#ifndef _WIN32
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    int passes[2] = {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL};
    for (int p = 0; p < 2 && result == Py_None; p++) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(items, i));
            if (name == NULL) {
                Py_DECREF(items);
                return NULL;
            }
            if (try_open(name, passes[p])) {
                bound = 1;
                result = PySequence_Fast_GET_ITEM(items, i);
                break;
            }
        }
    }
#endif
    Py_INCREF(result);
    Py_DECREF(items);
    return result;
}

/* --- the read -------------------------------------------------------------------------- */

typedef struct {
    char kind;        /* 'i' or 's' */
    int64_t *values;  /* 'i': one per row */
    int32_t *offsets; /* 's': one per row + 1 */
    char *data;       /* 's': the bytes */
    size_t data_len, data_cap;
    uint8_t *bits; /* validity, Arrow's bit order */
    Py_ssize_t nulls;
} column;

enum { R_DONE, R_BAD, R_FAIL, R_NOMEM, R_MORE };

#define CHUNK_ROWS 262144 /* rows between two looks at signals (Ctrl-C), with the GIL */

typedef struct {
    sqlite3_stmt *stmt;
    int ncol;
    column *cols;
    size_t rows, cap;
    int bad_col, bad_type;
} reader;

static int grow_rows(reader *r) {
    size_t cap = r->cap ? r->cap * 2 : 4096;
    for (int c = 0; c < r->ncol; c++) {
        column *col = &r->cols[c];
        if (col->kind == 'i') {
            int64_t *v = realloc(col->values, cap * sizeof(int64_t));
            if (v == NULL)
                return 0;
            col->values = v;
        } else {
            int32_t *o = realloc(col->offsets, (cap + 1) * sizeof(int32_t));
            if (o == NULL)
                return 0;
            col->offsets = o;
        }
        uint8_t *b = realloc(col->bits, cap / 8);
        if (b == NULL)
            return 0;
        memset(b + r->cap / 8, 0, (cap - r->cap) / 8);
        col->bits = b;
    }
    r->cap = cap; /* a power of two times 4096: whole bytes of bits */
    return 1;
}

/* up to CHUNK_ROWS more rows into the columns (R_MORE: there may be more); runs without the GIL */
static int step_chunk(reader *r) {
    for (size_t stop = r->rows + CHUNK_ROWS; r->rows < stop;) {
        int rc = api.step(r->stmt);
        if (rc == SQ_DONE)
            return R_DONE;
        if (rc != SQ_ROW)
            return R_FAIL;
        if (r->rows == r->cap && !grow_rows(r))
            return R_NOMEM;
        size_t i = r->rows;
        for (int c = 0; c < r->ncol; c++) {
            column *col = &r->cols[c];
            /* one column_value, then its type and integer: ~15% faster than column_type +
             * column_int64, which each take the statement's API entry path; the value is
             * "unprotected", which only matters to another thread, and this connection has none */
            sqlite3_value *v = api.column_value(r->stmt, c);
            int t = api.value_type(v);
            if (col->kind == 'i') {
                if (t == SQ_INTEGER) {
                    col->values[i] = (int64_t)api.value_int64(v);
                    col->bits[i >> 3] |= (uint8_t)(1u << (i & 7));
                } else if (t == SQ_NULL) {
                    col->values[i] = 0;
                    col->nulls++;
                } else {
                    r->bad_col = c, r->bad_type = t;
                    return R_BAD;
                }
                continue;
            }
            if (t == SQ_TEXT || t == SQ_BLOB) {
                /* the stored bytes, as Python's sqlite3 reads them: text through column_text, a blob through column_blob */
                const void *p = t == SQ_TEXT ? (const void *)api.column_text(r->stmt, c) : api.column_blob(r->stmt, c);
                int nb = api.column_bytes(r->stmt, c);
                if (nb < 0 || (nb > 0 && p == NULL))
                    return R_NOMEM;
                if (col->data_len + (size_t)nb > (size_t)INT32_MAX)
                    return R_FAIL; /* past int32 offsets: the json_array path reads it */
                if (col->data_len + (size_t)nb > col->data_cap) {
                    size_t want = col->data_cap ? col->data_cap : 65536;
                    while (want < col->data_len + (size_t)nb)
                        want *= 2;
                    char *d = realloc(col->data, want);
                    if (d == NULL)
                        return R_NOMEM;
                    col->data = d, col->data_cap = want;
                }
                if (nb)
                    memcpy(col->data + col->data_len, p, (size_t)nb);
                col->data_len += (size_t)nb;
                col->bits[i >> 3] |= (uint8_t)(1u << (i & 7));
            } else if (t == SQ_NULL) {
                col->nulls++;
            } else {
                r->bad_col = c, r->bad_type = t;
                return R_BAD;
            }
            col->offsets[i + 1] = (int32_t)col->data_len;
        }
        r->rows++;
    }
    return R_MORE;
}

static int bind_params(sqlite3_stmt *stmt, PyObject *params) {
    PyObject *items = PySequence_Fast(params, "read: params must be a sequence");
    if (items == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    int ok = n == api.bind_parameter_count(stmt);
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(items, i);
        int rc;
        if (v == Py_None) {
            rc = api.bind_null(stmt, (int)i + 1);
        } else if (PyLong_CheckExact(v)) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || (x == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                ok = 0;
                break;
            }
            rc = api.bind_int64(stmt, (int)i + 1, x);
        } else if (PyFloat_CheckExact(v)) {
            rc = api.bind_double(stmt, (int)i + 1, PyFloat_AS_DOUBLE(v));
        } else if (PyUnicode_CheckExact(v)) {
            Py_ssize_t len;
            const char *s = PyUnicode_AsUTF8AndSize(v, &len);
            if (s == NULL || len > INT32_MAX) {
                PyErr_Clear();
                ok = 0;
                break;
            }
            rc = api.bind_text(stmt, (int)i + 1, s, (int)len, SQ_TRANSIENT);
        } else if (PyBytes_CheckExact(v) && PyBytes_GET_SIZE(v) <= INT32_MAX) {
            rc = api.bind_blob(stmt, (int)i + 1, PyBytes_AS_STRING(v), (int)PyBytes_GET_SIZE(v), SQ_TRANSIENT);
        } else {
            ok = 0; /* anything else (named parameters, adapters): the json_array path binds it */
            break;
        }
        ok = rc == SQ_OK;
    }
    Py_DECREF(items);
    return ok;
}

static PyObject *validity(column *col, size_t rows) {
    if (col->nulls == 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)col->bits, (Py_ssize_t)((rows + 7) / 8));
}

static void free_column(column *col) {
    free(col->values), free(col->offsets), free(col->data), free(col->bits);
    col->values = NULL, col->offsets = NULL, col->data = NULL, col->bits = NULL;
}

/* the column as Python bytes; its buffers freed once copied (the peak: the columns plus one copy) */
static PyObject *column_result(column *col, size_t rows) {
    PyObject *valid = validity(col, rows), *out;
    if (valid == NULL)
        return NULL;
    if (col->kind == 'i') {
        out = Py_BuildValue("(y#Nn)", rows ? (const char *)col->values : "", (Py_ssize_t)(rows * sizeof(int64_t)),
                            valid, col->nulls);
    } else {
        out = Py_BuildValue("(y#y#Nn)", (const char *)col->offsets, (Py_ssize_t)((rows + 1) * sizeof(int32_t)),
                            col->data ? col->data : "", (Py_ssize_t)col->data_len, valid, col->nulls);
    }
    free_column(col);
    return out;
}

PyDoc_STRVAR(read_doc, "read(uri, sql, params, kinds) -> (n_rows, columns) | ('bad', row, column, type) | None\n\n"
                       "Run one SELECT on the database at uri (opened read-only, URI filename) and return\n"
                       "its columns as buffers (see the module's comment); None where the caller must read\n"
                       "it another way.");

static PyObject *read_columns(PyObject *self, PyObject *args) {
    const char *uri, *sql, *kinds;
    PyObject *params;
    Py_ssize_t nkinds;
    if (!PyArg_ParseTuple(args, "ssOs#", &uri, &sql, &params, &kinds, &nkinds))
        return NULL;
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "_sqlite.read: no SQLite library bound (call bind first)");
        return NULL;
    }
    for (Py_ssize_t c = 0; c < nkinds; c++) {
        if (kinds[c] != 'i' && kinds[c] != 's') {
            PyErr_SetString(PyExc_ValueError, "_sqlite.read: kinds holds only 'i' and 's'");
            return NULL;
        }
    }
    sqlite3 *db = NULL;
    reader r = {0};
    PyObject *result = NULL;
    int rc, status = R_FAIL;

    Py_BEGIN_ALLOW_THREADS
    rc = api.open_v2(uri, &db, SQ_OPEN_READONLY | SQ_OPEN_URI | SQ_OPEN_NOMUTEX, NULL);
    if (rc == SQ_OK)
        rc = api.prepare_v2(db, sql, -1, &r.stmt, NULL);
    Py_END_ALLOW_THREADS
    if (rc != SQ_OK || r.stmt == NULL || api.column_count(r.stmt) != nkinds)
        goto done;
    int ok = bind_params(r.stmt, params);
    if (ok < 0)
        goto done; /* an exception is set */
    if (!ok)
        goto done;
    r.ncol = (int)nkinds;
    r.cols = calloc(nkinds ? (size_t)nkinds : 1, sizeof(column));
    if (r.cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int c = 0; c < r.ncol; c++)
        r.cols[c].kind = kinds[c];
    if (!grow_rows(&r)) {
        PyErr_NoMemory();
        goto done;
    }
    for (int c = 0; c < r.ncol; c++)
        if (r.cols[c].kind == 's')
            r.cols[c].offsets[0] = 0;

    do {
        Py_BEGIN_ALLOW_THREADS
        status = step_chunk(&r);
        Py_END_ALLOW_THREADS
        if (status == R_MORE && PyErr_CheckSignals() < 0)
            goto done; /* KeyboardInterrupt (or what a handler raised) propagates */
    } while (status == R_MORE);

    if (status == R_NOMEM) {
        PyErr_NoMemory();
    } else if (status == R_BAD) {
        result = Py_BuildValue("(snii)", "bad", (Py_ssize_t)r.rows, r.bad_col, r.bad_type);
    } else if (status == R_DONE) {
        PyObject *cols = PyList_New(r.ncol);
        if (cols != NULL) {
            for (int c = 0; c < r.ncol; c++) {
                PyObject *one = column_result(&r.cols[c], r.rows);
                if (one == NULL) {
                    Py_CLEAR(cols);
                    break;
                }
                PyList_SET_ITEM(cols, c, one);
            }
        }
        if (cols != NULL)
            result = Py_BuildValue("(nN)", (Py_ssize_t)r.rows, cols);
    }

done:
    if (r.stmt != NULL)
        api.finalize(r.stmt);
    if (db != NULL)
        api.close(db);
    if (r.cols != NULL) {
        for (int c = 0; c < r.ncol; c++)
            free_column(&r.cols[c]);
        free(r.cols);
    }
    if (result == NULL && !PyErr_Occurred())
        Py_RETURN_NONE; /* the json_array path reads it, and raises what it raises */
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, bind_doc},
    {"read", read_columns, METH_VARARGS, read_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sqlite", "One SQLite SELECT into Arrow-ready column buffers (sqlite_common.fetch).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__sqlite(void) { return PyModule_Create(&module); }
