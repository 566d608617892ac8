/*
 * Native scanner for batches of PyTorch profiler (Kineto) trace events.
 *
 * Input: one batch as the cutter writes it, a JSON array of whole events
 * (``[{...},{...}]``), either already checked to be valid JSON or, with ``strict``, cut
 * without a check: the scanner then checks the syntax as it reads (_json_check.h), and
 * reports a batch it cannot vouch for as "unvouched" (docs/formats.md, section 1). Output: the columns of
 * the per-batch tables (device ops, host ops, step marks, collective args,
 * memory counters) as Arrow buffers, built in one pass with the GIL released.
 *
 * Every value is converted as DuckDB's JSON reader and the SQL of
 * ``pytorch_profiler_sql`` convert it (the DuckDB path stays as the fallback and
 * as the reference the tests compare with): ``ts``/``dur`` as exact decimals
 * with three places rounded half away from zero; integer args from numbers,
 * decimal or hex strings; text fields from any JSON value; JSON args as
 * minified JSON text.
 *
 * The first event that cannot be read (no phase, an unknown phase, a complete
 * event without a start or duration, a non-numeric id, a number out of range)
 * stops the scan and is returned as (event index, problem, args key, event name, phase).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_json_check.h"

/* ---------------------------------------------------------------------------
 * Growable buffers and Arrow columns
 * ------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static inline int buf_reserve(Buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t len) {
    if (buf_reserve(b, len)) return -1;
    if (len) memcpy(b->p + b->n, src, len);
    b->n += len;
    return 0;
}

static inline int buf_byte(Buf *b, char c) { return buf_put(b, &c, 1); }

enum ColType { T_I64, T_I32, T_F64, T_STR, T_LIST_I32 };
static const char *TYPE_NAMES[] = {"int64", "int32", "float64", "string", "list<int32>"};

typedef struct {
    const char *name;
    int type;
} ColSpec;

typedef struct {
    Buf data;    /* fixed-width values, string bytes, or list child values */
    Buf offsets; /* int32 offsets of strings and lists */
    Buf valid;   /* validity bitmap */
    Buf cvalid;  /* list child validity bitmap */
    int64_t n, nulls, child_n, child_nulls;
} Col;

#define MAX_COLS 16

typedef struct {
    int ncols;
    Col cols[MAX_COLS];
} Table;

static inline int set_bit(Buf *bits, int64_t i, int on) {
    if ((size_t)(i >> 3) >= bits->n && buf_byte(bits, 0)) return -1;
    if (on) bits->p[i >> 3] |= (char)(1 << (i & 7));
    return 0;
}

static inline int col_valid(Col *c, int ok) {
    if (set_bit(&c->valid, c->n, ok)) return -1;
    if (!ok) c->nulls++;
    c->n++;
    return 0;
}

static inline int col_i64(Col *c, int ok, int64_t v) {
    if (!ok) v = 0;
    if (buf_put(&c->data, &v, 8)) return -1;
    return col_valid(c, ok);
}

static inline int col_i32(Col *c, int ok, int32_t v) {
    if (!ok) v = 0;
    if (buf_put(&c->data, &v, 4)) return -1;
    return col_valid(c, ok);
}

static inline int col_f64(Col *c, int ok, double v) {
    if (!ok) v = 0;
    if (buf_put(&c->data, &v, 8)) return -1;
    return col_valid(c, ok);
}

/* Set when a batch's text of one column outgrows 32-bit Arrow offsets (the scan stops as for no memory). */
static _Thread_local int offsets_overflowed;

static inline int col_offset(Col *c, int64_t at) {
    if (at > INT32_MAX) {
        offsets_overflowed = 1;
        return -1;
    }
    int32_t o = (int32_t)at;
    if (c->offsets.n == 0 && buf_put(&c->offsets, &(int32_t){0}, 4)) return -1;
    return buf_put(&c->offsets, &o, 4);
}

static inline int col_str(Col *c, int ok, const char *s, size_t len) {
    if (!ok) len = 0;
    if (buf_put(&c->data, s, len)) return -1;
    if (col_offset(c, (int64_t)c->data.n)) return -1;
    return col_valid(c, ok);
}

/* ---------------------------------------------------------------------------
 * The tables, declared once here; Python reads the names and types back.
 * ------------------------------------------------------------------------- */

static const ColSpec DEVICE_COLS[] = {
    {"event_id", T_I64}, {"name", T_STR}, {"kind", T_STR}, {"device", T_I32}, {"stream", T_I64},
    {"ts_ns", T_I64}, {"dur_ns", T_I64}, {"correlation", T_I64}, {"external_id", T_I64},
    {"bytes", T_I64}, {"grid", T_LIST_I32}, {"block", T_LIST_I32}, {"regs", T_I64},
    {"smem", T_I64}, {"occupancy", T_F64}, {"graph_id", T_I64},
};
static const ColSpec HOST_COLS[] = {
    {"event_id", T_I64}, {"cat", T_STR}, {"name", T_STR}, {"pid", T_I64}, {"tid", T_I64},
    {"ts_ns", T_I64}, {"dur_ns", T_I64}, {"correlation", T_I64}, {"external_id", T_I64},
    {"sequence_number", T_I64}, {"fwd_thread_id", T_I64}, {"input_dims", T_STR},
    {"input_types", T_STR}, {"flops", T_F64}, {"concrete_inputs", T_STR}, {"record_function_id", T_I64},
};
static const ColSpec STEP_COLS[] = {{"step", T_I64}, {"ts_ns", T_I64}, {"dur_ns", T_I64}};
static const ColSpec COLL_COLS[] = {
    {"event_id", T_I64}, {"coll_name", T_STR}, {"dtype", T_STR}, {"process_group", T_STR},
    {"pg_desc", T_STR}, {"pg_ranks", T_STR}, {"in_nelems", T_I64}, {"out_nelems", T_I64},
    {"group_size", T_I64}, {"coll_seq", T_I64}, {"src_rank", T_I64}, {"dst_rank", T_I64},
};
/* One row per ``[memory]`` or ``[OutOfMemory]`` instant (MEMORY_PART in kineto_sql_events). */
static const ColSpec MEMORY_EVENT_COLS[] = {
    {"event_id", T_I64}, {"pid", T_I64}, {"tid", T_I64}, {"device", T_I32}, {"device_type", T_I64},
    {"ts_ns", T_I64}, {"kind", T_STR}, {"addr", T_I64}, {"bytes", T_I64}, {"total_allocated", T_I64},
    {"total_reserved", T_I64},
};

/* (A table of the allocator totals per instant, kept for ``counters``, is gone: ``memory_events`` holds them.) */
enum { TB_DEVICE, TB_HOST, TB_STEPS, TB_COLL, TB_MEMORY_EVENTS, N_TABLES };
static const char *TABLE_NAMES[N_TABLES] = {"device", "host", "step_marks", "coll_args", "memory_events"};
static const ColSpec *TABLE_SPECS[N_TABLES] = {DEVICE_COLS, HOST_COLS, STEP_COLS, COLL_COLS, MEMORY_EVENT_COLS};
static const int TABLE_NCOLS[N_TABLES] = {
    sizeof DEVICE_COLS / sizeof *DEVICE_COLS, sizeof HOST_COLS / sizeof *HOST_COLS,
    sizeof STEP_COLS / sizeof *STEP_COLS, sizeof COLL_COLS / sizeof *COLL_COLS,
    sizeof MEMORY_EVENT_COLS / sizeof *MEMORY_EVENT_COLS,
};

/* The ``args`` keys read, by the name the SQL path uses (ARGS and MEMORY_ARGS in kineto_sql_events). */
enum {
    A_EXTERNAL_ID, A_CORRELATION, A_DEVICE, A_STREAM, A_BYTES, A_GRID, A_BLOCK, A_REGS, A_SMEM,
    A_OCCUPANCY, A_SEQ_NR, A_FWD_TID, A_INPUT_DIMS, A_INPUT_TYPES, A_FLOPS, A_COLL_NAME, A_DTYPE,
    A_IN_NELEMS, A_OUT_NELEMS, A_GROUP_SIZE, A_PG_NAME, A_PG_DESC, A_PG_RANKS, A_COLL_SEQ,
    A_SRC_RANK, A_DST_RANK, A_TOTAL_ALLOCATED, A_TOTAL_RESERVED, A_DEVICE_ID, A_DEVICE_TYPE, A_SIZE, A_GRAPH_ID,
    A_CONCRETE_INPUTS, A_RECORD_FUNCTION_ID, A_MEM_BYTES, A_ADDR, N_ARGS
};
static const char *ARG_NAMES[N_ARGS] = {
    "external_id", "correlation", "device", "stream", "bytes", "grid", "block", "regs", "smem",
    "occupancy", "seq_nr", "fwd_tid", "input_dims", "input_types", "flops", "coll_name", "dtype",
    "in_nelems", "out_nelems", "group_size", "pg_name", "pg_desc", "pg_ranks", "coll_seq",
    "src_rank", "dst_rank", "total_allocated", "total_reserved", "device_id", "device_type", "size", "graph_id",
    "concrete_inputs", "record_function_id", "mem_bytes", "addr",
};
static const char *ARG_KEYS[N_ARGS] = {
    "External id", "correlation", "device", "stream", "bytes", "grid", "block",
    "registers per thread", "shared memory", "est. achieved occupancy %", "Sequence number",
    "Fwd thread id", "Input Dims", "Input type", "flops", "Collective name", "dtype",
    "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
    "Process Group Description", "Process Group Ranks", "Seq", "Src Rank", "Dst Rank",
    "Total Allocated", "Total Reserved", "Device Id", "Device Type", "size", "graph id", "Concrete Inputs",
    "Record function id", "Bytes", "Addr",
};
/* The args keys by length, each list ended by -1, for the lookup of a key. */
#define MAX_ARG_LEN 32
static signed char ARGS_BY_LEN[MAX_ARG_LEN][N_ARGS + 1];
/* Integer args whose presence with a value that is not a number is an error (CHECKED_INT_ARGS),
 * converted once per event (Event.id) in the order of C_*. */
enum { C_EXTERNAL_ID, C_CORRELATION, C_DEVICE, C_STREAM, N_CHECKED };
static const int CHECKED_ARGS[N_CHECKED] = {A_EXTERNAL_ID, A_CORRELATION, A_DEVICE, A_STREAM};

/* Device op kinds by lower-case category (KIND_BY_CAT) and the other categories that are not host ops. */
static const char *DEVICE_CATS[][2] = {
    {"kernel", "kernel"}, {"gpu_memcpy", "memcpy"}, {"memcpy", "memcpy"},
    {"gpu_memset", "memset"}, {"memset", "memset"}, {"cuda_sync", "sync"},
    {"mtia_ccp_events", "kernel"},
};
#define N_DEVICE_CATS (sizeof DEVICE_CATS / sizeof *DEVICE_CATS)
/* Kinds by (category, exact name) that override the category's (KIND_BY_CAT_NAME): MTIA DMA copies. */
static const char *DEVICE_NAMES[][3] = {{"mtia_ccp_events", "dma_request", "memcpy"}};
#define N_DEVICE_NAMES (sizeof DEVICE_NAMES / sizeof *DEVICE_NAMES)
/* The device category of MTIA traces (MTIA_CAT), counted to tell the trace's device type. */
static const char MTIA_CAT[] = "mtia_ccp_events";
static const char *NOT_HOST_CATS[] = {"gpu_user_annotation", "trace", "ac2g", "async_cpu_to_gpu", "fwdbwd"};
#define N_NOT_HOST_CATS (sizeof NOT_HOST_CATS / sizeof *NOT_HOST_CATS)
/* Event phases of the Chrome trace format (PHASES): one character each. */
static const char PHASES[] = "BEXiICbnestfPNODMRc()";

/* ---------------------------------------------------------------------------
 * JSON values, as spans of the input
 * ------------------------------------------------------------------------- */

/* Bytes a JSON number is made of. */
static unsigned char NUMBER_CHAR[256];

enum ValueType { V_NONE, V_NULL, V_STR, V_NUM, V_TRUE, V_FALSE, V_OBJ, V_ARR };

typedef struct {
    int type;
    const char *s, *e; /* a string's bytes between the quotes; any other value's whole text */
    int esc;           /* a string holds backslash escapes */
} Ref;

/* Problems, reported to Python by name. */
enum Problem {
    P_OK, P_SYNTAX, P_NOMEM, P_MISSING, P_PHASE, P_TS, P_DUR, P_ID, P_TS_TYPE, P_DUR_TYPE,
    P_TS_RANGE, P_DUR_RANGE, P_ARGS, P_RANGE, P_ESCAPE, P_UTF8, P_TOO_LARGE, P_UNVOUCHED
};
static const char *PROBLEM_NAMES[] = {
    "ok", "syntax", "memory", "missing", "phase", "ts", "dur", "id", "ts type", "dur type",
    "ts range", "dur range", "args", "range", "escape", "utf8", "too large", "unvouched",
};

/* Scratch buffers: keys and the phase, the category, numbers, the name, column values, minify's temporary. */
enum { S_PH, S_CAT, S_NUM, S_NAME, S_VALUE, S_TMP, N_SCRATCH };

typedef struct {
    const char *p, *end, *start;
    int strict;              /* check the syntax while reading (the batch was cut without a check) */
    int depth;               /* how deep the values read are in the batch's array: 2 an event's, 3 its args' */
    int problem;
    const char *problem_arg; /* the args key of a bad id, or the field out of range */
    int64_t bad_event;       /* index in the batch of the bad event, or -1 */
    Buf scratch[N_SCRATCH];          /* texts of values that need a copy (escapes, containers), by S_* slot */
    Table tables[N_TABLES];
    int64_t hip_calls;
    int64_t mtia_ops;       /* complete events of MTIA_CAT */
    int64_t counter_events; /* ``"ph": "C"`` events, read by the SQL path from the batch's text */
} Scan;

static inline void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

/* At a '"': move past the closing quote. */
static int skip_string(Scan *s, int *esc) {
    const char *p = s->p + 1;
    *esc = 0;
    while (p < s->end) {
        const char *q = memchr(p, '"', (size_t)(s->end - p));
        if (q == NULL) break;
        /* count the backslashes before the quote */
        const char *b = q;
        while (b > p && b[-1] == '\\') b--;
        if (memchr(p, '\\', (size_t)(q - p)) != NULL) *esc = 1;
        if (((q - b) & 1) == 0) {
            s->p = q + 1;
            return 0;
        }
        p = q + 1;
    }
    return -1;
}

/* parse_value's strict reading: the value's syntax as _json_check.h checks it. */
static int strict_value(Scan *s, Ref *r) {
    Cursor c = {(const unsigned char *)s->p, (const unsigned char *)s->end};
    const char *start = s->p;
    int ok;
    switch (*s->p) {
    case '"': ok = check_string(&c, &r->esc); r->type = V_STR; break;
    case '{': ok = check_value(&c, s->depth); r->type = V_OBJ; break;
    case '[': ok = check_value(&c, s->depth); r->type = V_ARR; break;
    case 't': ok = check_literal(&c, "true", 4); r->type = V_TRUE; break;
    case 'f': ok = check_literal(&c, "false", 5); r->type = V_FALSE; break;
    case 'n': ok = check_literal(&c, "null", 4); r->type = V_NULL; break;
    default: ok = check_number(&c); r->type = V_NUM; break;
    }
    if (!ok) return -1;
    s->p = (const char *)c.p;
    r->s = r->type == V_STR ? start + 1 : start;
    r->e = r->type == V_STR ? s->p - 1 : s->p;
    return 0;
}

static int parse_value(Scan *s, Ref *r) {
    ws(s);
    if (s->p >= s->end) return -1;
    char c = *s->p;
    r->esc = 0;
    if (s->strict) return strict_value(s, r);
    if (c == '"') {
        const char *start = s->p;
        if (skip_string(s, &r->esc)) return -1;
        r->type = V_STR;
        r->s = start + 1;
        r->e = s->p - 1;
        return 0;
    }
    if (c == '{' || c == '[') {
        const char *start = s->p;
        int depth = 0;
        while (s->p < s->end) {
            char d = *s->p;
            if (d == '"') {
                int esc;
                if (skip_string(s, &esc)) return -1;
                continue;
            }
            if (d == '{' || d == '[') depth++;
            else if (d == '}' || d == ']') {
                if (--depth == 0) {
                    s->p++;
                    r->type = c == '{' ? V_OBJ : V_ARR;
                    r->s = start;
                    r->e = s->p;
                    return 0;
                }
            }
            s->p++;
        }
        return -1;
    }
    const char *start = s->p;
    if (c == 't' || c == 'f' || c == 'n') {
        size_t len = c == 'f' ? 5 : 4;
        if ((size_t)(s->end - s->p) < len) return -1;
        r->type = c == 't' ? V_TRUE : c == 'f' ? V_FALSE : V_NULL;
        s->p += len;
    } else {
        while (s->p < s->end && NUMBER_CHAR[(unsigned char)*s->p]) s->p++;
        if (s->p == start) return -1;
        r->type = V_NUM;
    }
    r->s = start;
    r->e = s->p;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Strings: unescaping and JSON text
 * ------------------------------------------------------------------------- */

static int hex4(const char *p, const char *end, unsigned *out) {
    if (end - p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static int put_utf8(Buf *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    return buf_put(b, u, n);
}

/* Append the unescaped bytes of a JSON string body; -1: out of memory, -2: a bad escape. */
static int unescape(Buf *b, const char *p, const char *end) {
    while (p < end) {
        const char *q = memchr(p, '\\', (size_t)(end - p));
        if (q == NULL) q = end;
        if (buf_put(b, p, (size_t)(q - p))) return -1;
        if (q == end) break;
        if (q + 1 >= end) return -2;
        char c = q[1];
        const char *simple = strchr("\"\\/bfnrt", c);
        if (simple != NULL && c) {
            static const char OUT[] = "\"\\/\b\f\n\r\t";
            if (buf_byte(b, OUT[simple - "\"\\/bfnrt"])) return -1;
            p = q + 2;
            continue;
        }
        if (c != 'u') return -2;
        unsigned cp;
        if (hex4(q + 2, end, &cp)) return -2;
        p = q + 6;
        if (cp >= 0xD800 && cp < 0xDC00) {
            unsigned lo;
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) || lo < 0xDC00 || lo >= 0xE000)
                return -2;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            return -2;
        }
        if (put_utf8(b, cp)) return -1;
    }
    return 0;
}

/* Append a string as JSON text, escaped as DuckDB writes it. */
static int escape_json(Buf *b, const char *p, size_t len) {
    if (buf_byte(b, '"')) return -1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            if (buf_byte(b, (char)c)) return -1;
            continue;
        }
        char tmp[8];
        const char *named = NULL;
        switch (c) {
        case '"': named = "\\\""; break;
        case '\\': named = "\\\\"; break;
        case '\b': named = "\\b"; break;
        case '\f': named = "\\f"; break;
        case '\n': named = "\\n"; break;
        case '\r': named = "\\r"; break;
        case '\t': named = "\\t"; break;
        default: snprintf(tmp, sizeof tmp, "\\u%04x", c); named = tmp;
        }
        if (buf_put(b, named, strlen(named))) return -1;
    }
    return buf_byte(b, '"');
}

/*
 * A JSON number as DuckDB writes it back: integers as written; others as the shortest digits
 * that read back as the same double, in plain notation from 1e-6 to below 1e21 (with ".0"
 * when whole), else as 1.5e-7 / 1e21.
 */
static int number_text(Buf *b, const char *s, const char *e) {
    int integral = 1;
    for (const char *p = s; p < e; p++)
        if (*p == '.' || *p == 'e' || *p == 'E') integral = 0;
    if (integral || e - s > 400) return buf_put(b, s, (size_t)(e - s));
    char tmp[416], sci[48], out[400];
    memcpy(tmp, s, (size_t)(e - s));
    tmp[e - s] = 0;
    double d = strtod(tmp, NULL);
    if (!isfinite(d)) return buf_put(b, s, (size_t)(e - s));
    for (int prec = 0; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec, d);
        if (strtod(sci, NULL) == d) break;
    }
    /* sci is [-]D[.DDD]e[+-]XX: take its digits and exponent */
    char digits[24];
    int nd = 0, neg = sci[0] == '-';
    const char *q = sci + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < (int)sizeof digits - 1) digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(q + 1);
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (exp10 >= -6 && exp10 < 21) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++) out[k++] = i < nd ? digits[i] : '0';
            out[k++] = '.';
            if (nd > exp10 + 1) for (int i = exp10 + 1; i < nd; i++) out[k++] = digits[i];
            else out[k++] = '0';
        } else {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        snprintf(out + k, sizeof out - k, "e%d", exp10);
        k = strlen(out);
    }
    return buf_put(b, out, k);
}

/* Append a JSON value (a span of the input) as minified JSON text. -2: a bad escape. */
static int minify(Buf *b, const char *p, const char *end, Buf *tmp) {
    while (p < end) {
        char c = *p;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') { p++; continue; }
        if (c == '"') {
            const char *q = p + 1;
            while (q < end && *q != '"') q += *q == '\\' ? 2 : 1;
            if (q > end) q = end;
            tmp->n = 0;
            int rc = unescape(tmp, p + 1, q);
            if (rc) return rc;
            if (escape_json(b, tmp->p ? tmp->p : "", tmp->n)) return -1;
            p = q + 1;
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            const char *q = p;
            while (q < end && NUMBER_CHAR[(unsigned char)*q]) q++;
            if (number_text(b, p, q)) return -1;
            p = q;
            continue;
        }
        if (buf_byte(b, c)) return -1;
        p++;
    }
    return 0;
}

typedef struct {
    const char *s;
    size_t n;
    int ok; /* 0: NULL */
} Text;

/* The text DuckDB's VARCHAR holds for a value (``slot`` picks a scratch buffer). */
static int text_of(Scan *s, const Ref *r, int slot, Text *out) {
    Buf *b = &s->scratch[slot];
    out->ok = 1;
    switch (r->type) {
    case V_NONE:
    case V_NULL:
        out->ok = 0;
        out->s = "";
        out->n = 0;
        return 0;
    case V_STR:
        if (!r->esc) {
            out->s = r->s;
            out->n = (size_t)(r->e - r->s);
            return 0;
        }
        b->n = 0;
        {
            int rc = unescape(b, r->s, r->e);
            if (rc) return rc;
        }
        break;
    case V_NUM:
        b->n = 0;
        if (number_text(b, r->s, r->e)) return -1;
        break;
    case V_TRUE:
        out->s = "true";
        out->n = 4;
        return 0;
    case V_FALSE:
        out->s = "false";
        out->n = 5;
        return 0;
    default:
        b->n = 0;
        {
            int rc = minify(b, r->s, r->e, &s->scratch[S_TMP]);
            if (rc) return rc;
        }
    }
    out->s = b->p ? b->p : "";
    out->n = b->n;
    return 0;
}

/* The JSON text DuckDB's JSON type holds for a value. */
static int json_of(Scan *s, const Ref *r, int slot, Text *out) {
    Buf *b = &s->scratch[slot];
    out->ok = r->type != V_NONE && r->type != V_NULL;
    out->s = "";
    out->n = 0;
    if (!out->ok) return 0;
    b->n = 0;
    /* a string's span is between its quotes: minify it with them */
    int quoted = r->type == V_STR;
    int rc = minify(b, r->s - quoted, r->e + quoted, &s->scratch[S_TMP]);
    if (rc) return rc;
    out->s = b->p ? b->p : "";
    out->n = b->n;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Numbers, as DuckDB casts text
 * ------------------------------------------------------------------------- */

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static void trim(const char **s, size_t *n) {
    while (*n && is_space(**s)) { (*s)++; (*n)--; }
    while (*n && is_space((*s)[*n - 1])) (*n)--;
}

/*
 * A decimal number (digits may be separated by '_', an exponent allowed) times 10^scale, exact,
 * rounded half away from zero, as DuckDB casts text to BIGINT (scale 0) and reads DECIMAL(20,3)
 * times 1000 (scale 3). Returns 1 (a value), -1 (not a number), -2 (out of range).
 */
static int parse_decimal(const char *s, size_t n, long scale, int64_t *out) {
    trim(&s, &n);
    const char *p = s, *end = s + n;
    if (p == end) return -1;
    int neg = 0;
    if (*p == '+' || *p == '-') { neg = *p == '-'; p++; }
    const char *body = p;
    /* significant digits (leading zeros dropped), how many stand left of the point, and the zeros
     * between the point and the first significant digit */
    char digits[64];
    int kept = 0, any = 0, seen_point = 0;
    long int_digits = 0, frac_zeros = 0;
    for (; p < end; p++) {
        char c = *p;
        if (c == '_') {
            if (p == body || p + 1 >= end || p[-1] < '0' || p[-1] > '9' || p[1] < '0' || p[1] > '9') return -1;
            continue;
        }
        if (c == '.' && !seen_point) { seen_point = 1; continue; }
        if (c < '0' || c > '9') break;
        any = 1;
        if (kept == 0 && c == '0') {
            if (seen_point) frac_zeros++;
            continue;
        }
        if (!seen_point) int_digits++;
        if (kept < (int)sizeof digits) digits[kept++] = c;
    }
    if (!any) return -1;
    long exp = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p == end || *p < '0' || *p > '9') return -1;
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            if (exp < 100000) exp = exp * 10 + (*p - '0');
        if (eneg) exp = -exp;
    }
    if (p != end) return -1;
    if (kept == 0) { *out = 0; return 1; }
    /* value = 0.DIGITS x 10^(point - scale): the first ``point`` digits make the integer */
    long point = (int_digits > 0 ? int_digits : -frac_zeros) + exp + scale;
    __int128 v = 0;
    for (long i = 0; i < point; i++) {
        v = v * 10 + (i < kept ? digits[i] - '0' : 0);
        if (v > (__int128)INT64_MAX + 1) return -2;
    }
    if (point >= 0 && point < kept && digits[point] >= '5') v += 1;
    if (neg) v = -v;
    if (v > INT64_MAX || v < INT64_MIN) return -2;
    *out = (int64_t)v;
    return 1;
}

/* Digits of a hex (base 16) or binary (base 2) literal after its prefix, '_' allowed between digits. */
static int cast_radix(const char *p, const char *end, unsigned base, int64_t *out) {
    uint64_t v = 0;
    int digits = 0;
    for (; p < end; p++) {
        char c = *p;
        unsigned d;
        if (c == '_' && digits && p + 1 < end && p[1] != '_') continue;
        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
        else return 0;
        if (d >= base || v > (UINT64_MAX - d) / base) return 0;
        v = v * base + d;
        digits++;
    }
    if (!digits || v > (uint64_t)INT64_MAX) return 0;
    *out = (int64_t)v;
    return 1;
}

/*
 * TRY_CAST(text AS BIGINT): integers (digits may be separated by '_'), decimals rounded half away
 * from zero, and (without a sign or trailing blanks, as DuckDB takes them) hex and binary literals.
 */
static int cast_bigint(const char *s, size_t n, int64_t *out) {
    if (n && n <= 18) {  /* the usual case: [-]digits */
        size_t i = s[0] == '-';
        uint64_t v = 0;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) v = v * 10 + (uint64_t)(s[i] - '0');
        if (i == n && n > (size_t)(s[0] == '-')) {
            *out = s[0] == '-' ? -(int64_t)v : (int64_t)v;
            return 1;
        }
    }
    while (n && is_space(*s)) { s++; n--; }
    if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return cast_radix(s + 2, s + n, 16, out);
    if (n > 2 && s[0] == '0' && (s[1] == 'b' || s[1] == 'B')) return cast_radix(s + 2, s + n, 2, out);
    return parse_decimal(s, n, 0, out) == 1;
}

/* TRY_CAST(text AS DOUBLE). */
static int cast_double(const char *s, size_t n, double *out) {
    trim(&s, &n);
    if (n == 0 || n > 400) return 0;
    char tmp[416];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == 'x' || c == 'X') return 0;
        if (c == '_') {
            if (i == 0 || i + 1 >= n || s[i - 1] < '0' || s[i - 1] > '9' || s[i + 1] < '0' || s[i + 1] > '9') return 0;
            continue;
        }
        tmp[k++] = c;
    }
    tmp[k] = 0;
    char *endp;
    double d = strtod(tmp, &endp);
    if (endp != tmp + k) return 0;
    *out = d;
    return 1;
}

/*
 * The text a number is read from: a number's or plain string's own bytes, else the value's
 * text. Returns 0 for a null or missing value, or when ``*rc`` reports a failure.
 */
static int number_text_of(Scan *s, const Ref *r, Text *t, int *rc) {
    *rc = 0;
    if (r->type == V_NONE || r->type == V_NULL) return 0;
    if (r->type == V_NUM || (r->type == V_STR && !r->esc)) {
        t->s = r->s;
        t->n = (size_t)(r->e - r->s);
        return 1;
    }
    *rc = text_of(s, r, S_NUM, t);
    return *rc == 0;
}

/* ``coalesce(TRY_CAST(x AS BIGINT), TRY_CAST(TRY_CAST(x AS DOUBLE) AS BIGINT), hex)`` on a value. */
static int int_of(Scan *s, const Ref *r, int64_t *out, int *rc) {
    Text t;
    if (!number_text_of(s, r, &t, rc)) return 0;
    if (cast_bigint(t.s, t.n, out)) return 1;
    double d;
    if (cast_double(t.s, t.n, &d) && isfinite(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
        *out = (int64_t)nearbyint(d);
        return 1;
    }
    return 0;
}

static int double_of(Scan *s, const Ref *r, double *out, int *rc) {
    Text t;
    if (!number_text_of(s, r, &t, rc)) return 0;
    return cast_double(t.s, t.n, out);
}

/* The run of decimal digits at ``p`` as an integer: 0 when it does not fit 64 bits. */
static int digit_run(const char *p, const char *end, int64_t *out) {
    uint64_t v = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = (int64_t)v;
    return 1;
}

/* num_id(): an id as an integer, else the first run of digits in its text. */
static int id_of(Scan *s, const Ref *r, int64_t *out, int *rc) {
    Text t;
    if (!number_text_of(s, r, &t, rc)) return 0;
    if (cast_bigint(t.s, t.n, out)) return 1;
    const char *p = t.s, *end = t.s + t.n;
    while (p < end && (*p < '0' || *p > '9')) p++;
    return p < end && digit_run(p, end, out);
}


/* The usual JSON number of microseconds, [-]D[.D], up to 15 integer digits: without the general parse. */
static inline int plain_micros(const char *p, const char *e, int64_t *out) {
    int neg = p < e && *p == '-';
    p += neg;
    uint64_t whole = 0, frac = 0;
    int digits = 0, places = 0, round_up = 0;
    for (; p < e && *p >= '0' && *p <= '9'; p++, digits++) whole = whole * 10 + (uint64_t)(*p - '0');
    if (digits == 0 || digits > 15) return 0;
    if (p < e && *p == '.') {
        for (p++; p < e && *p >= '0' && *p <= '9'; p++, places++) {
            if (places < 3) frac = frac * 10 + (uint64_t)(*p - '0');
            else if (places == 3) round_up = *p >= '5';
        }
        if (places == 0) return 0;
    }
    if (p != e) return 0;
    for (int k = places; k < 3; k++) frac *= 10;
    int64_t v = (int64_t)(whole * 1000 + frac) + round_up;
    *out = neg ? -v : v;
    return 1;
}

/*
 * ``CAST(x * 1000 AS BIGINT)`` of a value read as DECIMAL(20,3): 1 (a value), 0 (NULL),
 * -1 (not a number), -2 (out of range).
 */
static int decimal_ns(Scan *s, const Ref *r, int64_t *out) {
    if (r->type == V_NUM && plain_micros(r->s, r->e, out)) return 1;
    if (r->type != V_NONE && r->type != V_NULL && r->type != V_NUM && r->type != V_STR) return -1;
    Text t;
    int rc;
    if (!number_text_of(s, r, &t, &rc)) return rc ? -1 : 0;
    return parse_decimal(t.s, t.n, 3, out);
}

/* ---------------------------------------------------------------------------
 * One event
 * ------------------------------------------------------------------------- */

typedef struct {
    Ref ph, cat, name, pid, tid, ts, dur;
    Ref args[N_ARGS];
    /* the CHECKED_ARGS as integers, where present (``has_id``): set by emit() */
    int64_t id[N_CHECKED];
    int has_id[N_CHECKED];
} Event;

static int key_is(const char *k, size_t n, const char *lit) { return strlen(lit) == n && memcmp(k, lit, n) == 0; }

/* Read a key and its colon; the key's text is in the input, or in scratch[S_PH] when it has escapes. */
static int read_key(Scan *s, const char **k, size_t *n) {
    ws(s);
    if (s->p >= s->end || *s->p != '"') return -1;
    Ref r;
    if (parse_value(s, &r)) return -1;
    if (!r.esc) {
        *k = r.s;
        *n = (size_t)(r.e - r.s);
    } else {
        s->scratch[S_PH].n = 0;
        if (unescape(&s->scratch[S_PH], r.s, r.e)) return -1;
        *k = s->scratch[S_PH].p;
        *n = s->scratch[S_PH].n;
    }
    ws(s);
    if (s->p >= s->end || *s->p != ':') return -1;
    s->p++;
    return 0;
}

/* Parse an ``args`` object, keeping the values of the keys in ARG_KEYS. */
static int parse_args(Scan *s, Event *ev) {
    s->p++; /* '{' */
    ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 0; }
    for (;;) {
        const char *k;
        size_t n;
        if (read_key(s, &k, &n)) return -1;
        int which = -1;
        if (n < MAX_ARG_LEN)
            for (const signed char *a = ARGS_BY_LEN[n]; *a >= 0; a++)
                if (memcmp(ARG_KEYS[*a], k, n) == 0) { which = *a; break; }
        Ref r;
        if (parse_value(s, &r)) return -1;
        if (which >= 0) ev->args[which] = r;
        ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == '}') { s->p++; return 0; }
        return -1;
    }
}

static int parse_event(Scan *s, Event *ev) {
    memset(ev, 0, sizeof *ev);
    ws(s);
    if (s->p >= s->end || *s->p != '{') return -1;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 0; }
    for (;;) {
        const char *k;
        size_t n;
        if (read_key(s, &k, &n)) return -1;
        Ref *slot = NULL;
        switch (n) {
        case 2:
            if (k[0] == 'p' && k[1] == 'h') slot = &ev->ph;
            else if (k[0] == 't' && k[1] == 's') slot = &ev->ts;
            break;
        case 3:
            if (key_is(k, n, "cat")) slot = &ev->cat;
            else if (key_is(k, n, "pid")) slot = &ev->pid;
            else if (key_is(k, n, "tid")) slot = &ev->tid;
            else if (key_is(k, n, "dur")) slot = &ev->dur;
            break;
        case 4:
            if (key_is(k, n, "name")) slot = &ev->name;
            else if (key_is(k, n, "args")) {
                ws(s);
                if (s->p < s->end && *s->p == '{') {
                    memset(ev->args, 0, sizeof ev->args);
                    s->depth = 3;
                    int failed = parse_args(s, ev);
                    s->depth = 2;
                    if (failed) return -1;
                    goto next;
                }
                Ref r;
                if (parse_value(s, &r)) return -1;
                if (r.type != V_NULL) s->problem = P_ARGS;
                goto next;
            }
            break;
        }
        {
            Ref r;
            if (parse_value(s, &r)) return -1;
            if (slot != NULL) *slot = r;
        }
    next:
        ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == '}') { s->p++; return 0; }
        return -1;
    }
}

#define TRY(x) do { if ((x) != 0) { s->problem = P_NOMEM; return -1; } } while (0)
#define CONVERT(rc) do { int rc_ = (rc); if (rc_ == -1) { s->problem = P_NOMEM; return -1; } \
                         if (rc_ == -2) { s->problem = P_ESCAPE; return -1; } } while (0)

static int str_col(Scan *s, Col *c, const Ref *r) {
    Text t;
    CONVERT(text_of(s, r, S_VALUE, &t));
    TRY(col_str(c, t.ok, t.s, t.n));
    return 0;
}

static int json_col(Scan *s, Col *c, const Ref *r) {
    Text t;
    CONVERT(json_of(s, r, S_VALUE, &t));
    TRY(col_str(c, t.ok, t.s, t.n));
    return 0;
}

static int int_col(Scan *s, Col *c, const Ref *r) {
    int64_t v = 0;
    int rc, ok = int_of(s, r, &v, &rc);
    CONVERT(rc);
    TRY(col_i64(c, ok, v));
    return 0;
}

static int double_col(Scan *s, Col *c, const Ref *r) {
    double v = 0;
    int rc, ok = double_of(s, r, &v, &rc);
    CONVERT(rc);
    TRY(col_f64(c, ok, v));
    return 0;
}

static int int_list_elements(Scan *s, Col *c);

/* TRY_CAST(json AS INTEGER[]): element by element, NULL where one does not convert. */
static int int_list_col(Scan *s, Col *c, const Ref *r) {
    if (r->type != V_ARR) {
        /* a non-array converts to NULL; a JSON null too */
        TRY(col_offset(c, c->child_n));
        TRY(col_valid(c, 0));
        return 0;
    }
    /* parse the elements with the scan's own cursor, put back after */
    const char *saved_p = s->p, *saved_end = s->end;
    s->p = r->s + 1;
    s->end = r->e - 1;
    int rc = int_list_elements(s, c);
    s->p = saved_p;
    s->end = saved_end;
    if (rc) return -1;
    TRY(col_offset(c, c->child_n));
    TRY(col_valid(c, 1));
    return 0;
}

static int int_list_elements(Scan *s, Col *c) {
    ws(s);
    while (s->p < s->end) {
        Ref e;
        if (parse_value(s, &e)) { s->problem = P_SYNTAX; return -1; }
        int64_t v = 0;
        int rc, ok = 0;
        if (e.type == V_NUM || e.type == V_STR) ok = int_of(s, &e, &v, &rc);
        else rc = 0;
        CONVERT(rc);
        ok = ok && v >= INT32_MIN && v <= INT32_MAX;
        int32_t v32 = ok ? (int32_t)v : 0;
        TRY(buf_put(&c->data, &v32, 4));
        TRY(set_bit(&c->cvalid, c->child_n, ok));
        if (!ok) c->child_nulls++;
        c->child_n++;
        ws(s);
        if (s->p < s->end && *s->p == ',') s->p++;
        ws(s);
    }
    return 0;
}

static int text_eq(const Text *t, const char *lit) { return t->ok && key_is(t->s, t->n, lit); }

static int starts_with(const Text *t, const char *lit) {
    size_t n = strlen(lit);
    return t->ok && t->n >= n && memcmp(t->s, lit, n) == 0;
}

/* regexp_extract(name, 'ProfilerStep#(\d+)', 1) cast to BIGINT. */
static int step_number(const Text *name, int64_t *out) {
    const char *p = name->s, *end = name->s + name->n;
    static const char MARK[] = "ProfilerStep#";
    size_t m = sizeof MARK - 1;
    while ((size_t)(end - p) > m) {
        const char *q = memchr(p, 'P', (size_t)(end - p));
        if (q == NULL || (size_t)(end - q) <= m) return 0;
        if (memcmp(q, MARK, m) == 0 && q[m] >= '0' && q[m] <= '9') return digit_run(q + m, end, out);
        p = q + 1;
    }
    return 0;
}

/* The row of a device op (a complete event of a device category). */
static int device_row(Scan *s, const Event *ev, int64_t event_id, const Text *name, const char *kind, int64_t ts,
                      int64_t dur) {
    Col *c = s->tables[TB_DEVICE].cols;
    int64_t device = ev->id[C_DEVICE], stream = ev->id[C_STREAM];
    int rc = 0, has_device = ev->has_id[C_DEVICE];
    if (!has_device) has_device = id_of(s, &ev->pid, &device, &rc);
    CONVERT(rc);
    if (has_device && (device < INT32_MIN || device > INT32_MAX)) {
        s->problem = P_RANGE;
        s->problem_arg = "device";
        return -1;
    }
    int has_stream = ev->has_id[C_STREAM];
    if (!has_stream) has_stream = id_of(s, &ev->tid, &stream, &rc);
    CONVERT(rc);
    TRY(col_i64(&c[0], 1, event_id) || col_str(&c[1], name->ok, name->s, name->n) ||
        col_str(&c[2], 1, kind, strlen(kind)) || col_i32(&c[3], has_device, (int32_t)device) ||
        col_i64(&c[4], has_stream, stream) || col_i64(&c[5], 1, ts) || col_i64(&c[6], 1, dur) ||
        col_i64(&c[7], ev->has_id[C_CORRELATION], ev->id[C_CORRELATION]) ||
        col_i64(&c[8], ev->has_id[C_EXTERNAL_ID], ev->id[C_EXTERNAL_ID]));
    /* coalesce(bytes, size): MTIA's dma_request gives its bytes as ``size`` */
    int64_t bytes = 0;
    int has_bytes = int_of(s, &ev->args[A_BYTES], &bytes, &rc);
    CONVERT(rc);
    if (!has_bytes) has_bytes = int_of(s, &ev->args[A_SIZE], &bytes, &rc);
    CONVERT(rc);
    TRY(col_i64(&c[9], has_bytes, bytes));
    /* nullif(graph id, 0): Kineto writes 0 for a kernel outside a CUDA graph */
    int64_t graph = 0;
    int has_graph = int_of(s, &ev->args[A_GRAPH_ID], &graph, &rc);
    CONVERT(rc);
    return int_list_col(s, &c[10], &ev->args[A_GRID]) ||
           int_list_col(s, &c[11], &ev->args[A_BLOCK]) || int_col(s, &c[12], &ev->args[A_REGS]) ||
           int_col(s, &c[13], &ev->args[A_SMEM]) || double_col(s, &c[14], &ev->args[A_OCCUPANCY]) ||
           col_i64(&c[15], has_graph && graph != 0, graph) ? -1 : 0;
}

/* The operators that keep ``Concrete Inputs`` besides ``c10d::`` ones, set once by
 * set_concrete_ops() from contracts/concrete.py before any scan (read only while scans run). */
static char **concrete_names = NULL;
static size_t *concrete_lens = NULL;
static Py_ssize_t n_concrete = 0;

static int keeps_concrete(const Text *name) {
    if (!name->ok) return 0;
    if (name->n >= 6 && memcmp(name->s, "c10d::", 6) == 0) return 1;
    for (Py_ssize_t i = 0; i < n_concrete; i++)
        if (concrete_lens[i] == name->n && memcmp(concrete_names[i], name->s, name->n) == 0) return 1;
    return 0;
}

/* ``Concrete Inputs`` (JSON text), kept only where keeps_concrete(): a ``c10d::`` op's peer, tag or
 * root rank; a convolution's stride and padding, an attention's causal flag, a reduction's dims. */
static int concrete_col(Scan *s, Col *c, const Event *ev, const Text *name) {
    if (keeps_concrete(name))
        return json_col(s, c, &ev->args[A_CONCRETE_INPUTS]);
    return col_str(c, 0, "", 0);
}

/* The row of a host op (a complete event of any other category but the few that are neither). */
static int host_row(Scan *s, const Event *ev, int64_t event_id, const Text *cat, const Text *name, int64_t ts,
                    int64_t dur) {
    Col *c = s->tables[TB_HOST].cols;
    int64_t pid = 0, tid = 0;
    int rc, has_pid = id_of(s, &ev->pid, &pid, &rc);
    CONVERT(rc);
    int has_tid = id_of(s, &ev->tid, &tid, &rc);
    CONVERT(rc);
    TRY(col_i64(&c[0], 1, event_id) || col_str(&c[1], cat->ok, cat->s, cat->n) ||
        col_str(&c[2], name->ok, name->s, name->n) || col_i64(&c[3], has_pid, pid) ||
        col_i64(&c[4], has_tid, tid) || col_i64(&c[5], 1, ts) || col_i64(&c[6], 1, dur) ||
        col_i64(&c[7], ev->has_id[C_CORRELATION], ev->id[C_CORRELATION]) ||
        col_i64(&c[8], ev->has_id[C_EXTERNAL_ID], ev->id[C_EXTERNAL_ID]));
    /* nullif(Record function id, 0): Kineto writes 0 unless an execution trace observer numbered the ops */
    int64_t rf_id = 0;
    int has_rf_id = int_of(s, &ev->args[A_RECORD_FUNCTION_ID], &rf_id, &rc);
    CONVERT(rc);
    return int_col(s, &c[9], &ev->args[A_SEQ_NR]) || int_col(s, &c[10], &ev->args[A_FWD_TID]) ||
           json_col(s, &c[11], &ev->args[A_INPUT_DIMS]) || json_col(s, &c[12], &ev->args[A_INPUT_TYPES]) ||
           double_col(s, &c[13], &ev->args[A_FLOPS]) || concrete_col(s, &c[14], ev, name) ||
           col_i64(&c[15], has_rf_id && rf_id != 0, rf_id) ? -1 : 0;
}

/* The collective args of a complete event that names a collective. */
static int coll_row(Scan *s, const Event *ev, int64_t event_id) {
    Col *c = s->tables[TB_COLL].cols;
    TRY(col_i64(&c[0], 1, event_id));
    return str_col(s, &c[1], &ev->args[A_COLL_NAME]) || str_col(s, &c[2], &ev->args[A_DTYPE]) ||
           str_col(s, &c[3], &ev->args[A_PG_NAME]) || str_col(s, &c[4], &ev->args[A_PG_DESC]) ||
           str_col(s, &c[5], &ev->args[A_PG_RANKS]) || int_col(s, &c[6], &ev->args[A_IN_NELEMS]) ||
           int_col(s, &c[7], &ev->args[A_OUT_NELEMS]) || int_col(s, &c[8], &ev->args[A_GROUP_SIZE]) ||
           int_col(s, &c[9], &ev->args[A_COLL_SEQ]) || int_col(s, &c[10], &ev->args[A_SRC_RANK]) ||
           int_col(s, &c[11], &ev->args[A_DST_RANK]) ? -1 : 0;
}

/* The device of a memory instant: CASE WHEN device_type = 0 THEN -1 ELSE CAST(device_id AS INTEGER) END. */
static int memory_device(Scan *s, const Event *ev, int *device_ok, int64_t *device) {
    int64_t device_type = 0, device_id = 0;
    int rc, has_type = int_of(s, &ev->args[A_DEVICE_TYPE], &device_type, &rc);
    CONVERT(rc);
    int has_id = int_of(s, &ev->args[A_DEVICE_ID], &device_id, &rc);
    CONVERT(rc);
    *device_ok = 1;
    *device = -1;
    if (!(has_type && device_type == 0)) {
        *device_ok = has_id;
        *device = device_id;
        if (has_id && (device_id < INT32_MIN || device_id > INT32_MAX)) {
            s->problem = P_RANGE;
            s->problem_arg = "Device Id";
            return -1;
        }
    }
    return 0;
}

/* The row of a ``[memory]`` or (``oom``) ``[OutOfMemory]`` instant: an allocator event (MEMORY_PART). */
static int memory_event_row(Scan *s, const Event *ev, int64_t event_id, int oom, int has_ts, int64_t ts) {
    int device_ok;
    int64_t device;
    if (memory_device(s, ev, &device_ok, &device)) return -1;
    int64_t pid = 0, tid = 0, device_type = 0, bytes = 0;
    int rc, has_pid = id_of(s, &ev->pid, &pid, &rc);
    CONVERT(rc);
    int has_tid = id_of(s, &ev->tid, &tid, &rc);
    CONVERT(rc);
    int has_type = int_of(s, &ev->args[A_DEVICE_TYPE], &device_type, &rc);
    CONVERT(rc);
    int has_bytes = int_of(s, &ev->args[A_MEM_BYTES], &bytes, &rc);
    CONVERT(rc);
    const char *kind = oom ? "oom" : !has_bytes ? NULL : bytes > 0 ? "alloc" : bytes < 0 ? "free" : NULL;
    Col *c = s->tables[TB_MEMORY_EVENTS].cols;
    TRY(col_i64(&c[0], 1, event_id) || col_i64(&c[1], has_pid, pid) || col_i64(&c[2], has_tid, tid) ||
        col_i32(&c[3], device_ok, (int32_t)device) || col_i64(&c[4], has_type, device_type) ||
        col_i64(&c[5], has_ts, ts) || col_str(&c[6], kind != NULL, kind ? kind : "", kind ? strlen(kind) : 0));
    return int_col(s, &c[7], &ev->args[A_ADDR]) || col_i64(&c[8], has_bytes, bytes) ||
           int_col(s, &c[9], &ev->args[A_TOTAL_ALLOCATED]) || int_col(s, &c[10], &ev->args[A_TOTAL_RESERVED]) ? -1 : 0;
}

static int emit(Scan *s, Event *ev, int64_t event_id) {
    Text ph, cat, name;
    CONVERT(text_of(s, &ev->ph, S_PH, &ph));
    /* times convert on every event, flows and metadata included, as DuckDB reads them */
    int64_t ts = 0, dur = 0;
    int has_ts = decimal_ns(s, &ev->ts, &ts);
    if (has_ts < 0) { s->problem = has_ts == -1 ? P_TS_TYPE : P_TS_RANGE; return -1; }
    int has_dur = decimal_ns(s, &ev->dur, &dur);
    if (has_dur < 0) { s->problem = has_dur == -1 ? P_DUR_TYPE : P_DUR_RANGE; return -1; }
    if (ph.ok && ph.n == 1 && (ph.s[0] == 's' || ph.s[0] == 'f' || ph.s[0] == 'M')) return 0;
    if (!ph.ok) { s->problem = P_MISSING; return -1; }
    if (ph.n != 1 || ph.s[0] == 0 || strchr(PHASES, ph.s[0]) == NULL) { s->problem = P_PHASE; return -1; }
    char phase = ph.s[0];
    if (phase == 'C') s->counter_events++;
    if (phase == 'X' && !has_ts) { s->problem = P_TS; return -1; }
    if (phase == 'X' && !has_dur) { s->problem = P_DUR; return -1; }
    for (int i = 0; i < N_CHECKED; i++) {
        const Ref *r = &ev->args[CHECKED_ARGS[i]];
        int rc;
        ev->id[i] = 0;
        ev->has_id[i] = int_of(s, r, &ev->id[i], &rc);
        CONVERT(rc);
        if (!ev->has_id[i] && r->type != V_NONE && r->type != V_NULL) {
            s->problem = P_ID;
            s->problem_arg = ARG_KEYS[CHECKED_ARGS[i]];
            return -1;
        }
    }
    if (dur < 0) dur = 0;
    CONVERT(text_of(s, &ev->cat, S_CAT, &cat));
    /* lower(cat), ASCII only: the categories compared are ASCII */
    char lcat[32];
    int lcat_ok = cat.ok && cat.n < sizeof lcat;
    if (lcat_ok) {
        for (size_t i = 0; i < cat.n; i++) {
            char c = cat.s[i];
            lcat[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
        }
        lcat[cat.n] = 0;
        if (memchr(lcat, 0, cat.n) != NULL) lcat_ok = 0;
    }
    CONVERT(text_of(s, &ev->name, S_NAME, &name));
    if (lcat_ok && strcmp(lcat, "cuda_runtime") == 0 && starts_with(&name, "hip")) s->hip_calls++;
    if (phase == 'i') {
        int oom = text_eq(&name, "[OutOfMemory]");
        if (!oom && !text_eq(&name, "[memory]")) return 0;
        return memory_event_row(s, ev, event_id, oom, has_ts, ts) ? -1 : 0;
    }
    if (phase != 'X') return 0;
    const char *kind = NULL;
    int not_host = 0;
    if (lcat_ok) {
        for (size_t i = 0; i < N_DEVICE_CATS; i++)
            if (strcmp(lcat, DEVICE_CATS[i][0]) == 0) { kind = DEVICE_CATS[i][1]; break; }
        for (size_t i = 0; i < N_NOT_HOST_CATS && !kind; i++)
            if (strcmp(lcat, NOT_HOST_CATS[i]) == 0) not_host = 1;
    }
    if (lcat_ok && strcmp(lcat, MTIA_CAT) == 0) s->mtia_ops++;
    for (size_t i = 0; i < N_DEVICE_NAMES && kind != NULL; i++)
        if (strcmp(lcat, DEVICE_NAMES[i][0]) == 0 && text_eq(&name, DEVICE_NAMES[i][1])) kind = DEVICE_NAMES[i][2];
    if (kind != NULL && device_row(s, ev, event_id, &name, kind, ts, dur)) return -1;
    if (kind == NULL && !not_host && host_row(s, ev, event_id, &cat, &name, ts, dur)) return -1;
    if (starts_with(&name, "ProfilerStep#")) {
        Col *c = s->tables[TB_STEPS].cols;
        int64_t step = 0;
        int has_step = step_number(&name, &step);
        TRY(col_i64(&c[0], has_step, step) || col_i64(&c[1], 1, ts) || col_i64(&c[2], 1, dur));
    }
    const Ref *coll = &ev->args[A_COLL_NAME];
    if (coll->type != V_NONE && coll->type != V_NULL) return coll_row(s, ev, event_id);
    return 0;
}

/* ---------------------------------------------------------------------------
 * The scan
 * ------------------------------------------------------------------------- */

/* Offset of the first byte that is not valid UTF-8, or -1. */
static Py_ssize_t invalid_utf8(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if ((w & 0x8080808080808080ULL) == 0) { i += 8; continue; }
        }
        unsigned char c = p[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return (Py_ssize_t)i;
        if (i + len > n) return (Py_ssize_t)i;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return (Py_ssize_t)i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return (Py_ssize_t)i;
        i += len;
    }
    return -1;
}

/* In a strict scan, after the event that stopped it: the rest of the batch must be valid too, or a checked
 * scan (which checks the whole batch first) could report another error. */
static void check_rest(Scan *s) {
    Cursor c = {(const unsigned char *)s->p, (const unsigned char *)s->end};
    int64_t more = 0;
    if (!check_array_rest(&c, &more)) s->problem = P_UNVOUCHED;
}

static void scan_events(Scan *s, int64_t first, int64_t *count, Event *ev) {
    *count = 0;
    ws(s);
    if (s->p >= s->end || *s->p != '[') { s->problem = P_SYNTAX; return; }
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        ws(s);
        if (s->strict && s->p != s->end) s->problem = P_SYNTAX;
        return;
    }
    for (;;) {
        if (parse_event(s, ev)) {
            if (s->problem == P_OK || s->strict) s->problem = P_SYNTAX;
            s->bad_event = *count;
            return;
        }
        if (s->problem != P_OK || emit(s, ev, first + *count)) {
            s->bad_event = *count;
            if (s->strict && s->problem != P_NOMEM) check_rest(s);
            return;
        }
        (*count)++;
        ws(s);
        if (s->p >= s->end) { s->problem = P_SYNTAX; return; }
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == ']') {
            s->p++;
            ws(s);
            if (s->strict && s->p != s->end) s->problem = P_SYNTAX;
            return;
        }
        s->problem = P_SYNTAX;
        return;
    }
}

/* ---------------------------------------------------------------------------
 * Handing the columns to Python without a copy, and sizing them from the batch before
 * ------------------------------------------------------------------------- */

/*
 * A column buffer's memory handed to Python as it is: a read-only object with the buffer protocol
 * (``pyarrow.py_buffer`` wraps it without a copy), which frees the memory when the last reference goes.
 * Copying each buffer into a ``bytes`` instead faulted in and wrote every output byte twice.
 */
typedef struct {
    PyObject_HEAD
    char *p;
    Py_ssize_t n;
} Owned;

static int owned_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Owned *o = (Owned *)self;
    return PyBuffer_FillInfo(view, self, o->p, o->n, 1, flags);
}

static void owned_dealloc(PyObject *self) {
    free(((Owned *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs OWNED_BUFFER = {owned_getbuffer, NULL};

static PyTypeObject OwnedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracelake.ingest._kineto.Owned",
    .tp_doc = "A scanned column's buffer, read-only, freed with the object.",
    .tp_basicsize = sizeof(Owned),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = owned_dealloc,
    .tp_as_buffer = &OWNED_BUFFER,
};

/* The buffer's bytes as an Owned object, which takes the memory over (``b`` is left empty); a ``bytes``
 * where the buffer is empty. Spare room above 1/16 of the bytes is given back first (a shrinking realloc
 * splits the block in place). */
static PyObject *bytes_of(Buf *b) {
    if (b->n == 0) return PyBytes_FromStringAndSize("", 0);
    if (b->cap - b->n > b->n / 16 + 4096) {
        char *p = realloc(b->p, b->n);
        if (p != NULL) b->p = p;
    }
    Owned *o = PyObject_New(Owned, &OwnedType);
    if (o == NULL) return NULL;
    o->p = b->p;
    o->n = (Py_ssize_t)b->n;
    b->p = NULL;
    b->n = b->cap = 0;
    return (PyObject *)o;
}

/*
 * Each buffer's size per byte of input in this thread's last batch, so that the next batch's buffers are
 * allocated once at about their final size instead of growing from 1 KB by doubling (every growth a copy,
 * and the new pages faulted in). Batches are cut to a fixed size, so the last one is a close guess; a
 * guess too small grows as before, one too large is given back by bytes_of.
 */
enum { B_DATA, B_OFFSETS, B_VALID, B_CVALID, N_BUFS };
static _Thread_local double per_byte[N_TABLES][MAX_COLS][N_BUFS];

static Buf *col_buf(Col *c, int which) {
    return which == B_DATA ? &c->data : which == B_OFFSETS ? &c->offsets : which == B_VALID ? &c->valid : &c->cvalid;
}

static void presize(Scan *s, size_t input) {
    for (int t = 0; t < N_TABLES; t++)
        for (int k = 0; k < s->tables[t].ncols; k++)
            for (int w = 0; w < N_BUFS; w++) {
                double guess = per_byte[t][k][w] * (double)input * 1.0625;
                if (guess < 4096 || guess > (double)(SIZE_MAX / 2)) continue;
                Buf *b = col_buf(&s->tables[t].cols[k], w);
                size_t cap = (size_t)guess;
                char *p = malloc(cap);
                if (p == NULL) continue; /* grows as it goes instead */
                b->p = p;
                b->cap = cap;
            }
}

static void remember_sizes(Scan *s, size_t input) {
    if (input == 0) return;
    for (int t = 0; t < N_TABLES; t++)
        for (int k = 0; k < s->tables[t].ncols; k++)
            for (int w = 0; w < N_BUFS; w++)
                per_byte[t][k][w] = (double)col_buf(&s->tables[t].cols[k], w)->n / (double)input;
}


static PyObject *column_tuple(const ColSpec *spec, Col *c) {
    PyObject *valid = c->nulls ? bytes_of(&c->valid) : (Py_INCREF(Py_None), Py_None);
    PyObject *offsets, *child_valid;
    if (spec->type == T_STR || spec->type == T_LIST_I32) {
        if (c->n == 0) offsets = PyBytes_FromStringAndSize("\0\0\0\0", 4);
        else offsets = bytes_of(&c->offsets);
    } else {
        offsets = (Py_INCREF(Py_None), Py_None);
    }
    if (spec->type == T_LIST_I32 && c->child_nulls) child_valid = bytes_of(&c->cvalid);
    else child_valid = (Py_INCREF(Py_None), Py_None);
    PyObject *data = bytes_of(&c->data);
    if (!valid || !offsets || !child_valid || !data) {
        Py_XDECREF(valid); Py_XDECREF(offsets); Py_XDECREF(child_valid); Py_XDECREF(data);
        return NULL;
    }
    return Py_BuildValue("(ssLLNNNLLN)", spec->name, TYPE_NAMES[spec->type], (long long)c->n, (long long)c->nulls,
                         valid, offsets, data, (long long)c->child_n, (long long)c->child_nulls, child_valid);
}

static void free_scan(Scan *s) {
    for (int i = 0; i < N_SCRATCH; i++) free(s->scratch[i].p);
    for (int t = 0; t < N_TABLES; t++)
        for (int k = 0; k < s->tables[t].ncols; k++) {
            Col *c = &s->tables[t].cols[k];
            free(c->data.p); free(c->offsets.p); free(c->valid.p); free(c->cvalid.p);
        }
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long first;
    int strict = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*L|p", &view, &first, &strict)) return NULL;
    Scan *s = calloc(1, sizeof *s);
    Event *ev = malloc(sizeof *ev);
    if (s == NULL || ev == NULL) {
        free(s); free(ev);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    for (int t = 0; t < N_TABLES; t++) {
        s->tables[t].ncols = TABLE_NCOLS[t];
    }
    s->start = s->p = view.buf;
    s->end = s->p + view.len;
    s->strict = strict;
    s->depth = 2;
    s->bad_event = -1;
    int64_t count = 0;
    Py_ssize_t bad_utf8;
    Py_BEGIN_ALLOW_THREADS
    offsets_overflowed = 0;
    bad_utf8 = invalid_utf8((const unsigned char *)view.buf, (size_t)view.len);
    if (bad_utf8 >= 0 && strict) {
        s->problem = P_UNVOUCHED; /* a checked scan finds the bad byte's event */
    } else {
        if (bad_utf8 >= 0) s->end = s->start + bad_utf8; /* scan up to the bad byte to find its event */
        presize(s, (size_t)(s->end - s->start));
        scan_events(s, first, &count, ev);
        if (s->problem == P_OK) remember_sizes(s, (size_t)(s->end - s->start));
        if (s->problem == P_NOMEM && offsets_overflowed) s->problem = P_TOO_LARGE;
        if (strict && s->problem == P_SYNTAX) s->problem = P_UNVOUCHED;
    }
    Py_END_ALLOW_THREADS
    if (bad_utf8 >= 0 && (s->problem == P_OK || s->problem == P_SYNTAX)) {
        s->problem = P_UTF8;
        s->bad_event = count;
    }
    PyObject *result = NULL, *tables = NULL, *error = Py_None;
    Py_INCREF(Py_None);
    if (s->problem == P_NOMEM) {
        PyErr_NoMemory();
        goto done;
    }
    if (s->problem != P_OK) {
        Py_DECREF(error);
        Text name = {"", 0, 0}, ph = {"", 0, 0};
        PyObject *name_obj = Py_None, *ph_obj = Py_None;
        Py_INCREF(name_obj);
        Py_INCREF(ph_obj);
        if (s->problem != P_SYNTAX && s->problem != P_UTF8 && s->problem != P_ESCAPE && s->problem != P_UNVOUCHED) {
            if (text_of(s, &ev->name, S_NAME, &name) == 0 && name.ok) {
                Py_DECREF(name_obj);
                name_obj = PyUnicode_DecodeUTF8(name.s, (Py_ssize_t)name.n, "replace");
            }
            if (text_of(s, &ev->ph, S_PH, &ph) == 0 && ph.ok) {
                Py_DECREF(ph_obj);
                ph_obj = PyUnicode_DecodeUTF8(ph.s, (Py_ssize_t)ph.n, "replace");
            }
        }
        error = Py_BuildValue("(LszNN)", (long long)(s->bad_event < 0 ? count : s->bad_event),
                              PROBLEM_NAMES[s->problem], s->problem_arg, name_obj, ph_obj);
        if (error == NULL) goto done;
        result = Py_BuildValue("(OLLLLO)", Py_None, (long long)count, (long long)s->hip_calls,
                               (long long)s->mtia_ops, (long long)s->counter_events, error);
        goto done;  /* the columns of a batch that failed are not wanted */
    }
    tables = PyDict_New();
    if (tables == NULL) goto done;
    for (int t = 0; t < N_TABLES; t++) {
        PyObject *cols = PyList_New(0);
        if (cols == NULL) goto done;
        int failed = PyDict_SetItemString(tables, TABLE_NAMES[t], cols);
        Py_DECREF(cols);
        if (failed) goto done;
        for (int k = 0; k < TABLE_NCOLS[t]; k++) {
            PyObject *col = column_tuple(&TABLE_SPECS[t][k], &s->tables[t].cols[k]);
            if (col == NULL) goto done;
            failed = PyList_Append(cols, col);
            Py_DECREF(col);
            if (failed) goto done;
        }
    }
    result = Py_BuildValue("(NLLLLO)", tables, (long long)count, (long long)s->hip_calls,
                           (long long)s->mtia_ops, (long long)s->counter_events, error);
    tables = NULL;
done:
    Py_XDECREF(tables);
    Py_XDECREF(error);
    free_scan(s);
    free(s);
    free(ev);
    PyBuffer_Release(&view);
    return result;
}

/* ---------------------------------------------------------------------------
 * Nesting of host events
 * ------------------------------------------------------------------------- */

/*
 * Nester().nest(new_thread, ts, end_key, event_id) -> (depth, parent)
 *
 * Host events arrive sorted by thread, start, longer first, event id, in as many
 * calls as it takes (the state carries over). ``new_thread`` (uint8) marks each
 * thread's first event; ``end_key`` is 2 * end, plus 2 for an event of zero
 * length. An event is open at another's start when its end key is at least
 * 2 * that start + 1: touching is not nesting, and a zero-length event closes
 * only after the starts at its time. The depth is the number of events open at
 * the start (a min-heap of end keys), and the parent the latest event to start
 * one level up. Returns int32 depths and int64 parents (-1: none).
 *
 * With ``kind`` (uint8: 0 a host event, 1 a host ``cpu_op``, 2 a memory instant) and ``op_end_key``
 * (the end key of each cpu_op with a negative length taken as 0), it also returns, for each memory
 * instant, the event id of its op (docs/formats.md, "Memory instants"): of the cpu_ops holding its
 * time, the last to start, then the first to end, then the larger id, which in this order is the
 * last to arrive. The cpu_ops that arrived wait on a stack; an instant pops those ended before its
 * time (times only grow within a thread, so they stay ended) and takes the top. Instants must come
 * after the host events of their time, and change neither depths nor parents.
 */
typedef struct {
    PyObject_HEAD
    int64_t *heap, *last; /* open events' end keys; the latest event id to start at each depth */
    Py_ssize_t size, cap;
    int64_t *op_end, *op_id; /* the cpu_ops that arrived and may still hold a later instant */
    Py_ssize_t op_size, op_cap;
} Nester;

static void nester_dealloc(Nester *self) {
    free(self->heap);
    free(self->last);
    free(self->op_end);
    free(self->op_id);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Doubles the capacity of two int64 arrays of the same length; -1 (both unchanged) where memory runs out. */
static int grow_pair(int64_t **a, int64_t **b, Py_ssize_t *cap) {
    Py_ssize_t grown = *cap ? 2 * *cap : 64;
    int64_t *x = realloc(*a, (size_t)grown * 8);
    if (x == NULL) return -1;
    *a = x;
    int64_t *y = realloc(*b, (size_t)grown * 8);
    if (y == NULL) return -1;
    *b = y;
    *cap = grown;
    return 0;
}

static PyObject *nester_nest(Nester *self, PyObject *args) {
    Py_buffer b_new, b_ts, b_end, b_id, b_kind = {0}, b_op_end = {0};
    if (!PyArg_ParseTuple(args, "y*y*y*y*|y*y*", &b_new, &b_ts, &b_end, &b_id, &b_kind, &b_op_end)) return NULL;
    PyObject *result = NULL, *depth_obj = NULL, *parent_obj = NULL, *op_obj = NULL;
    Py_ssize_t n = b_new.len;
    int with_ops = b_kind.obj != NULL;
    if (b_ts.len != n * 8 || b_end.len != n * 8 || b_id.len != n * 8 ||
        (with_ops && (b_kind.len != n || b_op_end.obj == NULL || b_op_end.len != n * 8))) {
        PyErr_SetString(PyExc_ValueError, "nest(): arrays of different lengths");
        goto done;
    }
    depth_obj = PyBytes_FromStringAndSize(NULL, n * 4);
    parent_obj = PyBytes_FromStringAndSize(NULL, n * 8);
    op_obj = PyBytes_FromStringAndSize(NULL, with_ops ? n * 8 : 0);
    if (!depth_obj || !parent_obj || !op_obj) goto done;
    const unsigned char *fresh = b_new.buf, *kind = with_ops ? b_kind.buf : NULL;
    const int64_t *ts = b_ts.buf, *end = b_end.buf, *ids = b_id.buf, *op_end_key = with_ops ? b_op_end.buf : NULL;
    int32_t *depth = (int32_t *)PyBytes_AS_STRING(depth_obj);
    int64_t *parent = (int64_t *)PyBytes_AS_STRING(parent_obj);
    int64_t *op = with_ops ? (int64_t *)PyBytes_AS_STRING(op_obj) : NULL;
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t *heap = self->heap, *last = self->last;
    Py_ssize_t size = self->size, cap = self->cap;
    int64_t *op_end = self->op_end, *op_id = self->op_id;
    Py_ssize_t op_size = self->op_size, op_cap = self->op_cap;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (fresh[i]) size = op_size = 0;
        int64_t open_from = 2 * ts[i] + 1;
        if (with_ops) {
            op[i] = -1;
            if (kind[i] == 2) { /* a memory instant: the latest cpu_op to arrive that still holds it */
                while (op_size > 0 && op_end[op_size - 1] < open_from) op_size--;
                if (op_size > 0) op[i] = op_id[op_size - 1];
                depth[i] = 0;
                parent[i] = -1;
                continue;
            }
            if (kind[i] == 1) {
                if (op_size >= op_cap && grow_pair(&op_end, &op_id, &op_cap)) { nomem = 1; break; }
                op_end[op_size] = op_end_key[i];
                op_id[op_size++] = ids[i];
            }
        }
        while (size > 0 && heap[0] < open_from) {
            /* pop the smallest end key */
            int64_t x = heap[--size];
            Py_ssize_t at = 0;
            for (;;) {
                Py_ssize_t c = 2 * at + 1;
                if (c >= size) break;
                if (c + 1 < size && heap[c + 1] < heap[c]) c++;
                if (heap[c] >= x) break;
                heap[at] = heap[c];
                at = c;
            }
            if (size > 0) heap[at] = x;
        }
        if (size >= cap && grow_pair(&heap, &last, &cap)) { nomem = 1; break; }
        depth[i] = (int32_t)size;
        parent[i] = size > 0 ? last[size - 1] : -1;
        last[size] = ids[i];
        /* push this event's end key */
        Py_ssize_t at = size++;
        while (at > 0 && heap[(at - 1) / 2] > end[i]) {
            heap[at] = heap[(at - 1) / 2];
            at = (at - 1) / 2;
        }
        heap[at] = end[i];
    }
    self->heap = heap;
    self->last = last;
    self->size = size;
    self->cap = cap;
    self->op_end = op_end;
    self->op_id = op_id;
    self->op_size = op_size;
    self->op_cap = op_cap;
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    result = with_ops ? Py_BuildValue("(OOO)", depth_obj, parent_obj, op_obj)
                      : Py_BuildValue("(OO)", depth_obj, parent_obj);
done:
    Py_XDECREF(depth_obj);
    Py_XDECREF(parent_obj);
    Py_XDECREF(op_obj);
    PyBuffer_Release(&b_new);
    PyBuffer_Release(&b_ts);
    PyBuffer_Release(&b_end);
    PyBuffer_Release(&b_id);
    if (b_kind.obj) PyBuffer_Release(&b_kind);
    if (b_op_end.obj) PyBuffer_Release(&b_op_end);
    return result;
}

static PyMethodDef NESTER_METHODS[] = {
    {"nest", (PyCFunction)nester_nest, METH_VARARGS,
     "nest(new_thread, ts, end_key, event_id[, kind, op_end_key]) -> (depth, parent[, op]): the next sorted\n"
     "host events' nesting; with ``kind``, also each memory instant's op (event id, -1: none)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NesterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracelake.ingest._kineto.Nester",
    .tp_doc = "Depth and parent of sorted host events, fed in batches.",
    .tp_basicsize = sizeof(Nester),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)nester_dealloc,
    .tp_methods = NESTER_METHODS,
};

static PyObject *layout(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    for (int t = 0; t < N_TABLES; t++) {
        PyObject *cols = PyList_New(TABLE_NCOLS[t]);
        if (cols == NULL) { Py_DECREF(out); return NULL; }
        for (int k = 0; k < TABLE_NCOLS[t]; k++)
            PyList_SET_ITEM(cols, k, Py_BuildValue("(ss)", TABLE_SPECS[t][k].name, TYPE_NAMES[TABLE_SPECS[t][k].type]));
        if (PyDict_SetItemString(out, TABLE_NAMES[t], cols)) { Py_DECREF(cols); Py_DECREF(out); return NULL; }
        Py_DECREF(cols);
    }
    return out;
}

static PyObject *set_concrete_ops(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "set_concrete_ops() takes a sequence of str");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    size_t *lens = calloc((size_t)(n ? n : 1), sizeof *lens);
    if (names == NULL || lens == NULL) goto nomem;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(seq, i), &len);
        if (text == NULL) goto fail;
        names[i] = malloc((size_t)len + 1);
        if (names[i] == NULL) goto nomem;
        memcpy(names[i], text, (size_t)len + 1);
        lens[i] = (size_t)len;
    }
    for (Py_ssize_t i = 0; i < n_concrete; i++) free(concrete_names[i]);
    free(concrete_names);
    free(concrete_lens);
    concrete_names = names;
    concrete_lens = lens;
    n_concrete = n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
nomem:
    PyErr_NoMemory();
fail:
    if (names != NULL)
        for (Py_ssize_t i = 0; i < n; i++) free(names[i]);
    free(names);
    free(lens);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *constants(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *args = PyDict_New(), *kinds = PyDict_New(), *not_host = PyList_New(0), *checked = PyList_New(0);
    PyObject *by_name = PyDict_New();
    if (!args || !kinds || !not_host || !checked || !by_name) goto fail;
    for (int a = 0; a < N_ARGS; a++) {
        PyObject *key = PyUnicode_FromString(ARG_KEYS[a]);
        if (key == NULL || PyDict_SetItemString(args, ARG_NAMES[a], key)) { Py_XDECREF(key); goto fail; }
        Py_DECREF(key);
    }
    for (size_t i = 0; i < N_DEVICE_CATS; i++) {
        PyObject *kind = PyUnicode_FromString(DEVICE_CATS[i][1]);
        if (kind == NULL || PyDict_SetItemString(kinds, DEVICE_CATS[i][0], kind)) { Py_XDECREF(kind); goto fail; }
        Py_DECREF(kind);
    }
    for (size_t i = 0; i < N_DEVICE_NAMES; i++) {
        PyObject *key = Py_BuildValue("(ss)", DEVICE_NAMES[i][0], DEVICE_NAMES[i][1]);
        PyObject *kind = PyUnicode_FromString(DEVICE_NAMES[i][2]);
        int failed = key == NULL || kind == NULL || PyDict_SetItem(by_name, key, kind);
        Py_XDECREF(key);
        Py_XDECREF(kind);
        if (failed) goto fail;
    }
    for (size_t i = 0; i < N_NOT_HOST_CATS; i++) {
        PyObject *cat = PyUnicode_FromString(NOT_HOST_CATS[i]);
        if (cat == NULL || PyList_Append(not_host, cat)) { Py_XDECREF(cat); goto fail; }
        Py_DECREF(cat);
    }
    for (int i = 0; i < N_CHECKED; i++) {
        PyObject *name = PyUnicode_FromString(ARG_NAMES[CHECKED_ARGS[i]]);
        if (name == NULL || PyList_Append(checked, name)) { Py_XDECREF(name); goto fail; }
        Py_DECREF(name);
    }
    return Py_BuildValue("{sNsNsNsNsNssss}", "args", args, "kinds", kinds, "kinds_by_name", by_name,
                         "not_host", not_host, "checked", checked, "phases", PHASES, "mtia_cat", MTIA_CAT);
fail:
    Py_XDECREF(args); Py_XDECREF(kinds); Py_XDECREF(not_host); Py_XDECREF(checked); Py_XDECREF(by_name);
    return NULL;
}

PyObject *tracelake_json_array_length(PyObject *self, PyObject *arg); /* _json_check.c */

static PyMethodDef METHODS[] = {
    {"json_array_length", tracelake_json_array_length, METH_O,
     "json_array_length(data) -> int | None: the elements of the JSON array ``data`` is, where a strict\n"
     "check (GIL released) vouches for its syntax; None where msgspec must judge it."},
    {"scan", scan, METH_VARARGS,
     "scan(batch, first, strict=False) -> (tables, events, hip_calls, mtia_ops, counter_events, error)\n\n"
     "Scan a JSON array of trace events whose first has index ``first``. ``strict``: the batch was cut\n"
     "without a check, so check its syntax while reading (problem 'unvouched' where the check would not\n"
     "vouch for it, or where it holds invalid UTF-8). ``tables`` maps each table to its\n"
     "columns as (name, type, length, null count, validity, offsets, data, child length, child null count,\n"
     "child validity), the buffers read-only objects holding the scanner's own memory (no copy), or None;\n"
     "``tables`` is None when ``error`` is (event index, problem, args key, event name, phase)."},
    {"layout", layout, METH_NOARGS, "The tables' columns: {table: [(name, type), ...]}."},
    {"constants", constants, METH_NOARGS, "The args keys, categories and phases the scanner knows."},
    {"set_concrete_ops", set_concrete_ops, METH_O,
     "set_concrete_ops(names): the operators besides c10d:: ones whose Concrete Inputs scans keep."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_kineto", "Native scanner for Kineto trace event batches.", -1, METHODS,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kineto(void) {
    int counts[MAX_ARG_LEN] = {0};
    for (int a = 0; a < N_ARGS; a++) {
        size_t len = strlen(ARG_KEYS[a]);
        ARGS_BY_LEN[len][counts[len]++] = (signed char)a;
    }
    for (int len = 0; len < MAX_ARG_LEN; len++) ARGS_BY_LEN[len][counts[len]] = -1;
    for (const char *c = "0123456789+-.eE"; *c; c++) NUMBER_CHAR[(unsigned char)*c] = 1;
    if (PyType_Ready(&NesterType) < 0 || PyType_Ready(&OwnedType) < 0) return NULL;
    PyObject *module = PyModule_Create(&MODULE);
    if (module == NULL) return NULL;
    Py_INCREF(&NesterType);
    if (PyModule_AddObject(module, "Nester", (PyObject *)&NesterType) < 0) {
        Py_DECREF(&NesterType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
