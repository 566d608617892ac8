/*
 * The two sweeps of a window of device ops the stored analyses make, over int64 arrays given as
 * buffers, each in one pass with the GIL released (docs/analyses.md, "How the stored figures are
 * computed"):
 *
 *   breakdown(start, end, packed, o_start, o_end, whole, steps)
 *     The breakdown's sweep (analysis/breakdown.py, ``_sweeps``). Interval i runs from start[i] to
 *     end[i]; packed[i] = step << 4 | code << 1, where step is the interval's step index (0 .. S-1, or
 *     S for none: S = len(steps) / 16) and code its category (0 compute, 1 communication, 2 memory,
 *     3 async window: bits 1, 2, 4, 8 of the state; 4 other: no bit). o_start and o_end order the
 *     starts and the ends in time (stable sorts). The starts and ends are merged in time order, a
 *     start before an end at the same time. Between two consecutive points the state (the categories
 *     with an active interval) is constant: the segment's length is added to whole[state]. Each step
 *     is swept over its own intervals alone: the length between two consecutive points of step k is
 *     added to steps[k * 16 + its state]. Adds to whole and steps in place.
 *
 *   idle(order, stream, ts, end, has_launch, launch, known, before, kernel_wait, out)
 *     The idle gaps per stream (analysis/idle.py, ``_one_rank``). Op i runs on stream index stream[i]
 *     (0 .. S-1, S = len(known)) from ts[i] to end[i]; launch[i] is when its runtime call started,
 *     where has_launch[i]. order puts the ops in (ts, end) order. A stream's ops are taken in that
 *     order; an op's previous end is the latest end of the stream's earlier ops (and before[s], where
 *     known[s]: the stream's latest end in earlier windows). A gap is an op starting after its
 *     previous end (the stream's first op has none unless known); it is host_wait when the launch
 *     came after the previous end, else kernel_wait when at most kernel_wait long, else other.
 *     Writes out[s * 9 ..]: ops, op_ns, gaps, idle_ns, host_wait_ns, kernel_wait_ns, other_ns, the
 *     latest end, and the position of the stream's first op (-1 for a stream without ops).
 *
 * Both raise ValueError on an order, stream, step or category out of range. The numpy sweeps in
 * analysis/breakdown.py and analysis/idle.py compute the same where this is not built, and tests keep
 * each pair equal.
 */
#include "_int64_buffers.h" /* Python.h first, as Python asks */

#include <stdlib.h>

/* One running sweep: the active intervals per category, the state they make, the last point's time. */
typedef struct {
    int64_t count[4];
    int64_t last;
    int state;
    int seen;
} Sweep;

/* Adds the segment since the sweep's last point to sums[state], then moves the sweep past a point. */
static inline void step_to(Sweep *s, int64_t *sums, int64_t t, int code, int is_start) {
    if (s->seen) sums[s->state] += t - s->last;
    s->seen = 1;
    s->last = t;
    if (code < 4) {
        s->count[code] += is_start ? 1 : -1;
        s->state = (s->state & ~(1 << code)) | ((s->count[code] != 0) << code);
    }
}

static PyObject *breakdown(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6])) return NULL;
    Arr a[7];
    int got = 0;
    for (; got < 7; got++)
        if (arr(o[got], &a[got], got >= 5) < 0) {
            release(a, got);
            return NULL;
        }
    const int64_t *start = a[0].p, *end = a[1].p, *packed = a[2].p, *o_start = a[3].p, *o_end = a[4].p;
    int64_t *whole = a[5].p, *steps = a[6].p;
    Py_ssize_t n = a[0].n, nsteps = a[6].n / 16;
    if (a[1].n != n || a[2].n != n || a[3].n != n || a[4].n != n || a[5].n != 16 || a[6].n % 16 != 0) {
        release(a, 7);
        PyErr_SetString(PyExc_ValueError, "breakdown: arrays of unequal lengths");
        return NULL;
    }
    Sweep *per = calloc((size_t)nsteps + 1, sizeof(Sweep));
    if (per == NULL) {
        release(a, 7);
        return PyErr_NoMemory();
    }
    const char *bad = NULL;
    Py_BEGIN_ALLOW_THREADS
    Sweep all = {{0, 0, 0, 0}, 0, 0, 0};
    Py_ssize_t i = 0, j = 0;
    while (i < n || j < n) {
        int64_t s = i < n ? o_start[i] : 0, e = j < n ? o_end[j] : 0;
        if (s < 0 || s >= n || e < 0 || e >= n) {
            bad = "an order out of range";
            break;
        }
        int is_start = j >= n || (i < n && start[s] <= end[e]);  /* a start before an end at the same time */
        int64_t at = is_start ? s : e, t = is_start ? start[s] : end[e];
        i += is_start, j += !is_start;
        int64_t p = packed[at], k = p >> 4;
        int code = (int)((p >> 1) & 7);
        if (k < 0 || k > nsteps || code > 4) {
            bad = "a step or category out of range";
            break;
        }
        step_to(&all, whole, t, code, is_start);
        if (k < nsteps) step_to(&per[k], steps + k * 16, t, code, is_start);
    }
    Py_END_ALLOW_THREADS
    free(per);
    release(a, 7);
    if (bad != NULL) {
        PyErr_Format(PyExc_ValueError, "breakdown: %s", bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *idle(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[9];
    long long kernel_wait;
    if (!PyArg_ParseTuple(args, "OOOOOOOOLO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &kernel_wait,
                          &o[8]))
        return NULL;
    Arr a[9];
    int got = 0;
    for (; got < 9; got++)
        if (arr(o[got], &a[got], got == 8) < 0) {
            release(a, got);
            return NULL;
        }
    const int64_t *order = a[0].p, *stream = a[1].p, *ts = a[2].p, *end = a[3].p, *has_launch = a[4].p,
                  *launch = a[5].p, *known = a[6].p, *before = a[7].p;
    int64_t *out = a[8].p;
    Py_ssize_t n = a[0].n, streams = a[6].n;
    if (a[1].n != n || a[2].n != n || a[3].n != n || a[4].n != n || a[5].n != n || a[7].n != streams ||
        a[8].n != streams * 9) {
        release(a, 9);
        PyErr_SetString(PyExc_ValueError, "idle: arrays of unequal lengths");
        return NULL;
    }
    const char *bad = NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t s = 0; s < streams; s++) {
        int64_t *row = out + s * 9;
        for (int c = 0; c < 7; c++) row[c] = 0;
        row[7] = before[s];
        row[8] = -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = order[i];
        if (at < 0 || at >= n) {
            bad = "an order out of range";
            break;
        }
        int64_t s = stream[at];
        if (s < 0 || s >= streams) {
            bad = "a stream out of range";
            break;
        }
        int64_t *row = out + s * 9;
        int first = row[8] < 0;
        int earlier = !first || known[s];  /* an end to measure a gap from */
        int64_t previous = first ? (known[s] ? before[s] : 0) : row[7];
        if (first) row[8] = at;
        row[0] += 1;
        row[1] += end[at] - ts[at];
        if (earlier && ts[at] > previous) {
            int64_t gap = ts[at] - previous;
            row[2] += 1;
            row[3] += gap;
            if (has_launch[at] && launch[at] > previous) row[4] += gap;
            else if (gap <= kernel_wait) row[5] += gap;
            else row[6] += gap;
        }
        int64_t latest = first && !known[s] ? end[at] : (end[at] > row[7] ? end[at] : row[7]);
        row[7] = latest;
    }
    Py_END_ALLOW_THREADS
    release(a, 9);
    if (bad != NULL) {
        PyErr_Format(PyExc_ValueError, "idle: %s", bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"breakdown", breakdown, METH_VARARGS, "The breakdown's sweep of one window (see the module's comment)."},
    {"idle", idle, METH_VARARGS, "The idle gaps per stream of one window (see the module's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_sweep", "The stored analyses' sweeps of a window.", -1, METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sweep(void) { return PyModule_Create(&MODULE); }
