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

enum { EV_METADATA_ID = 1, EV_OFFSET_PS = 2, EV_DURATION_PS = 3, EV_STATS = 4, EV_NUM_OCCURRENCES = 5 };

static PyObject *event_fields(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Ints starts, ends;
    if (messages(args, &data, &starts, &ends) < 0) return NULL;
    const uint8_t *d = data.buf;
    Py_ssize_t n = starts.n;
    int64_t *cols = calloc((size_t)(4 * n + 1), sizeof(int64_t));
    int64_t *md = cols, *offset = cols + n, *duration = cols + 2 * n, *occurrences = cols + 3 * n;
    Vec who = {0}, stat_start = {0}, stat_end = {0};
    int damaged = 0, failed = cols == NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; !failed && !damaged && i < n; i++) {
        int64_t pos = starts.p[i], lim = ends.p[i], at_offset = -1, at_occurrences = -1;
        uint64_t offset_value = 0, occurrences_value = 0;
        while (pos < lim) {
            uint64_t number, value = 0;
            int wire;
            int64_t at, end;
            if (next_field(d, &pos, lim, &number, &wire, &at, &end, &value) < 0) {
                damaged = 1;
                break;
            }
            if (wire == VARINT) {
                if (number == EV_METADATA_ID) md[i] = (int64_t)value;
                else if (number == EV_OFFSET_PS) offset_value = value, at_offset = at;
                else if (number == EV_DURATION_PS) duration[i] = (int64_t)value;
                else if (number == EV_NUM_OCCURRENCES) occurrences_value = value, at_occurrences = at;
            } else if (wire == LEN && number == EV_STATS) {
                if (push(&who, i) < 0 || push(&stat_start, at) < 0 || push(&stat_end, end) < 0) {
                    failed = 1;
                    break;
                }
            }
        }
        if (at_occurrences > at_offset) occurrences[i] = (int64_t)occurrences_value;
        else offset[i] = (int64_t)offset_value;
    }
    Py_END_ALLOW_THREADS
    release3(&data, &starts, &ends);
    PyObject *out = NULL;
    if (failed) PyErr_NoMemory();
    else if (damaged) out = Py_NewRef(Py_None);
    else {
        PyObject *o[7] = {ints(md, n), ints(offset, n), ints(duration, n), ints(occurrences, n),
                          ints(who.p, who.n), ints(stat_start.p, stat_start.n), ints(stat_end.p, stat_end.n)};
        int ok = 1;
        for (int k = 0; k < 7; k++) ok = ok && o[k] != NULL;
        if (ok) out = Py_BuildValue("(NNNNNNN)", o[0], o[1], o[2], o[3], o[4], o[5], o[6]);
        else
            for (int k = 0; k < 7; k++) Py_XDECREF(o[k]);
    }
    free(cols);
    free(who.p);
    free(stat_start.p);
    free(stat_end.p);
    return out;
}

enum { ST_METADATA_ID = 1, ST_DOUBLE = 2, ST_UINT64 = 3, ST_INT64 = 4, ST_STR = 5, ST_BYTES = 6, ST_REF = 7 };

static PyObject *stat_fields(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    Ints starts, ends;
    if (messages(args, &data, &starts, &ends) < 0) return NULL;
    const uint8_t *d = data.buf;
    Py_ssize_t n = starts.n;
    int64_t *cols = calloc((size_t)(5 * n + 1), sizeof(int64_t));
    int64_t *md = cols, *kind = cols + n, *value = cols + 2 * n, *vstart = cols + 3 * n, *vend = cols + 4 * n;
    int damaged = 0, failed = cols == NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; !failed && !damaged && i < n; i++) {
        int64_t pos = starts.p[i], lim = ends.p[i];
        while (pos < lim) {
            uint64_t number, v = 0;
            int wire;
            int64_t at, end;
            if (next_field(d, &pos, lim, &number, &wire, &at, &end, &v) < 0) {
                damaged = 1;
                break;
            }
            if (wire == VARINT) {
                if (number == ST_METADATA_ID) md[i] = (int64_t)v;
                else if (number == ST_UINT64 || number == ST_INT64 || number == ST_REF)
                    kind[i] = (int64_t)number, value[i] = (int64_t)v;
            } else if (wire == I64 && number == ST_DOUBLE) {
                memcpy(&v, d + at, 8);  /* little-endian, as the wire format */
                kind[i] = ST_DOUBLE, value[i] = (int64_t)v;
            } else if (wire == LEN && (number == ST_STR || number == ST_BYTES)) {
                kind[i] = (int64_t)number, vstart[i] = at, vend[i] = end;
            }
        }
        if (kind[i] == ST_STR || kind[i] == ST_BYTES) value[i] = 0;
        else vstart[i] = vend[i] = 0;
    }
    Py_END_ALLOW_THREADS
    release3(&data, &starts, &ends);
    PyObject *out = NULL;
    if (failed) PyErr_NoMemory();
    else if (damaged) out = Py_NewRef(Py_None);
    else {
        PyObject *o[5] = {ints(md, n), ints(kind, n), ints(value, n), ints(vstart, n), ints(vend, n)};
        int ok = 1;
        for (int k = 0; k < 5; k++) ok = ok && o[k] != NULL;
        if (ok) out = Py_BuildValue("(NNNNN)", o[0], o[1], o[2], o[3], o[4]);
        else
            for (int k = 0; k < 5; k++) Py_XDECREF(o[k]);
    }
    free(cols);
    return out;
}

static PyMethodDef METHODS[] = {
    {"find_events", find_events, METH_VARARGS, "Locate the run of events at the start of a window."},
    {"event_fields", event_fields, METH_VARARGS, "Decode XEvent bodies (None: some are damaged)."},
    {"stat_fields", stat_fields, METH_VARARGS, "Decode XStat bodies (None: some are damaged)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_xspace", "The XEvent and XStat decoders, in C.", -1, METHODS,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__xspace(void) { return PyModule_Create(&MODULE); }
