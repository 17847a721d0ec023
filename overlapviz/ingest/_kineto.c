/* Kineto (PyTorch profiler) Chrome trace JSON -> columns, without a Python object per event.
 *
 * scan(buf, categories, meta_keys) parses the whole document (validating it as JSON) and
 * returns, for the complete ("X" or no "ph") events whose "cat" is one of `categories`,
 * the fields ingest reads, as raw column buffers grouped by bucket; the caller
 * (overlapviz/ingest/chrome_columns.py) wraps them into Arrow arrays.
 *
 * Anything this fast path does not handle exactly like the Python reader (invalid JSON, a
 * field of an unexpected type, an integer past int64, invalid UTF-8) raises Unsupported; the caller then reads the file with the Python reader, which
 * accepts what it can and words the errors. So this file never has to explain a bad trace,
 * with one exception that needs no re-reading: a kept event whose "args" is not an object
 * (an array, a string, a number, a boolean, null). When the whole document is otherwise
 * read, the first such event raises BadArgs(index, bucket, name or None, first byte of
 * the value), which chrome_columns words exactly as the Python reader words it (the
 * Python reader reports the first such event too, before any other check).
 *
 * Numbers: "ts" and "dur" (decimal µs) become int64 ns straight from their text, never
 * through a double: integer µs * 1000 plus the first three fractional digits; more
 * digits round to the nearest ns, ties to even (chrome_events.decimal_us_to_ns is the
 * same rule in Python). A time past int64 ns is handed over. Integers are exact int64;
 * a numeric string in an integer field is int(float(text)) (correctly rounded doubles:
 * Clinger's fast path, else PyOS_string_to_double), as the Python reader reads it, where
 * that is whole; a float literal or a fraction in an integer field goes to the Python reader.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <strings.h>

static PyObject *Unsupported, *BadArgs;

/* ---- growable buffers -------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int buf_grow(Buf *b, size_t extra) {
    size_t need = b->len + extra;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) { PyErr_NoMemory(); return -1; }
    b->data = d;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (n == 0) return 0; /* an empty string's bytes: b->data may still be NULL, and memcpy(NULL, ..., 0) is undefined */
    if (b->len + n > b->cap && buf_grow(b, n) < 0) return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static void buf_free(Buf *b) { free(b->data); b->data = NULL; b->len = b->cap = 0; }

static PyObject *buf_bytes(Buf *b) { return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len); }

/* ---- the parser state ---------------------------------------------------------------- */

#define MAX_DEPTH 512

typedef struct {
    const unsigned char *p, *end;
    const char *why; /* set on failure: what was not supported (for Unsupported's message) */
} P;

static int fail(P *s, const char *why) {
    if (!s->why) s->why = why;
    return -1;
}

/* 8 bytes at a time (SWAR): indentation runs and string contents are most of a trace */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

static inline uint64_t load8(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

static inline void ws(P *s) {
    const unsigned char *p = s->p, *e = s->end;
    while (p < e) {
        unsigned char c = *p;
        if (c == ' ') {
            /* an indentation run: whole words of spaces, then the rest of the run at once */
            while (e - p >= 8) {
                uint64_t d = load8(p) ^ (ONES * ' ');
                if (!d) { p += 8; continue; }
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                p += __builtin_ctzll(d) >> 3;
#endif
                break;
            }
            while (p < e && *p == ' ') p++;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            p++;
        } else {
            break;
        }
    }
    s->p = p;
}

/* nonzero when some byte of x is '"', '\\', below 0x20 or above 0x7f (non-ASCII: UTF-8 to check) */
static inline uint64_t special8(uint64_t x) {
    uint64_t q = x ^ (ONES * '"'), b = x ^ (ONES * '\\');
    return ((q - ONES) & ~q & HIGHS) | ((b - ONES) & ~b & HIGHS) | ((x - ONES * 0x20) & ~x & HIGHS) | (x & HIGHS);
}

/* the length of the well-formed UTF-8 sequence at p (no overlongs, no surrogates, at most
 * U+10FFFF: what Python's strict decoder accepts), 0 when it is not one */
static int utf8_len(const unsigned char *p, const unsigned char *e) {
    unsigned char c = p[0];
    if (c < 0xC2) return 0;
    if (c < 0xE0) return (e - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c < 0xF0) {
        if (e - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0)) return 0;
        return 3;
    }
    if (c < 0xF5) {
        if (e - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90)) return 0;
        return 4;
    }
    return 0;
}

/* the value of four hex digits at p, -1 when they are not */
static int hex4(const unsigned char *p, const unsigned char *e) {
    if (e - p < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* a string starting at s->p (on the opening quote): sets [*a, *b) to its raw contents and
 * *esc when it holds escapes; validates escapes and rejects raw control characters */
static int str_raw(P *s, const unsigned char **a, const unsigned char **b, int *esc) {
    const unsigned char *p = s->p + 1, *e = s->end;
    *a = p;
    *esc = 0;
    for (;;) {
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* the lowest flagged byte of special8 is exactly the first special one */
        while (e - p >= 8) {
            uint64_t m = special8(load8(p));
            if (m) { p += __builtin_ctzll(m) >> 3; break; }
            p += 8;
        }
#else
        while (e - p >= 8 && !special8(load8(p))) p += 8;
#endif
        while (p < e && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80) p++;
        if (p >= e) return fail(s, "unterminated string");
        if (*p == '"') break;
        if (*p >= 0x80) {
            int n = utf8_len(p, e);
            if (!n) return fail(s, "invalid UTF-8");
            p += n;
            continue;
        }
        if (*p < 0x20) return fail(s, "control character in a string");
        *esc = 1; /* backslash */
        p++;
        if (p >= e) return fail(s, "unterminated string");
        if (*p == 'u') {
            /* a surrogate must be a high one followed by a low one, wherever the string is
             * (the Python reader refuses the whole document otherwise) */
            int cp = hex4(p + 1, e);
            if (cp < 0) return fail(s, "bad \\u escape");
            p += 5;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(s, "unpaired surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo = e - p >= 2 && p[0] == '\\' && p[1] == 'u' ? hex4(p + 2, e) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(s, "unpaired surrogate");
                p += 6;
            }
        } else if (*p == '"' || *p == '\\' || *p == '/' || *p == 'b' || *p == 'f' || *p == 'n' || *p == 'r' || *p == 't') {
            p++;
        } else {
            return fail(s, "bad escape");
        }
    }
    *b = p;
    s->p = p + 1;
    return 0;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
}

/* append the unescaped UTF-8 of raw string contents [a, b) (already validated) */
static int unescape_into(P *s, Buf *out, const unsigned char *a, const unsigned char *b) {
    while (a < b) {
        const unsigned char *q = a;
        while (q < b && *q != '\\') q++;
        if (q > a && buf_put(out, a, (size_t)(q - a)) < 0) return -1;
        if (q >= b) break;
        q++; /* after the backslash */
        unsigned char c = *q;
        char one = 0;
        switch (c) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        }
        if (c != 'u') {
            if (buf_put(out, &one, 1) < 0) return -1;
            a = q + 1;
            continue;
        }
        uint32_t cp = (hexval(q[1]) << 12) | (hexval(q[2]) << 8) | (hexval(q[3]) << 4) | hexval(q[4]);
        a = q + 5;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate: needs its low half */
            if (b - a >= 6 && a[0] == '\\' && a[1] == 'u') {
                uint32_t lo = (hexval(a[2]) << 12) | (hexval(a[3]) << 8) | (hexval(a[4]) << 4) | hexval(a[5]);
                if (lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    a += 6;
                } else {
                    return fail(s, "unpaired surrogate");
                }
            } else {
                return fail(s, "unpaired surrogate");
            }
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return fail(s, "unpaired surrogate");
        }
        unsigned char u[4];
        size_t n;
        if (cp < 0x80) { u[0] = (unsigned char)cp; n = 1; }
        else if (cp < 0x800) { u[0] = 0xC0 | (cp >> 6); u[1] = 0x80 | (cp & 0x3F); n = 2; }
        else if (cp < 0x10000) { u[0] = 0xE0 | (cp >> 12); u[1] = 0x80 | ((cp >> 6) & 0x3F); u[2] = 0x80 | (cp & 0x3F); n = 3; }
        else { u[0] = 0xF0 | (cp >> 18); u[1] = 0x80 | ((cp >> 12) & 0x3F); u[2] = 0x80 | ((cp >> 6) & 0x3F); u[3] = 0x80 | (cp & 0x3F); n = 4; }
        if (buf_put(out, u, n) < 0) return -1;
    }
    return 0;
}

/* ---- numbers ------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *a, *b; /* the token */
    int neg, is_int;            /* is_int: no fraction and no exponent */
    uint64_t mant;              /* the digits (integer and fraction) while they fit */
    int ndigits;                /* significant digits in mant (leading zeros skipped) */
    int overflow;               /* more digits than mant holds */
    int exp10;                  /* value = mant * 10^exp10 when !overflow */
} Num;

/* JSON number grammar on [p, e); returns the end or NULL */
static const unsigned char *num_scan(const unsigned char *p, const unsigned char *e, Num *n) {
    n->a = p;
    n->neg = 0;
    n->is_int = 1;
    n->mant = 0;
    n->ndigits = 0;
    n->overflow = 0;
    n->exp10 = 0;
    if (p < e && *p == '-') { n->neg = 1; p++; }
    if (p >= e) return NULL;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < e && *p >= '0' && *p <= '9') {
            if (n->ndigits < 19) { n->mant = n->mant * 10 + (uint64_t)(*p - '0'); n->ndigits++; }
            else { n->overflow = 1; n->exp10++; }
            p++;
        }
    } else {
        return NULL;
    }
    if (p < e && *p == '.') {
        n->is_int = 0;
        p++;
        if (p >= e || !(*p >= '0' && *p <= '9')) return NULL;
        while (p < e && *p >= '0' && *p <= '9') {
            if (n->ndigits < 19) {
                if (n->mant || *p != '0') { n->mant = n->mant * 10 + (uint64_t)(*p - '0'); n->ndigits++; }
                n->exp10--;
            } else {
                n->overflow = 1;
            }
            p++;
        }
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        n->is_int = 0;
        p++;
        int eneg = 0, ev = 0;
        if (p < e && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p >= e || !(*p >= '0' && *p <= '9')) return NULL;
        while (p < e && *p >= '0' && *p <= '9') {
            if (ev < 100000) ev = ev * 10 + (*p - '0');
            p++;
        }
        n->exp10 += eneg ? -ev : ev;
    }
    n->b = p;
    return p;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int num_double(P *s, const Num *n, double *out) {
    if (!n->overflow && n->mant <= (1ULL << 53) && n->exp10 >= -22 && n->exp10 <= 22) {
        /* both operands exact: one correctly rounded operation (Clinger) */
        double m = (double)n->mant;
        double v = n->exp10 >= 0 ? m * POW10[n->exp10] : m / POW10[-n->exp10];
        *out = n->neg ? -v : v;
        return 0;
    }
    char small[64];
    size_t len = (size_t)(n->b - n->a);
    char *tmp = len < sizeof small ? small : malloc(len + 1);
    if (!tmp) { PyErr_NoMemory(); return -1; }
    memcpy(tmp, n->a, len);
    tmp[len] = 0;
    char *endp = NULL;
    double v = PyOS_string_to_double(tmp, &endp, NULL);
    int bad = (v == -1.0 && PyErr_Occurred()) || endp != tmp + len;
    if (tmp != small) free(tmp);
    if (bad) { PyErr_Clear(); return fail(s, "unparsable number"); }
    if (!isfinite(v)) return fail(s, "number out of range");
    *out = v;
    return 0;
}

/* exact int64 of an integer token; a fraction, an exponent or int64 overflow fails */
static int num_int64(P *s, const Num *n, int64_t *out) {
    if (!n->is_int || n->overflow) return fail(s, "integer field holds a non-integer or a huge number");
    if (n->neg) {
        if (n->mant > (uint64_t)INT64_MAX + 1) return fail(s, "integer past int64");
        *out = n->mant == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)n->mant;
    } else {
        if (n->mant > (uint64_t)INT64_MAX) return fail(s, "integer past int64");
        *out = (int64_t)n->mant;
    }
    return 0;
}

/* Python's int(float(text)) of a number token (from a numeric string) where that double is whole; a fraction
 * ("1.5") is handed to the Python reader, which refuses it naming the field (it was truncated to 1) */
static int num_trunc(P *s, const Num *n, int64_t *out) {
    double v;
    if (num_double(s, n, &v) < 0) return -1;
    if (!(v > -9.2e18 && v < 9.2e18)) return fail(s, "number string past int64");
    if (v != trunc(v)) return fail(s, "number string not a whole number");
    *out = (int64_t)v;
    return 0;
}

static const uint64_t POW10_U64[20] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
                                       100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL,
                                       1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
                                       1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
                                       1000000000000000000ULL, 10000000000000000000ULL};

/* Exact int64 ns of a decimal µs token (num_scan's grammar): the digits are read as text,
 * so no double rounds them: the ns are the digits before the ns point (integer digits +
 * exponent + 3), and the digits after it round them, up when above half, or exactly half
 * and the kept value odd (ties to even). Returns 1 (and no value) when the ns are past
 * int64. Up to 19 significant digits (every Kineto time) it is integer arithmetic on
 * num_scan's mant and exp10; longer tokens are read digit by digit. */
static int num_ns(const Num *n, int64_t *out) {
    uint64_t limit = n->neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
    if (!n->overflow) { /* every digit is in mant (value = mant * 10^exp10): integer arithmetic */
        long long q = (long long)n->exp10 + 3;
        uint64_t m = n->mant;
        if (m == 0 || q < -19) { /* under 0.1 ns */
            v = 0;
        } else if (q >= 0) {
            if (q > 19 || m > limit / POW10_U64[q]) return 1;
            v = m * POW10_U64[q];
        } else {
            uint64_t p = POW10_U64[-q], r, half = p / 2;
            v = m / p;
            r = m - v * p;
            if (r > half || (r == half && (v & 1))) v++;
            if (v > limit) return 1;
        }
        *out = n->neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
        return 0;
    }
    /* more digits than mant holds: from the text, digit by digit */
    const unsigned char *p = n->a, *e = n->b;
    int neg = n->neg;
    if (neg) p++;
    const unsigned char *ia = p;
    while (p < e && *p >= '0' && *p <= '9') p++;
    const unsigned char *ib = p, *fa = p, *fb = p;
    if (p < e && *p == '.') {
        fa = ++p;
        while (p < e && *p >= '0' && *p <= '9') p++;
        fb = p;
    }
    long long ex = 0;
    if (p < e && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        for (; p < e && *p >= '0' && *p <= '9'; p++)
            if (ex < 100000000) ex = ex * 10 + (*p - '0'); /* past 1e8 the answer is 0 or out of range anyway */
        if (eneg) ex = -ex;
    }
    long long ni = ib - ia, nd = ni + (fb - fa), k = ni + ex + 3;
#define DIGIT(i) ((i) < ni ? ia[i] - '0' : fa[(i) - ni] - '0')
    for (long long i = 0; i < k; i++) {
        if (i >= nd && v == 0) break; /* only zeros left to append to a zero */
        unsigned d = i < nd ? (unsigned)DIGIT(i) : 0;
        if (v > (limit - d) / 10) return 1;
        v = v * 10 + d;
    }
    if (k >= 0 && k < nd) { /* dropped digits: round to nearest, ties to even */
        unsigned r = (unsigned)DIGIT(k);
        int sticky = 0;
        for (long long i = k + 1; i < nd && !sticky; i++) sticky = DIGIT(i) != 0;
        if (r > 5 || (r == 5 && (sticky || (v & 1)))) {
            if (v == limit) return 1;
            v++;
        }
    } /* k < 0: under 0.1 ns, rounds to 0 */
#undef DIGIT
    *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return 0;
}

/* ---- skipping any value (validating it) ------------------------------------------------ */

static int skip_value(P *s, int depth);

static int skip_container(P *s, int depth, unsigned char close) {
    if (depth > MAX_DEPTH) return fail(s, "nesting too deep");
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == close) { s->p++; return 0; }
    for (;;) {
        if (close == '}') {
            const unsigned char *a, *b;
            int esc;
            if (s->p >= s->end || *s->p != '"') return fail(s, "expected a key");
            if (str_raw(s, &a, &b, &esc) < 0) return -1;
            ws(s);
            if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
            s->p++;
            ws(s);
        }
        if (skip_value(s, depth + 1) < 0) return -1;
        ws(s);
        if (s->p >= s->end) return fail(s, "truncated");
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == close) { s->p++; return 0; }
        return fail(s, "expected ',' or a closing bracket");
    }
}

static int lit(P *s, const char *word, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return fail(s, "invalid literal");
    s->p += n;
    return 0;
}

static int skip_value(P *s, int depth) {
    if (s->p >= s->end) return fail(s, "truncated");
    unsigned char c = *s->p;
    if (c == '"') {
        const unsigned char *a, *b;
        int esc;
        return str_raw(s, &a, &b, &esc);
    }
    if (c == '{') return skip_container(s, depth, '}');
    if (c == '[') return skip_container(s, depth, ']');
    if (c == 't') return lit(s, "true", 4);
    if (c == 'f') return lit(s, "false", 5);
    if (c == 'n') return lit(s, "null", 4);
    Num n;
    const unsigned char *q = num_scan(s->p, s->end, &n);
    if (!q) return fail(s, "invalid value");
    s->p = q;
    return 0;
}

/* ---- one event ----------------------------------------------------------------------- */

/* The "args" fields kept, by their names in the trace (which are also the column names the
 * caller reads): integers, strings, and the grid/block lists. Every kept event gets every
 * column (null where absent); the caller takes those its bucket needs. The integers from
 * N_DENSE on and the strings are rare (sync records, collectives): they are stored
 * sparsely, (row, value) where present, so that events without them cost nothing more. */
enum { I_DEVICE, I_STREAM, I_CORRELATION, I_REGS, I_SMEM, I_BYTES, I_EXTERNAL, N_DENSE = I_EXTERNAL + 1,
       I_WAIT_STREAM = N_DENSE, I_WAIT_EVENT, I_WAIT_RECORD, I_GROUP_SIZE, I_IN_NELEMS, I_OUT_NELEMS, I_SEQ, N_INTS };
static const char *INT_KEYS[N_INTS] = {"device", "stream", "correlation", "registers per thread", "shared memory",
                                       "bytes", "External id", "wait_on_stream", "wait_on_cuda_event_id",
                                       "wait_on_cuda_event_record_corr_id", "Group size", "In msg nelems",
                                       "Out msg nelems", "Seq"};
enum { S_COLLECTIVE, S_PG_NAME, S_PG_RANKS, S_DTYPE, N_STRS };
static const char *STR_KEYS[N_STRS] = {"Collective name", "Process Group Name", "Process Group Ranks", "dtype"};
enum { A_INT, A_STR, A_GRID, A_BLOCK };

/* the wanted args keys by length (a key is compared only with the wanted ones of its
 * length: cpu_op events carry many args nobody reads) */
#define MAX_ARG_KEY 40
#define PER_LEN 4
typedef struct { const char *name; unsigned char kind, idx; } ArgKey;
static ArgKey BY_LEN[MAX_ARG_KEY + 1][PER_LEN];
static int N_BY_LEN[MAX_ARG_KEY + 1];

static int arg_key_add(const char *name, int kind, int idx) {
    size_t n = strlen(name);
    if (n > MAX_ARG_KEY || N_BY_LEN[n] >= PER_LEN) return -1;
    BY_LEN[n][N_BY_LEN[n]++] = (ArgKey){name, (unsigned char)kind, (unsigned char)idx};
    return 0;
}

static int arg_keys_init(void) {
    memset(N_BY_LEN, 0, sizeof N_BY_LEN);
    for (int i = 0; i < N_INTS; i++)
        if (arg_key_add(INT_KEYS[i], A_INT, i) < 0) return -1;
    for (int i = 0; i < N_STRS; i++)
        if (arg_key_add(STR_KEYS[i], A_STR, i) < 0) return -1;
    if (arg_key_add("grid", A_GRID, 0) < 0 || arg_key_add("block", A_BLOCK, 1) < 0) return -1;
    return 0;
}

static const ArgKey *arg_key(const unsigned char *a, const unsigned char *b) {
    size_t n = (size_t)(b - a);
    if (n > MAX_ARG_KEY) return NULL;
    for (int j = 0; j < N_BY_LEN[n]; j++)
        if (memcmp(BY_LEN[n][j].name, a, n) == 0) return &BY_LEN[n][j];
    return NULL;
}

typedef struct {
    const unsigned char *a, *b;
    int esc, present; /* present: a string (not absent, not null) */
} Str;

typedef struct {
    Str ph, cat, name, strs[N_STRS];
    int has_pid, has_tid, has_ts, has_dur, bad_time;
    unsigned char bad_args; /* the first byte of a non-object "args" value (0: an object or absent) */
    int64_t pid, tid;
    int64_t ts, dur; /* ns */
    int has_int[N_INTS];
    int64_t ints[N_INTS];
    int dims_n[2]; /* grid, block: -1 absent or null, else the list length (kept up to 3) */
    int64_t dims[2][3];
} Ev;

static inline int key_is(const unsigned char *a, const unsigned char *b, const char *k, size_t n) {
    return (size_t)(b - a) == n && memcmp(a, k, n) == 0;
}

/* a string-or-null field */
static int get_str(P *s, Str *out) {
    ws(s);
    if (s->p < s->end && *s->p == '"') {
        out->present = 1;
        return str_raw(s, &out->a, &out->b, &out->esc);
    }
    if (s->p < s->end && *s->p == 'n') { out->present = 0; return lit(s, "null", 4); }
    return fail(s, "a string field holds another type");
}

/* What a number field holds: null, a number, or a string (plain: its whole text, without
 * escapes, is a JSON number). For a number or a plain string, *n is the number's token; for
 * any string, [*a, *b) is its raw text. */
enum { F_NULL, F_NUMBER, F_STRING };

static int num_field(P *s, int *kind, Num *n, int *plain, const unsigned char **a, const unsigned char **b) {
    if (s->p >= s->end) return fail(s, "truncated");
    *plain = 0;
    if (*s->p == 'n') { *kind = F_NULL; return lit(s, "null", 4); }
    if (*s->p == '"') {
        int esc;
        if (str_raw(s, a, b, &esc) < 0) return -1;
        *kind = F_STRING;
        *plain = !esc && *a != *b && num_scan(*a, *b, n) == *b;
        return 0;
    }
    const unsigned char *q = num_scan(s->p, s->end, n);
    if (!q) return fail(s, "a number field holds another type");
    s->p = q;
    *kind = F_NUMBER;
    return 0;
}

/* ts, dur: decimal µs (a number or a plain numeric string) as exact int64 ns. Any other
 * value (true, an unusual string, a list) or a time past int64 ns sets *bad: the Python
 * reader judges it, but only if the event turns out to be kept. */
static int get_ns(P *s, int *has, int64_t *out, int *bad) {
    int kind, plain;
    Num n;
    const unsigned char *a, *b;
    if (s->p < s->end && (*s->p == 't' || *s->p == 'f' || *s->p == '[' || *s->p == '{')) {
        *has = *bad = 1;
        return skip_value(s, 1);
    }
    if (num_field(s, &kind, &n, &plain, &a, &b) < 0) return -1;
    *has = kind != F_NULL;
    if (kind == F_NULL) return 0;
    if ((kind == F_STRING && !plain) || num_ns(&n, out)) *bad = 1;
    return 0;
}

/* an integer field: exact int64; a numeric string as int(float(s)) */
static int get_int(P *s, int *has, int64_t *out) {
    int kind, plain;
    Num n;
    const unsigned char *a, *b;
    if (num_field(s, &kind, &n, &plain, &a, &b) < 0) return -1;
    *has = kind != F_NULL;
    if (kind == F_NULL) return 0;
    if (kind == F_NUMBER) return num_int64(s, &n, out);
    return plain ? num_trunc(s, &n, out) : fail(s, "number written as an unusual string");
}

/* pid / tid: like get_int, but a string that is not a number is null (Kineto's "Spans" lanes) */
static int get_id(P *s, int *has, int64_t *out) {
    int kind, plain;
    Num n;
    const unsigned char *a, *b;
    if (num_field(s, &kind, &n, &plain, &a, &b) < 0) return -1;
    *has = kind == F_NUMBER || (kind == F_STRING && plain);
    if (kind == F_NULL) return 0;
    if (kind == F_NUMBER) return num_int64(s, &n, out);
    if (plain) return num_trunc(s, &n, out);
    /* float() reads digits (with spaces, underscores), inf, infinity and nan: those the
     * Python reader judges; any other string is a label and the id is null */
    for (const unsigned char *q = a; q < b; q++)
        if ((*q >= '0' && *q <= '9') || *q == '\\' || *q >= 0x80)
            return fail(s, "pid/tid string the Python reader must judge");
    const unsigned char *x = a, *y = b;
    while (x < y && (*x == ' ' || *x == '\t' || *x == '\n' || *x == '\r' || *x == '\f' || *x == '\v')) x++;
    while (y > x && (y[-1] == ' ' || y[-1] == '\t' || y[-1] == '\n' || y[-1] == '\r' || y[-1] == '\f' || y[-1] == '\v')) y--;
    if (x < y && (*x == '+' || *x == '-')) x++;
    size_t len = (size_t)(y - x);
    if ((len == 3 && (strncasecmp((const char *)x, "inf", 3) == 0 || strncasecmp((const char *)x, "nan", 3) == 0))
        || (len == 8 && strncasecmp((const char *)x, "infinity", 8) == 0))
        return fail(s, "pid/tid string the Python reader must judge");
    return 0;
}

static int get_dims(P *s, int *count, int64_t vals[3]) {
    if (s->p >= s->end) return fail(s, "truncated");
    if (*s->p == 'n') { *count = -1; return lit(s, "null", 4); }
    if (*s->p != '[') return fail(s, "grid/block is not a list");
    s->p++;
    ws(s);
    int n = 0;
    if (s->p < s->end && *s->p == ']') { s->p++; *count = 0; return 0; }
    for (;;) {
        Num num;
        int64_t v;
        const unsigned char *q = num_scan(s->p, s->end, &num);
        if (!q) return fail(s, "grid/block holds a non-number");
        s->p = q;
        if (num_int64(s, &num, &v) < 0) return -1;
        if (n < 3) vals[n] = v;
        n++;
        ws(s);
        if (s->p >= s->end) return fail(s, "truncated");
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == ']') { s->p++; break; }
        return fail(s, "expected ',' or ']'");
    }
    *count = n > 3 ? 3 : n; /* only the first three are read (x, y, z) */
    return 0;
}

/* compares an object key with the wanted ones; keys with escapes are unescaped first */
typedef struct {
    const unsigned char *a, *b;
    Buf tmp;
} Key;

static int key_read(P *s, Key *k) {
    int esc;
    if (s->p >= s->end || *s->p != '"') return fail(s, "expected a key");
    if (str_raw(s, &k->a, &k->b, &esc) < 0) return -1;
    if (esc) {
        k->tmp.len = 0;
        if (unescape_into(s, &k->tmp, k->a, k->b) < 0) return -1;
        k->a = (const unsigned char *)k->tmp.data;
        k->b = k->a + k->tmp.len;
    }
    ws(s);
    if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
    s->p++;
    ws(s);
    return 0;
}

static int parse_args(P *s, Ev *ev, Key *k) {
    if (s->p >= s->end) return fail(s, "truncated");
    if (*s->p != '{') return fail(s, "args is not an object");
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 0; }
    for (;;) {
        if (key_read(s, k) < 0) return -1;
        const ArgKey *key = arg_key(k->a, k->b);
        int r;
        if (!key) r = skip_value(s, 2);
        else if (key->kind == A_INT) r = get_int(s, &ev->has_int[key->idx], &ev->ints[key->idx]);
        else if (key->kind == A_STR) r = get_str(s, &ev->strs[key->idx]);
        else r = get_dims(s, &ev->dims_n[key->idx], ev->dims[key->idx]);
        if (r < 0) return -1;
        ws(s);
        if (s->p >= s->end) return fail(s, "truncated");
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == '}') { s->p++; return 0; }
        return fail(s, "expected ',' or '}'");
    }
}

/* the category index of a cat string, -1 when not kept (escaped names are the Python reader's) */
typedef struct {
    int n;
    const char *name[64];
    Py_ssize_t len[64];
    int bucket[64];
} Cats;

static int cat_index(const Cats *cats, const Str *c) {
    if (!c->present) return -1;
    Py_ssize_t n = c->b - c->a;
    for (int i = 0; i < cats->n; i++)
        if (cats->len[i] == n && memcmp(cats->name[i], c->a, (size_t)n) == 0) return i;
    return -1;
}

static int is_complete(const Str *ph) {
    return !ph->present || (ph->b - ph->a == 1 && ph->a[0] == 'X');
}

/* one event; *ci is its category index, -1 when it is not kept. Once the event is known
 * not to be kept (its cat is not wanted or it is not complete), the rest of its values
 * are only validated as JSON: the Python reader ignores such events too. */
static int parse_event(P *s, Ev *ev, Key *k, const Cats *cats, int *ci) {
    int skipping = 0, seen_cat = 0, seen_ph = 0;
    memset(ev, 0, sizeof *ev);
    ev->dims_n[0] = ev->dims_n[1] = -1;
    *ci = -1;
    if (s->p >= s->end || *s->p != '{') return fail(s, "an event is not an object");
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 0; }
    for (;;) {
        if (key_read(s, k) < 0) return -1;
        const unsigned char *a = k->a, *b = k->b;
        size_t n = (size_t)(b - a);
        int r;
        int is_ph = n == 2 && a[0] == 'p' && a[1] == 'h', is_cat = n == 3 && memcmp(a, "cat", 3) == 0;
        /* a key given twice: Python's dict keeps the last value, this parser may have
         * stopped looking at the first; the Python reader decides */
        if ((is_ph && seen_ph++) || (is_cat && seen_cat)) return fail(s, "ph or cat given twice");
        if (skipping) r = skip_value(s, 1);
        else if (is_ph) {
            r = get_str(s, &ev->ph);
            if (r == 0 && !is_complete(&ev->ph)) skipping = 1;
        } else if (is_cat) {
            r = get_str(s, &ev->cat);
            if (r == 0 && ev->cat.esc) return fail(s, "category with escapes");
            if (r == 0) {
                *ci = cat_index(cats, &ev->cat);
                seen_cat = 1;
                if (*ci < 0) skipping = 1;
            }
        }
        else if (n == 4 && memcmp(a, "name", 4) == 0) r = get_str(s, &ev->name);
        else if (n == 3 && memcmp(a, "pid", 3) == 0) r = get_id(s, &ev->has_pid, &ev->pid);
        else if (n == 3 && memcmp(a, "tid", 3) == 0) r = get_id(s, &ev->has_tid, &ev->tid);
        else if (n == 2 && a[0] == 't' && a[1] == 's') r = get_ns(s, &ev->has_ts, &ev->ts, &ev->bad_time);
        else if (n == 3 && memcmp(a, "dur", 3) == 0) r = get_ns(s, &ev->has_dur, &ev->dur, &ev->bad_time);
        else if (n == 4 && memcmp(a, "args", 4) == 0) {
            memset(ev->has_int, 0, sizeof ev->has_int);
            ev->dims_n[0] = ev->dims_n[1] = -1;
            for (int i = 0; i < N_STRS; i++) ev->strs[i].present = 0;
            /* not an object: malformed if the event is kept (known at its end), else ignored */
            ev->bad_args = s->p < s->end && *s->p != '{' ? *s->p : 0;
            r = ev->bad_args ? skip_value(s, 1) : parse_args(s, ev, k);
        } else r = skip_value(s, 1);
        if (r < 0) return -1;
        ws(s);
        if (s->p >= s->end) return fail(s, "truncated");
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == '}') {
            s->p++;
            if (skipping || !seen_cat || !is_complete(&ev->ph)) *ci = -1;
            if (*ci >= 0 && ev->bad_args) return 0; /* the caller notes it; its times do not matter */
            if (*ci >= 0 && ev->bad_time) return fail(s, "a time the Python reader must judge (not a number, or past int64 ns)");
            return 0;
        }
        return fail(s, "expected ',' or '}'");
    }
}

/* ---- output columns, one set per bucket ---------------------------------------------------- */

typedef struct {
    Py_ssize_t n;
    Buf cat;                                         /* int8 category index */
    Buf name_off, name_data, name_valid;             /* int64 offsets (n + 1), utf-8, uint8 */
    Buf pid, pid_valid, tid, tid_valid;              /* int64, uint8 */
    Buf ts, ts_valid, dur, dur_valid;                /* int64 ns, uint8 */
    Buf ints[N_DENSE], ints_valid[N_DENSE];
    Buf sp_rows[N_INTS - N_DENSE], sp_vals[N_INTS - N_DENSE]; /* sparse: int64 row, int64 value */
    Buf strs_rows[N_STRS], strs_off[N_STRS], strs_data[N_STRS]; /* sparse: int64 row, int64 offsets (k + 1), utf-8 */
    Buf dims_off[2], dims_vals[2], dims_valid[2];    /* int32 offsets (n + 1), int64, uint8 */
} Cols;

static void cols_free(Cols *c) {
    Buf *all[] = {&c->cat, &c->name_off, &c->name_data, &c->name_valid, &c->pid, &c->pid_valid, &c->tid,
                  &c->tid_valid, &c->ts, &c->ts_valid, &c->dur, &c->dur_valid};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
    for (int i = 0; i < N_STRS; i++) { buf_free(&c->strs_rows[i]); buf_free(&c->strs_off[i]); buf_free(&c->strs_data[i]); }
    for (int i = 0; i < N_DENSE; i++) { buf_free(&c->ints[i]); buf_free(&c->ints_valid[i]); }
    for (int i = 0; i < N_INTS - N_DENSE; i++) { buf_free(&c->sp_rows[i]); buf_free(&c->sp_vals[i]); }
    for (int i = 0; i < 2; i++) { buf_free(&c->dims_off[i]); buf_free(&c->dims_vals[i]); buf_free(&c->dims_valid[i]); }
}

static int cols_init(Cols *c) {
    memset(c, 0, sizeof *c);
    int64_t zero = 0;
    int32_t zero32 = 0;
    if (buf_put(&c->name_off, &zero, 8) < 0) return -1;
    for (int i = 0; i < N_STRS; i++)
        if (buf_put(&c->strs_off[i], &zero, 8) < 0) return -1;
    for (int i = 0; i < 2; i++)
        if (buf_put(&c->dims_off[i], &zero32, 4) < 0) return -1;
    return 0;
}

/* a string's UTF-8 and its end offset */
static int put_text(P *s, Buf *off, Buf *data, const Str *v) {
    if (v->present) {
        if (v->esc) {
            if (unescape_into(s, data, v->a, v->b) < 0) return -1;
        } else if (buf_put(data, v->a, (size_t)(v->b - v->a)) < 0) {
            return -1;
        }
    }
    int64_t end = (int64_t)data->len;
    return buf_put(off, &end, 8);
}

static int put_str(P *s, Buf *off, Buf *data, Buf *valid, const Str *v) {
    uint8_t ok = (uint8_t)v->present;
    return (put_text(s, off, data, v) < 0 || buf_put(valid, &ok, 1) < 0) ? -1 : 0;
}

/* one 8-byte value and its validity byte, stored directly (the common case: room left) */
static inline int put8(Buf *vals, Buf *valid, int has, const void *v) {
    if ((vals->len + 8 > vals->cap && buf_grow(vals, 8) < 0) || (valid->len + 1 > valid->cap && buf_grow(valid, 1) < 0))
        return -1;
    if (has) memcpy(vals->data + vals->len, v, 8);
    else memset(vals->data + vals->len, 0, 8);
    vals->len += 8;
    valid->data[valid->len++] = (char)(has != 0);
    return 0;
}

static inline int put_i64(Buf *vals, Buf *valid, int has, int64_t v) { return put8(vals, valid, has, &v); }

static int emit(P *s, Cols *c, const Ev *ev, int8_t cat) {
    if (buf_put(&c->cat, &cat, 1) < 0) return -1;
    if (put_str(s, &c->name_off, &c->name_data, &c->name_valid, &ev->name) < 0) return -1;
    if (put_i64(&c->pid, &c->pid_valid, ev->has_pid, ev->pid) < 0) return -1;
    if (put_i64(&c->tid, &c->tid_valid, ev->has_tid, ev->tid) < 0) return -1;
    if (put_i64(&c->ts, &c->ts_valid, ev->has_ts, ev->ts) < 0) return -1;
    if (put_i64(&c->dur, &c->dur_valid, ev->has_dur, ev->dur) < 0) return -1;
    for (int i = 0; i < N_DENSE; i++)
        if (put_i64(&c->ints[i], &c->ints_valid[i], ev->has_int[i], ev->ints[i]) < 0) return -1;
    int64_t row = (int64_t)c->n;
    for (int i = N_DENSE; i < N_INTS; i++)
        if (ev->has_int[i] && (buf_put(&c->sp_rows[i - N_DENSE], &row, 8) < 0 || buf_put(&c->sp_vals[i - N_DENSE], &ev->ints[i], 8) < 0))
            return -1;
    for (int i = 0; i < N_STRS; i++)
        if (ev->strs[i].present && (buf_put(&c->strs_rows[i], &row, 8) < 0 || put_text(s, &c->strs_off[i], &c->strs_data[i], &ev->strs[i]) < 0))
            return -1;
    for (int d = 0; d < 2; d++) {
        int n = ev->dims_n[d];
        uint8_t ok = n >= 0;
        for (int i = 0; i < n; i++)
            if (buf_put(&c->dims_vals[d], &ev->dims[d][i], 8) < 0) return -1;
        int32_t end = (int32_t)(c->dims_vals[d].len / 8);
        if (c->dims_vals[d].len / 8 > INT32_MAX) return fail(s, "too many grid values");
        if (buf_put(&c->dims_off[d], &end, 4) < 0 || buf_put(&c->dims_valid[d], &ok, 1) < 0) return -1;
    }
    c->n++;
    return 0;
}

static int set_item(PyObject *d, const char *key, PyObject *v) {
    if (!v) return -1;
    int r = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return r;
}

static PyObject *cols_dict(Cols *c) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    char key[64];
    int bad = set_item(d, "n", PyLong_FromSsize_t(c->n)) || set_item(d, "cat", buf_bytes(&c->cat))
        || set_item(d, "name_off", buf_bytes(&c->name_off)) || set_item(d, "name_data", buf_bytes(&c->name_data))
        || set_item(d, "name_valid", buf_bytes(&c->name_valid)) || set_item(d, "pid", buf_bytes(&c->pid)) || set_item(d, "pid_valid", buf_bytes(&c->pid_valid))
        || set_item(d, "tid", buf_bytes(&c->tid)) || set_item(d, "tid_valid", buf_bytes(&c->tid_valid))
        || set_item(d, "ts", buf_bytes(&c->ts)) || set_item(d, "ts_valid", buf_bytes(&c->ts_valid))
        || set_item(d, "dur", buf_bytes(&c->dur)) || set_item(d, "dur_valid", buf_bytes(&c->dur_valid));
    for (int i = 0; !bad && i < N_DENSE; i++) {
        snprintf(key, sizeof key, "%s", INT_KEYS[i]);
        bad = set_item(d, key, buf_bytes(&c->ints[i]));
        snprintf(key, sizeof key, "%s_valid", INT_KEYS[i]);
        bad = bad || set_item(d, key, buf_bytes(&c->ints_valid[i]));
    }
    for (int i = N_DENSE; !bad && i < N_INTS; i++) { /* sparse: "<key>_rows" marks them */
        snprintf(key, sizeof key, "%s", INT_KEYS[i]);
        bad = set_item(d, key, buf_bytes(&c->sp_vals[i - N_DENSE]));
        snprintf(key, sizeof key, "%s_rows", INT_KEYS[i]);
        bad = bad || set_item(d, key, buf_bytes(&c->sp_rows[i - N_DENSE]));
    }
    for (int i = 0; !bad && i < N_STRS; i++) {
        snprintf(key, sizeof key, "%s_rows", STR_KEYS[i]);
        bad = set_item(d, key, buf_bytes(&c->strs_rows[i]));
        snprintf(key, sizeof key, "%s_off", STR_KEYS[i]);
        bad = bad || set_item(d, key, buf_bytes(&c->strs_off[i]));
        snprintf(key, sizeof key, "%s_data", STR_KEYS[i]);
        bad = bad || set_item(d, key, buf_bytes(&c->strs_data[i]));
    }
    const char *dims[2] = {"grid", "block"};
    for (int i = 0; !bad && i < 2; i++) {
        snprintf(key, sizeof key, "%s_off", dims[i]);
        bad = set_item(d, key, buf_bytes(&c->dims_off[i]));
        snprintf(key, sizeof key, "%s_vals", dims[i]);
        bad = bad || set_item(d, key, buf_bytes(&c->dims_vals[i]));
        snprintf(key, sizeof key, "%s_valid", dims[i]);
        bad = bad || set_item(d, key, buf_bytes(&c->dims_valid[i]));
    }
    if (bad) { Py_DECREF(d); return NULL; }
    return d;
}

/* ---- the document ---------------------------------------------------------------------- */

#define MAX_CATS 64
#define MAX_BUCKETS 4

/* the first kept event whose "args" is not an object (index -1: none) */
typedef struct {
    Py_ssize_t index;
    int bucket;
    Str name;
    unsigned char kind;
} BadEv;

static int parse_events(P *s, const Cats *cats, Cols *cols, Py_ssize_t *n_events, Key *k, BadEv *bad) {
    Ev ev;
    s->p++; /* '[' */
    ws(s);
    if (s->p < s->end && *s->p == ']') { s->p++; return 0; }
    for (;;) {
        int ci;
        if (parse_event(s, &ev, k, cats, &ci) < 0) return -1;
        if (ci >= 0 && ev.bad_args) {
            if (bad->index < 0) *bad = (BadEv){*n_events, cats->bucket[ci], ev.name, ev.bad_args};
        } else if (ci >= 0) {
            if (emit(s, &cols[cats->bucket[ci]], &ev, (int8_t)ci) < 0) return -1;
        }
        (*n_events)++;
        ws(s);
        if (s->p >= s->end) return fail(s, "truncated");
        if (*s->p == ',') { s->p++; ws(s); continue; }
        if (*s->p == ']') { s->p++; return 0; }
        return fail(s, "expected ',' or ']'");
    }
}

PyDoc_STRVAR(scan_doc,
"scan(buf, categories, meta_keys) -> dict\n\n"
"Parse a Kineto Chrome trace (JSON bytes, not gzipped). categories: a sequence of\n"
"(cat bytes, bucket int) pairs; the complete events of those categories come back as\n"
"column buffers per bucket ('buckets': a list of dicts, see Cols in _kineto.c), with\n"
"'n_events' (all events), 'top_list' (the document is a bare event list) and 'meta':\n"
"{key: (start, end)} byte ranges of the meta_keys values present at the top level.\n"
"Raises Unsupported for anything the Python reader must handle instead, and\n"
"BadArgs((index, bucket, name, first byte)) for the first kept event whose args is\n"
"not an object.");

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *cat_seq, *meta_seq;
    if (!PyArg_ParseTuple(args, "y*OO", &view, &cat_seq, &meta_seq)) return NULL;
    PyObject *result = NULL, *meta = NULL, *buckets = NULL;
    Cats cats;
    Cols cols[MAX_BUCKETS];
    int nb = 0, ncols = 0;
    Key key = {0};
    P s = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len, NULL};
    Py_ssize_t n_events = 0;
    BadEv bad = {-1, 0, {0}, 0};
    int top_list = 0, have_events = 0;

    /* categories */
    PyObject *cseq = PySequence_Fast(cat_seq, "categories must be a sequence");
    if (!cseq) goto done;
    cats.n = (int)PySequence_Fast_GET_SIZE(cseq);
    if (cats.n > MAX_CATS) { PyErr_SetString(PyExc_ValueError, "too many categories"); Py_DECREF(cseq); goto done; }
    for (int i = 0; i < cats.n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(cseq, i);
        char *name;
        Py_ssize_t len;
        int bucket;
        if (!PyArg_ParseTuple(pair, "y#i", &name, &len, &bucket)) { Py_DECREF(cseq); goto done; }
        if (bucket < 0 || bucket >= MAX_BUCKETS) { PyErr_SetString(PyExc_ValueError, "bad bucket"); Py_DECREF(cseq); goto done; }
        cats.name[i] = name; /* owned by cat_seq, alive for the call */
        cats.len[i] = len;
        cats.bucket[i] = bucket;
        if (bucket + 1 > nb) nb = bucket + 1;
    }
    for (; ncols < nb; ncols++)
        if (cols_init(&cols[ncols]) < 0) { ncols++; Py_DECREF(cseq); goto done; }
    meta = PyDict_New();
    if (!meta) { Py_DECREF(cseq); goto done; }

    ws(&s);
    if (s.p < s.end && *s.p == '[') {
        top_list = 1;
        have_events = 1;
        if (parse_events(&s, &cats, cols, &n_events, &key, &bad) < 0) { Py_DECREF(cseq); goto fail_or_error; }
    } else if (s.p < s.end && *s.p == '{') {
        s.p++;
        ws(&s);
        if (s.p < s.end && *s.p == '}') {
            s.p++;
        } else {
            for (;;) {
                if (key_read(&s, &key) < 0) { Py_DECREF(cseq); goto fail_or_error; }
                if (key_is(key.a, key.b, "traceEvents", 11)) {
                    if (s.p >= s.end || *s.p != '[') { fail(&s, "traceEvents is not a list"); Py_DECREF(cseq); goto fail_or_error; }
                    if (have_events) { fail(&s, "two traceEvents keys"); Py_DECREF(cseq); goto fail_or_error; }
                    have_events = 1;
                    if (parse_events(&s, &cats, cols, &n_events, &key, &bad) < 0) { Py_DECREF(cseq); goto fail_or_error; }
                } else {
                    const unsigned char *start = s.p;
                    PyObject *name = PyUnicode_DecodeUTF8((const char *)key.a, key.b - key.a, "strict");
                    if (!name) { PyErr_Clear(); fail(&s, "key is not UTF-8"); Py_DECREF(cseq); goto fail_or_error; }
                    int wanted = PySequence_Contains(meta_seq, name);
                    if (wanted < 0) { Py_DECREF(name); Py_DECREF(cseq); goto done; }
                    if (skip_value(&s, 1) < 0) { Py_DECREF(name); Py_DECREF(cseq); goto fail_or_error; }
                    if (wanted) {
                        PyObject *span = Py_BuildValue("(nn)", (Py_ssize_t)(start - (const unsigned char *)view.buf),
                                                       (Py_ssize_t)(s.p - (const unsigned char *)view.buf));
                        if (!span || PyDict_SetItem(meta, name, span) < 0) { Py_XDECREF(span); Py_DECREF(name); Py_DECREF(cseq); goto done; }
                        Py_DECREF(span);
                    }
                    Py_DECREF(name);
                }
                ws(&s);
                if (s.p >= s.end) { fail(&s, "truncated"); Py_DECREF(cseq); goto fail_or_error; }
                if (*s.p == ',') { s.p++; ws(&s); continue; }
                if (*s.p == '}') { s.p++; break; }
                fail(&s, "expected ',' or '}'");
                Py_DECREF(cseq);
                goto fail_or_error;
            }
        }
    } else {
        fail(&s, "not a JSON object or list");
        Py_DECREF(cseq);
        goto fail_or_error;
    }
    Py_DECREF(cseq);
    ws(&s);
    if (s.p != s.end) { fail(&s, "data after the document"); goto fail_or_error; }
    if (!have_events) { fail(&s, "no traceEvents list"); goto fail_or_error; }
    if (bad.index >= 0) { /* the document is sound but for this event: say which */
        PyObject *name = Py_None;
        Py_INCREF(name);
        if (bad.name.present) {
            key.tmp.len = 0;
            if (unescape_into(&s, &key.tmp, bad.name.a, bad.name.b) < 0) { Py_DECREF(name); goto fail_or_error; }
            Py_DECREF(name);
            name = PyUnicode_DecodeUTF8(key.tmp.data ? key.tmp.data : "", (Py_ssize_t)key.tmp.len, "strict");
            if (!name) goto done;
        }
        PyObject *exc = Py_BuildValue("(niNC)", bad.index, bad.bucket, name, (int)bad.kind);
        if (exc) { PyErr_SetObject(BadArgs, exc); Py_DECREF(exc); }
        goto done;
    }

    buckets = PyList_New(nb);
    if (!buckets) goto done;
    for (int i = 0; i < nb; i++) {
        PyObject *d = cols_dict(&cols[i]);
        if (!d) goto done;
        PyList_SET_ITEM(buckets, i, d);
    }
    result = Py_BuildValue("{s:O,s:n,s:O,s:O}", "buckets", buckets, "n_events", n_events, "top_list",
                           top_list ? Py_True : Py_False, "meta", meta);
    goto done;

fail_or_error:
    if (!PyErr_Occurred())
        PyErr_Format(Unsupported, "%s at byte %zd", s.why ? s.why : "unsupported",
                     (Py_ssize_t)(s.p - (const unsigned char *)view.buf));
done:
    for (int i = 0; i < ncols; i++) cols_free(&cols[i]);
    buf_free(&key.tmp);
    Py_XDECREF(buckets);
    Py_XDECREF(meta);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kineto",
                                    "Kineto trace JSON -> column buffers (see overlapviz/ingest/chrome_columns.py).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kineto(void) {
    if (arg_keys_init() < 0) {
        PyErr_SetString(PyExc_SystemError, "_kineto: args key table too small");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Unsupported = PyErr_NewException("overlapviz.ingest._kineto.Unsupported", PyExc_ValueError, NULL);
    if (!Unsupported || PyModule_AddObject(m, "Unsupported", Unsupported) < 0) {
        Py_XDECREF(Unsupported);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(Unsupported);
    BadArgs = PyErr_NewException("overlapviz.ingest._kineto.BadArgs", PyExc_ValueError, NULL);
    if (!BadArgs || PyModule_AddObject(m, "BadArgs", BadArgs) < 0) {
        Py_XDECREF(BadArgs);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(BadArgs);
    return m;
}
