/*
 * Native scanner of NCCL debug log text (ingest/nccl_log.py, docs/formats.md section 3).
 *
 * Input: whole lines of the log (a chunk as the parser reads it). In one pass, with the GIL
 * released, it counts the non-empty lines, copies out the lines of the rare kinds (inits,
 * transports, TUNING, WARN, version: every non-COLL line holding " NCCL INFO ", "NCCL WARN"
 * or "NCCL version"), which the polars path then reads as before, and turns every COLL line
 * (any line holding " opCount ") into typed columns: what ``nccl_log.coll_rows`` gives.
 *
 * It only takes the COLL lines it is sure of: ASCII, the shape ``coll_rows`` cuts (launcher
 * prefix, ``[timestamp]``, ``host:pid:tid [dev] NCCL INFO <op>: opCount <hex> sendbuff ..
 * recvbuff .. count .. datatype .. op .. root .. comm 0x.. [[nranks=N]] stream 0x..``),
 * numbers that fit, a timestamp of a real date and time. At the first COLL line it is not
 * sure of (damaged, Unicode, out of range), it stops and says so: the caller then reads the
 * whole chunk with the polars path, which decides what such lines give. So both paths give
 * the same rows by construction on everything this scanner does not take.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------
 * Growable arrays and interned strings
 * ------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int buf_put(Buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    return 0;
}

typedef struct {
    const char *p;
    size_t n;
} Str;

/* Distinct strings of one column, in order of first sight; each row holds its string's index. */
typedef struct {
    Str *keys;
    size_t n, cap;
    int32_t *slots; /* index + 1, 0: free */
    size_t nslots;
} Intern;

static uint64_t hash_of(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static int32_t intern(Intern *t, const char *p, size_t n) {
    if (t->n * 2 >= t->nslots) {
        size_t nslots = t->nslots ? t->nslots * 2 : 64;
        int32_t *slots = calloc(nslots, sizeof *slots);
        if (slots == NULL) return -1;
        for (size_t k = 0; k < t->n; k++) {
            size_t i = hash_of(t->keys[k].p, t->keys[k].n) & (nslots - 1);
            while (slots[i]) i = (i + 1) & (nslots - 1);
            slots[i] = (int32_t)k + 1;
        }
        free(t->slots);
        t->slots = slots;
        t->nslots = nslots;
    }
    size_t i = hash_of(p, n) & (t->nslots - 1);
    while (t->slots[i]) {
        Str *key = &t->keys[t->slots[i] - 1];
        if (key->n == n && memcmp(key->p, p, n) == 0) return t->slots[i] - 1;
        i = (i + 1) & (t->nslots - 1);
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        Str *keys = realloc(t->keys, cap * sizeof *keys);
        if (keys == NULL) return -1;
        t->keys = keys;
        t->cap = cap;
    }
    t->keys[t->n] = (Str){p, n};
    t->slots[i] = (int32_t)t->n + 1;
    return (int32_t)t->n++;
}

/* ---------------------------------------------------------------------------
 * The columns of COLL rows
 * ------------------------------------------------------------------------- */

enum { C_TS, C_PID, C_SEQ, C_COUNT, C_SIZE, C_STREAM, N_I64 };
enum { C_ROOT, C_NRANKS, N_I32 };
enum { S_HOST, S_COMM, S_OP, S_DTYPE, N_STR };
static const char *I64_NAMES[N_I64] = {"ts_ns", "pid", "seq", "count", "size", "stream"};
static const char *I32_NAMES[N_I32] = {"root", "nranks"};
static const char *STR_NAMES[N_STR] = {"host", "comm", "op", "dtype"};

enum { V_TS, V_SIZE, V_ROOT, V_NRANKS, N_VALID };

/* A column's values, written in place into a bytes object made (with the GIL) before the scan, as long as the
 * most rows the text can hold: no copy on growth, none when it is handed to Python. */
typedef struct {
    PyObject *bytes;
    char *p;
} Out;

typedef struct {
    size_t rows, cap;
    Out i64[N_I64], i32[N_I32], idx[N_STR];
    Out valid[N_VALID]; /* Arrow validity bitmaps: bit i of byte i/8, least significant first */
    size_t nulls[N_VALID];
    Intern strings[N_STR];
    Buf rare;          /* the rare kinds' lines, each ending in "\n" */
    int64_t lines;     /* non-empty lines */
    int unsure;        /* a COLL line this scanner does not take: the chunk goes to the polars path */
    int nomem;
} Scan;

/* docs/formats.md (NCCL debug log): datatype codes (as nccl_log.DTYPE). */
static const char *DTYPE_NAMES[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                    "float64", "bfloat16", "float8e4m3", "float8e5m2"};
static const int64_t DTYPE_BYTES[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const size_t DTYPE_LENGTHS[] = {4, 5, 5, 6, 5, 6, 7, 7, 7, 8, 10, 10};
#define N_DTYPES ((int64_t)(sizeof DTYPE_BYTES / sizeof DTYPE_BYTES[0]))

/* A COLL line's fields, before they are appended. */
typedef struct {
    int has_ts;
    int64_t ts_ns, pid, seq, count, dtype_code, root, nranks, stream;
    int has_nranks;
    Str host, comm, op, dtype_digits;
} Fields;

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }
static inline int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }
static inline int is_word(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static inline int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* ``\d+`` at ``*p`` (before ``end``): its value, at most ``max_digits`` digits (more: -1, not sure). */
static int digits(const char **p, const char *end, int max_digits, int64_t *value) {
    const char *q = *p;
    int64_t v = 0;
    while (q < end && is_digit(*q)) {
        if (q - *p >= max_digits) return -1;
        v = v * 10 + (*q - '0');
        q++;
    }
    if (q == *p) return -1;
    *p = q;
    *value = v;
    return 0;
}

/* ``[0-9a-f]+`` at ``*p``, at most 15 digits (the value fits in 60 bits). */
static int hex(const char **p, const char *end, int64_t *value) {
    const char *q = *p;
    int64_t v = 0;
    while (q < end && is_hex(*q)) {
        if (q - *p >= 15) return -1;
        v = v * 16 + (is_digit(*q) ? *q - '0' : *q - 'a' + 10);
        q++;
    }
    if (q == *p) return -1;
    *p = q;
    *value = v;
    return 0;
}

/* The first ``needle`` (``n`` bytes) in ``hay``: memchr for its byte at ``key`` (one rarely seen in a log), then a
 * compare. For needles this short, cheaper than memmem, which prepares every search afresh. */
static inline const char *find(const char *hay, size_t len, const char *needle, size_t n, size_t key) {
    if (len < n) return NULL;
    const char *end = hay + len, *p = hay + key;
    while (p < end - (n - 1 - key)) {
        p = memchr(p, needle[key], (size_t)(end - (n - 1 - key) - p));
        if (p == NULL) return NULL;
        if (memcmp(p - key, needle, n) == 0) return p - key;
        p++;
    }
    return NULL;
}

static int literal(const char **p, const char *end, const char *text, size_t n) {
    if ((size_t)(end - *p) < n || memcmp(*p, text, n) != 0) return -1;
    *p += n;
    return 0;
}

static int fixed(const char *p, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit(p[i])) return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* ``_TS_FIND`` (``\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?\]``) at ``p``: the position of its ``]``. */
static const char *timestamp_at(const char *p, const char *end) {
    if (end - p < 21 || p[0] != '[' || fixed(p + 1, 4) < 0 || p[5] != '-' || fixed(p + 6, 2) < 0 || p[8] != '-'
        || fixed(p + 9, 2) < 0 || (p[11] != ' ' && p[11] != 'T') || fixed(p + 12, 2) < 0 || p[14] != ':'
        || fixed(p + 15, 2) < 0 || p[17] != ':' || fixed(p + 18, 2) < 0)
        return NULL;
    const char *q = p + 20;
    if (*q == ']') return q;
    if (*q != '.') return NULL;
    const char *f = ++q;
    while (q < end && is_digit(*q)) q++;
    return q > f && q < end && *q == ']' ? q : NULL;
}

/* The timestamp ``[`` at ``p`` .. ``close`` as epoch nanoseconds; -1: not a date polars surely reads the same. */
static int timestamp_ns(const char *p, const char *close, int64_t *ns) {
    static const int MONTH_DAYS[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y = fixed(p + 1, 4), mo = fixed(p + 6, 2), d = fixed(p + 9, 2);
    int h = fixed(p + 12, 2), mi = fixed(p + 15, 2), s = fixed(p + 18, 2);
    if (y < 1678 || y > 2261 || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || s > 59) return -1;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > MONTH_DAYS[mo - 1] + (mo == 2 && leap)) return -1;
    int64_t frac = 0;
    const char *f = p + 21; /* after the "." */
    if (close > p + 20) {
        int n = (int)(close - f);
        if (n > 9) return -1;
        for (int i = 0; i < 9; i++) frac = frac * 10 + (i < n ? f[i] - '0' : 0);
    }
    *ns = ((days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s) * 1000000000LL) + frac;
    return 0;
}

/* The origin ``(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\]$`` of ``start`` .. ``end``. */
static int origin(const char *start, const char *end, Fields *f) {
    const char *q = end;
    if (q - start < 1 || *--q != ']') return -1;
    const char *dev_end = q;
    while (q > start && is_digit(q[-1])) q--;
    if (q == dev_end || q - start < 2 || q[-1] != '[' || q[-2] != ' ') return -1;
    q -= 2;
    const char *tid_end = q;
    while (q > start && is_digit(q[-1])) q--;
    if (q == tid_end || q - start < 1 || q[-1] != ':') return -1;
    const char *pid_end = --q;
    while (q > start && is_digit(q[-1])) q--;
    const char *pid = q;
    if (q == pid_end || q - start < 1 || q[-1] != ':') return -1;
    if (digits(&pid, pid_end, 18, &f->pid) < 0) return -1;
    const char *host_end = --q;
    while (q > start && (is_word(q[-1]) || q[-1] == '.' || q[-1] == '-')) q--;
    if (q == host_end) return -1;
    f->host = (Str){q, (size_t)(host_end - q)};
    return 0;
}

/* One COLL line ``s`` .. ``e`` into ``f``; -1: not a line this scanner is sure of. */
static int coll_line(const char *s, const char *e, Fields *f) {
    unsigned char high = 0;
    for (const char *c = s; c < e; c++) high |= (unsigned char)*c;
    if (high & 0x80) return -1;
    const char *info = find(s, (size_t)(e - s), " NCCL INFO ", 11, 6);
    if (info == NULL) return -1;
    const char *msg = info + 11;
    const char *colon = find(msg, (size_t)(e - msg), ": opCount ", 10, 3);
    if (colon == NULL || colon == msg) return -1;
    for (const char *c = msg; c < colon; c++)
        if (!is_word(*c)) return -1;
    f->op = (Str){msg, (size_t)(colon - msg)};
    const char *p = colon + 10;
    const char *space = memchr(p, ' ', (size_t)(e - p));
    if (space == NULL || hex(&p, space, &f->seq) < 0 || p != space) return -1;
    const char *tail = space + 1;
    const char *cut = find(tail, (size_t)(e - tail), " count ", 7, 5);
    if (cut == NULL) return -1;
    /* the buffers: ^sendbuff \S+ recvbuff \S+$ */
    p = tail;
    if (literal(&p, cut, "sendbuff ", 9) < 0) return -1;
    const char *x = p;
    while (p < cut && !is_space(*p)) p++;
    if (p == x || literal(&p, cut, " recvbuff ", 10) < 0 || p == cut) return -1;
    for (; p < cut; p++)
        if (is_space(*p)) return -1;
    /* the numbers: ^count datatype op root comm [[nranks=N]] stream (anything may follow) */
    int64_t redop;
    p = cut + 7;
    const char *dtype = NULL;
    if (digits(&p, e, 18, &f->count) < 0 || literal(&p, e, " datatype ", 10) < 0) return -1;
    dtype = p;
    if (digits(&p, e, 18, &f->dtype_code) < 0) return -1;
    f->dtype_digits = (Str){dtype, (size_t)(p - dtype)};
    if (literal(&p, e, " op ", 4) < 0 || digits(&p, e, 18, &redop) < 0 || literal(&p, e, " root ", 6) < 0
        || digits(&p, e, 18, &f->root) < 0 || literal(&p, e, " comm 0x", 8) < 0)
        return -1;
    const char *comm = p - 2;
    while (p < e && is_hex(*p)) p++;
    if (p == comm + 2) return -1;
    f->comm = (Str){comm, (size_t)(p - comm)};
    f->has_nranks = 0;
    f->nranks = 0;
    if (literal(&p, e, " [nranks=", 9) == 0) {
        if (digits(&p, e, 18, &f->nranks) < 0 || literal(&p, e, "]", 1) < 0) return -1;
        f->has_nranks = 1;
    }
    if (literal(&p, e, " stream 0x", 10) < 0 || hex(&p, e, &f->stream) < 0) return -1;
    /* the prefix: the first timestamp, then the origin after it */
    const char *start = s;
    f->has_ts = 0;
    f->ts_ns = 0;
    for (const char *b = memchr(s, '[', (size_t)(info - s)); b != NULL;
         b = memchr(b + 1, '[', (size_t)(info - b - 1))) {
        const char *close = timestamp_at(b, info);
        if (close != NULL) {
            if (timestamp_ns(b, close, &f->ts_ns) < 0) return -1;
            f->has_ts = 1;
            start = close + 1;
            break;
        }
        if (b + 1 >= info) break;
    }
    return origin(start, info, f);
}

static inline void set_valid(Scan *sc, int column, size_t row, int valid) {
    if (valid)
        sc->valid[column].p[row / 8] |= (char)(1u << (row % 8));
    else
        sc->nulls[column]++;
}

static int append(Scan *sc, const Fields *f) {
    size_t row = sc->rows;
    if (row == sc->cap) return -1; /* cannot be: every row's line holds " opCount " */
    int known = f->dtype_code < N_DTYPES;
    int64_t i64[N_I64] = {f->has_ts ? f->ts_ns : 0, f->pid, f->seq, f->count,
                          known ? DTYPE_BYTES[f->dtype_code] : 0, f->stream};
    int32_t i32[N_I32] = {f->root <= INT32_MAX ? (int32_t)f->root : 0,
                          f->has_nranks && f->nranks <= INT32_MAX ? (int32_t)f->nranks : 0};
    Str str[N_STR] = {f->host, f->comm, f->op,
                      known ? (Str){DTYPE_NAMES[f->dtype_code], DTYPE_LENGTHS[f->dtype_code]} : f->dtype_digits};
    for (int k = 0; k < N_I64; k++) memcpy(sc->i64[k].p + row * sizeof i64[k], &i64[k], sizeof i64[k]);
    for (int k = 0; k < N_I32; k++) memcpy(sc->i32[k].p + row * sizeof i32[k], &i32[k], sizeof i32[k]);
    for (int k = 0; k < N_STR; k++) {
        int32_t index = intern(&sc->strings[k], str[k].p, str[k].n);
        if (index < 0) return -1;
        memcpy(sc->idx[k].p + row * sizeof index, &index, sizeof index);
    }
    set_valid(sc, V_TS, row, f->has_ts);
    set_valid(sc, V_SIZE, row, known);
    set_valid(sc, V_ROOT, row, f->root <= INT32_MAX);
    set_valid(sc, V_NRANKS, row, f->has_nranks && f->nranks <= INT32_MAX);
    sc->rows++;
    return 0;
}

static void scan_text(Scan *sc, const char *p, const char *end) {
    while (p < end) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        const char *next = e ? e + 1 : end;
        if (e == NULL) e = end;
        size_t n = (size_t)(e - p);
        if (n) {
            sc->lines++;
            if (find(p, n, " opCount ", 9, 2) != NULL) {
                Fields f;
                if (coll_line(p, e, &f) < 0) {
                    sc->unsure = 1;
                    return;
                }
                if (append(sc, &f) < 0) {
                    sc->nomem = 1;
                    return;
                }
            } else if (find(p, n, "NCCL ", 5, 0) != NULL
                       && (find(p, n, " NCCL INFO ", 11, 6) || find(p, n, "NCCL WARN", 9, 5)
                           || find(p, n, "NCCL version", 12, 5))) {
                if (buf_put(&sc->rare, p, n) < 0 || buf_put(&sc->rare, "\n", 1) < 0) {
                    sc->nomem = 1;
                    return;
                }
            }
        }
        p = next;
    }
}

/* The most COLL rows ``p`` .. ``end`` can hold: its lines, each of at least 10 bytes (" opCount " and its newline).
 * Lines are counted 240 bytes (15 vectors) at a time into one byte, a loop the compiler vectorises: a third of
 * the time that counting the " opCount "s took (a fifth of the scan). */
static size_t most_rows(const char *p, const char *end) {
    size_t newlines = 0, most = (size_t)(end - p) / 10 + 1;
    while (p < end) {
        size_t block = (size_t)(end - p) < 240 ? (size_t)(end - p) : 240;
        unsigned char count = 0;
        for (size_t i = 0; i < block; i++) count += p[i] == '\n';
        newlines += count;
        p += block;
    }
    return newlines + 1 < most ? newlines + 1 : most;
}

/* The columns' bytes objects, for ``sc->cap`` rows (with the GIL). */
static int make_columns(Scan *sc) {
    size_t cap = sc->cap;
    Out *outs[] = {&sc->i64[0], &sc->i64[1], &sc->i64[2], &sc->i64[3], &sc->i64[4], &sc->i64[5], &sc->i32[0],
                   &sc->i32[1], &sc->idx[0], &sc->idx[1], &sc->idx[2], &sc->idx[3], &sc->valid[0], &sc->valid[1],
                   &sc->valid[2], &sc->valid[3]};
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
        size_t size = k < N_I64 ? cap * 8 : k < N_I64 + N_I32 + N_STR ? cap * 4 : (cap + 7) / 8;
        outs[k]->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (outs[k]->bytes == NULL) return -1;
        outs[k]->p = PyBytes_AS_STRING(outs[k]->bytes);
        if (k >= N_I64 + N_I32 + N_STR) memset(outs[k]->p, 0, size);
    }
    return 0;
}

/* The columns cut to the rows made (with the GIL): their unused ends go back to the allocator. */
static int fit_columns(Scan *sc) {
    size_t rows = sc->rows;
    Out *outs[] = {&sc->i64[0], &sc->i64[1], &sc->i64[2], &sc->i64[3], &sc->i64[4], &sc->i64[5], &sc->i32[0],
                   &sc->i32[1], &sc->idx[0], &sc->idx[1], &sc->idx[2], &sc->idx[3], &sc->valid[0], &sc->valid[1],
                   &sc->valid[2], &sc->valid[3]};
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
        size_t size = k < N_I64 ? rows * 8 : k < N_I64 + N_I32 + N_STR ? rows * 4 : (rows + 7) / 8;
        if (_PyBytes_Resize(&outs[k]->bytes, (Py_ssize_t)size) < 0) return -1;
    }
    return 0;
}

static void free_scan(Scan *sc) {
    for (int k = 0; k < N_I64; k++) Py_XDECREF(sc->i64[k].bytes);
    for (int k = 0; k < N_I32; k++) Py_XDECREF(sc->i32[k].bytes);
    for (int k = 0; k < N_VALID; k++) Py_XDECREF(sc->valid[k].bytes);
    for (int k = 0; k < N_STR; k++) {
        Py_XDECREF(sc->idx[k].bytes);
        free(sc->strings[k].keys);
        free(sc->strings[k].slots);
    }
    free(sc->rare.p);
}

static PyObject *bytes_of(const Buf *b) { return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->n); }

/* (name, data, validity or None, null count) */
static PyObject *column(const char *name, const Out *data, const Out *valid, size_t nulls) {
    return Py_BuildValue("(sOOn)", name, data->bytes, valid != NULL && nulls ? valid->bytes : Py_None,
                         (Py_ssize_t)nulls);
}

static PyObject *strings(const Intern *t) {
    PyObject *list = PyList_New((Py_ssize_t)t->n);
    if (list == NULL) return NULL;
    for (size_t k = 0; k < t->n; k++) {
        PyObject *s = PyUnicode_DecodeASCII(t->keys[k].p, (Py_ssize_t)t->keys[k].n, "strict");
        if (s == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, s);
    }
    return list;
}

static PyObject *result_of(Scan *sc) {
    const Out *valid64[N_I64] = {&sc->valid[V_TS], NULL, NULL, NULL, &sc->valid[V_SIZE], NULL};
    size_t nulls64[N_I64] = {sc->nulls[V_TS], 0, 0, 0, sc->nulls[V_SIZE], 0};
    const Out *valid32[N_I32] = {&sc->valid[V_ROOT], &sc->valid[V_NRANKS]};
    size_t nulls32[N_I32] = {sc->nulls[V_ROOT], sc->nulls[V_NRANKS]};
    PyObject *i64 = PyTuple_New(N_I64), *i32 = PyTuple_New(N_I32), *str = PyTuple_New(N_STR);
    if (i64 == NULL || i32 == NULL || str == NULL) goto fail;
    for (int k = 0; k < N_I64; k++) {
        PyObject *c = column(I64_NAMES[k], &sc->i64[k], valid64[k], nulls64[k]);
        if (c == NULL) goto fail;
        PyTuple_SET_ITEM(i64, k, c);
    }
    for (int k = 0; k < N_I32; k++) {
        PyObject *c = column(I32_NAMES[k], &sc->i32[k], valid32[k], nulls32[k]);
        if (c == NULL) goto fail;
        PyTuple_SET_ITEM(i32, k, c);
    }
    for (int k = 0; k < N_STR; k++) {
        PyObject *values = strings(&sc->strings[k]);
        PyObject *c = values ? Py_BuildValue("(sON)", STR_NAMES[k], sc->idx[k].bytes, values) : NULL;
        if (c == NULL) goto fail;
        PyTuple_SET_ITEM(str, k, c);
    }
    PyObject *rare = bytes_of(&sc->rare);
    if (rare == NULL) goto fail;
    return Py_BuildValue("(LONnNNN)", (long long)sc->lines, Py_False, rare, (Py_ssize_t)sc->rows, i64, i32, str);
fail:
    Py_XDECREF(i64);
    Py_XDECREF(i32);
    Py_XDECREF(str);
    return NULL;
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Scan *sc = calloc(1, sizeof *sc);
    if (sc == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    const char *text = view.buf, *end = text + view.len;
    Py_BEGIN_ALLOW_THREADS
    sc->cap = most_rows(text, end);
    Py_END_ALLOW_THREADS
    PyObject *result;
    if (make_columns(sc) < 0) {
        result = NULL;
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    scan_text(sc, text, end);
    Py_END_ALLOW_THREADS
    if (sc->nomem)
        result = PyErr_NoMemory();
    else if (sc->unsure)
        result = Py_BuildValue("(LOOn()()())", (long long)sc->lines, Py_True, Py_None, (Py_ssize_t)0);
    else if (fit_columns(sc) < 0)
        result = NULL;
    else
        result = result_of(sc); /* the strings point into the buffer: read before it is released */
done:
    free_scan(sc);
    free(sc);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef METHODS[] = {
    {"scan", scan, METH_O,
     "scan(text) -> (lines, unsure, rare, rows, int64 columns, int32 columns, string columns)\n\n"
     "Scan whole lines of an NCCL debug log. ``lines``: the non-empty lines; ``unsure``: a COLL line\n"
     "was not one the scanner takes (the rest is then empty: read the text with the polars path);\n"
     "``rare``: the lines of the rare kinds, each ending in a newline; the ``rows`` COLL rows' columns as\n"
     "(name, data, validity or None, null count) and (name, int32 indices, distinct strings)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_nccl_scan", "Native scanner of NCCL debug logs.", -1, METHODS,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__nccl_scan(void) { return PyModule_Create(&MODULE); }
