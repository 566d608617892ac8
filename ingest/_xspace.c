/*
 * The XEvent and XStat decoders of ingest/xspace_events.py, in C: one pass over a window of an
 * XLine's bytes with the GIL released (docs/formats.md, "XLA: .xplane.pb"). The numpy versions
 * there are the reference; where this is not built they run instead, and tests keep the two equal.
 *
 *   find_events(data, size) -> (starts, ends, stop, cut)
 *     The run of events (tag 0x22, a varint length, a body) at the start of data[:size], followed
 *     from the first: each event's length says where the next field begins, and the run ends at
 *     the first field that is not an event, or at an event that does not end inside the window
 *     (cut: true; stop is then that event's tag). starts/ends: each body's bytes, int64.
 *
 *   event_fields(data, starts, ends) -> (metadata_id, offset_ps, duration_ps, num_occurrences,
 *                                        stat_event, stat_start, stat_end) | None
 *     The XEvents data[starts[i]:ends[i]]: each integer field as protobuf reads it (the last one
 *     written; 0 where absent; offset_ps and num_occurrences are a oneof, the one written last
 *     wins), and every stat's body in file order. None when any event is damaged: the numpy
 *     decoder then says where (it reports the same error whichever engine runs).
 *
 *   stat_fields(data, starts, ends) -> (metadata_id, kind, value, start, end) | None
 *     The XStats data[starts[i]:ends[i]]: metadata id; kind, the field number of the value member
 *     written last (0: none); value, its raw 64 bits for a double or an integer; start/end, its
 *     bytes for a string or bytes value (else 0). None when any stat is damaged.
 *
 * Fields not asked for, and asked-for fields of another wire type, are skipped as protobuf skips
 * unknown fields. Every output is a bytearray of int64 (the caller views it with numpy).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EVENT_TAG 0x22
enum { VARINT = 0, I64 = 1, LEN = 2, I32 = 5 };

/* The varint at pos, ending before lim and within 10 bytes (longer values are cut to 64 bits, as
 * protobuf cuts them). Returns 0 and sets *value and *after, or -1. */
static inline int varint(const uint8_t *d, int64_t pos, int64_t lim, uint64_t *value, int64_t *after) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (pos + i >= lim) return -1;
        uint8_t b = d[pos + i];
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *value = v;
            *after = pos + i + 1;
            return 0;
        }
    }
    return -1;
}

/* A growable int64 array, filled with the GIL released. */
typedef struct {
    int64_t *p;
    Py_ssize_t n, cap;
} Vec;

static int push(Vec *v, int64_t x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 1024;
        int64_t *p = realloc(v->p, (size_t)cap * sizeof(int64_t));
        if (p == NULL) return -1;
        v->p = p, v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

/* A bytearray holding n int64s from src (NULL: zeros), or NULL with an exception set. */
static PyObject *ints(const int64_t *src, Py_ssize_t n) {
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (out != NULL && n) {
        char *to = PyByteArray_AS_STRING(out);
        if (src != NULL) memcpy(to, src, (size_t)n * sizeof(int64_t));
        else memset(to, 0, (size_t)n * sizeof(int64_t));
    }
    return out;
}

typedef struct {
    Py_buffer b;
    const int64_t *p;
    Py_ssize_t n;
} Ints;

static int int64s(PyObject *obj, Ints *a) {
    if (PyObject_GetBuffer(obj, &a->b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (a->b.len % 8 != 0) {
        PyBuffer_Release(&a->b);
        PyErr_SetString(PyExc_TypeError, "expected an int64 buffer");
        return -1;
    }
    a->p = (const int64_t *)a->b.buf;
    a->n = a->b.len / 8;
    return 0;
}

/* Parse (data, starts, ends) and check that every message lies inside data. */
static int messages(PyObject *args, Py_buffer *data, Ints *starts, Ints *ends) {
    PyObject *o_data, *o_starts, *o_ends;
    if (!PyArg_ParseTuple(args, "OOO", &o_data, &o_starts, &o_ends)) return -1;
    if (PyObject_GetBuffer(o_data, data, PyBUF_SIMPLE) < 0) return -1;
    if (int64s(o_starts, starts) < 0) {
        PyBuffer_Release(data);
        return -1;
    }
    if (int64s(o_ends, ends) < 0) {
        PyBuffer_Release(&starts->b);
        PyBuffer_Release(data);
        return -1;
    }
    const char *bad = starts->n != ends->n ? "starts and ends differ in length" : NULL;
    for (Py_ssize_t i = 0; bad == NULL && i < starts->n; i++)
        if (starts->p[i] < 0 || ends->p[i] > data->len) bad = "a message lies outside the data";
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        PyBuffer_Release(&ends->b);
        PyBuffer_Release(&starts->b);
        PyBuffer_Release(data);
        return -1;
    }
    return 0;
}

static void release3(Py_buffer *data, Ints *starts, Ints *ends) {
    PyBuffer_Release(&ends->b);
    PyBuffer_Release(&starts->b);
    PyBuffer_Release(data);
}

/* One field of a message at *pos (< lim): its number, wire type and where its value starts and ends.
 * Returns -1 on damage (a truncated or over-long varint, field number 0, an unknown wire type, a
 * field running past lim). For a varint field, *value holds it. */
static inline int next_field(const uint8_t *d, int64_t *pos, int64_t lim, uint64_t *number, int *wire,
                             int64_t *at, int64_t *end, uint64_t *value) {
    uint64_t tag;
    if (varint(d, *pos, lim, &tag, at) < 0) return -1;
    *number = tag >> 3;
    *wire = (int)(tag & 7);
    if (*number == 0) return -1;
    switch (*wire) {
    case VARINT:
        if (varint(d, *at, lim, value, end) < 0) return -1;
        break;
    case LEN: {
        uint64_t length;
        int64_t body;
        if (varint(d, *at, lim, &length, &body) < 0) return -1;
        if (length > (uint64_t)(lim - body)) return -1;
        *at = body;
        *end = body + (int64_t)length;
        break;
    }
    case I64:
        *end = *at + 8;
        break;
    case I32:
        *end = *at + 4;
        break;
    default:
        return -1;
    }
    if (*end > lim) return -1;
    *pos = *end;
    return 0;
}

static PyObject *find_events(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "y*n", &data, &size)) return NULL;
    if (size < 1 || size > data.len || ((const uint8_t *)data.buf)[0] != EVENT_TAG) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "find_events: data must start with an event tag");
        return NULL;
    }
    const uint8_t *d = data.buf;
    Vec starts = {0}, ends = {0};
    int64_t pos = 0, stop = 0;
    int cut = 0, failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {  /* d[pos] is an event tag */
        uint64_t length;
        int64_t body;
        if (varint(d, pos + 1, size, &length, &body) < 0 || length > (uint64_t)(size - body)) {
            stop = pos, cut = 1;
            break;
        }
        int64_t next = body + (int64_t)length;
        if (push(&starts, body) < 0 || push(&ends, next) < 0) {
            failed = 1;
            break;
        }
        if (next < size && d[next] == EVENT_TAG) {
            pos = next;
            continue;
        }
        stop = next;
        break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyObject *out = NULL;
    if (failed) PyErr_NoMemory();
    else {
        PyObject *s = ints(starts.p, starts.n), *e = s ? ints(ends.p, ends.n) : NULL;
        if (s && e) out = Py_BuildValue("(NNLO)", s, e, (long long)stop, cut ? Py_True : Py_False);
        else {
            Py_XDECREF(s);
            Py_XDECREF(e);
        }
    }
    free(starts.p);
    free(ends.p);
    return out;
}

/* What a decoder does with each field of message i (value: a varint field's value), and after the message's last;
 * visit returns -1 when out of memory. */
typedef int (*Visit)(void *state, Py_ssize_t i, uint64_t number, int wire, const uint8_t *d, int64_t at, int64_t end,
                     uint64_t value);
typedef void (*Close)(void *state, Py_ssize_t i);

enum { DONE = 0, DAMAGED = 1, NO_MEMORY = -1 };

/* Every field of every message data[starts[i]:ends[i]], in order, to visit; close after each message. Returns DONE,
 * DAMAGED (the first damaged message ends the walk) or NO_MEMORY. Runs without the GIL. Inlined into each
 * decoder, so that its visit is inlined too: called through the pointer, the decoding took 20-30% longer. */
static inline __attribute__((always_inline)) int walk(const uint8_t *d, const Ints *starts, const Ints *ends,
                                                      Visit visit, Close close, void *state) {
    for (Py_ssize_t i = 0; i < starts->n; i++) {
        int64_t pos = starts->p[i], lim = ends->p[i];
        while (pos < lim) {
            uint64_t number, value = 0;
            int wire;
            int64_t at, end;
            if (next_field(d, &pos, lim, &number, &wire, &at, &end, &value) < 0) return DAMAGED;
            if (visit(state, i, number, wire, d, at, end, value) < 0) return NO_MEMORY;
        }
        close(state, i);
    }
    return DONE;
}

/* Decode (data, starts, ends) with visit/close into k zeroed columns of n int64s (*cols and *count, n the messages'
 * number, are set before the walk; state holds them), then return them and the vecs as bytearrays: a tuple, None
 * for DAMAGED, or NULL with an exception. */
static inline __attribute__((always_inline)) PyObject *decode(PyObject *args, int k, int64_t **cols,
                                                              Py_ssize_t *count, Visit visit, Close close,
                                                              void *state, Vec *vecs, int nvec) {
    Py_buffer data;
    Ints starts, ends;
    if (messages(args, &data, &starts, &ends) < 0) return NULL;
    Py_ssize_t n = *count = starts.n;
    *cols = calloc((size_t)(k * n + 1), sizeof(int64_t));
    int status = NO_MEMORY;
    if (*cols != NULL) {
        Py_BEGIN_ALLOW_THREADS
        status = walk(data.buf, &starts, &ends, visit, close, state);
        Py_END_ALLOW_THREADS
    }
    release3(&data, &starts, &ends);
    PyObject *out = NULL;
    if (status == NO_MEMORY) PyErr_NoMemory();
    else if (status == DAMAGED) out = Py_NewRef(Py_None);
    else if ((out = PyTuple_New(k + nvec)) != NULL) {
        for (int c = 0; c < k + nvec; c++) {
            PyObject *column = c < k ? ints(*cols + c * n, n) : ints(vecs[c - k].p, vecs[c - k].n);
            if (column == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(out, c, column);
        }
    }
    free(*cols);
    for (int v = 0; v < nvec; v++) free(vecs[v].p);
    return out;
}

enum { EV_METADATA_ID = 1, EV_OFFSET_PS = 2, EV_DURATION_PS = 3, EV_STATS = 4, EV_NUM_OCCURRENCES = 5 };

/* The XEvents' columns (metadata_id, offset_ps, duration_ps, num_occurrences), their stats' bodies, and what the
 * current event's oneof holds so far. */
typedef struct {
    int64_t *cols;
    Py_ssize_t n;
    Vec stats[3];  /* event, start, end */
    uint64_t offset, occurrences;
    int64_t at_offset, at_occurrences;
} Events;

static int event_field(void *state, Py_ssize_t i, uint64_t number, int wire, const uint8_t *d, int64_t at,
                       int64_t end, uint64_t value) {
    (void)d;
    Events *e = state;
    if (wire == VARINT) {
        if (number == EV_METADATA_ID) e->cols[i] = (int64_t)value;
        else if (number == EV_OFFSET_PS) e->offset = value, e->at_offset = at;
        else if (number == EV_DURATION_PS) e->cols[2 * e->n + i] = (int64_t)value;
        else if (number == EV_NUM_OCCURRENCES) e->occurrences = value, e->at_occurrences = at;
    } else if (wire == LEN && number == EV_STATS) {
        if (push(&e->stats[0], i) < 0 || push(&e->stats[1], at) < 0 || push(&e->stats[2], end) < 0) return -1;
    }
    return 0;
}

static void event_done(void *state, Py_ssize_t i) {
    Events *e = state;
    if (e->at_occurrences > e->at_offset) e->cols[3 * e->n + i] = (int64_t)e->occurrences;
    else e->cols[e->n + i] = (int64_t)e->offset;
    e->offset = e->occurrences = 0;
    e->at_offset = e->at_occurrences = -1;
}

static PyObject *event_fields(PyObject *self, PyObject *args) {
    (void)self;
    Events e = {.at_offset = -1, .at_occurrences = -1};
    return decode(args, 4, &e.cols, &e.n, event_field, event_done, &e, e.stats, 3);
}

enum { ST_METADATA_ID = 1, ST_DOUBLE = 2, ST_UINT64 = 3, ST_INT64 = 4, ST_STR = 5, ST_BYTES = 6, ST_REF = 7 };

/* The XStats' columns: metadata_id, kind, value, start, end. */
typedef struct {
    int64_t *cols;
    Py_ssize_t n;
} Stats;

static int stat_field(void *state, Py_ssize_t i, uint64_t number, int wire, const uint8_t *d, int64_t at,
                      int64_t end, uint64_t value) {
    Stats *s = state;
    int64_t *md = s->cols, *kind = s->cols + s->n, *raw = s->cols + 2 * s->n, *vstart = s->cols + 3 * s->n,
            *vend = s->cols + 4 * s->n;
    if (wire == VARINT) {
        if (number == ST_METADATA_ID) md[i] = (int64_t)value;
        else if (number == ST_UINT64 || number == ST_INT64 || number == ST_REF)
            kind[i] = (int64_t)number, raw[i] = (int64_t)value;
    } else if (wire == I64 && number == ST_DOUBLE) {
        memcpy(&value, d + at, 8);  /* little-endian, as the wire format */
        kind[i] = ST_DOUBLE, raw[i] = (int64_t)value;
    } else if (wire == LEN && (number == ST_STR || number == ST_BYTES)) {
        kind[i] = (int64_t)number, vstart[i] = at, vend[i] = end;
    }
    return 0;
}

static void stat_done(void *state, Py_ssize_t i) {
    Stats *s = state;
    int64_t kind = s->cols[s->n + i];
    if (kind == ST_STR || kind == ST_BYTES) s->cols[2 * s->n + i] = 0;  /* the value is its bytes */
    else s->cols[3 * s->n + i] = s->cols[4 * s->n + i] = 0;  /* the value is its 64 bits (or none) */
}

static PyObject *stat_fields(PyObject *self, PyObject *args) {
    (void)self;
    Stats s = {0};
    return decode(args, 5, &s.cols, &s.n, stat_field, stat_done, &s, NULL, 0);
}

static PyMethodDef METHODS[] = {
    {"find_events", find_events, METH_VARARGS, "Locate the run of events at the start of a window."},
    {"event_fields", event_fields, METH_VARARGS, "Decode XEvent bodies (None: some are damaged)."},
    {"stat_fields", stat_fields, METH_VARARGS, "Decode XStat bodies (None: some are damaged)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_xspace",
    .m_doc = "The XEvent and XStat decoders, in C.",
    .m_size = -1,
    .m_methods = METHODS,
};

PyMODINIT_FUNC PyInit__xspace(void) { return PyModule_Create(&MODULE); }
