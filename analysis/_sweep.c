/*
 * The two sweeps of a window of device ops the stored analyses make, over arrays given as buffers,
 * each in one pass with the GIL released (docs/analyses.md, "How the stored figures are computed"):
 *
 *   window(ts, dur, code, step, flops, flops_ok, model, model_ok, recomputed, recomputed_ok,
 *          x_start, x_end, x_code, x_step, low, high, work)
 *     The breakdown of one window [low, high) (analysis/breakdown.py, ``BreakdownParts``), from the
 *     columns of its ops, each read once. Op i starts at ts[i] and lasts dur[i] (below 0: unknown, left
 *     out); code[i] is its category (0 compute, 1 communication, 2 memory: bits 1, 2, 4 of the state; 4
 *     other: no bit; 5 not work, left out); step[i] its step (below 0: none). flops, model and
 *     recomputed are its FLOPs, model FLOPs and recomputed model FLOPs, counted where their _ok is
 *     true. The x_ arrays are further intervals: async windows (code 3: bit 8) and those carried from
 *     the window before, with their ends. Every interval ending after high is carried (written to the
 *     start of work, four blocks of len(ts) + len(x_start): start, end, code, step); what lies in
 *     [low, high) of each is swept: starts and ends in time order (stable natural merge sorts, no sort
 *     where already in order), a start before an end at the same time, and the length between two
 *     consecutive points goes to the state sums of the window and, over the step's own intervals alone,
 *     of the step. Each op also widens its step's span and the window's (first start, last end) and adds
 *     its FLOPs. work: int64, 10 times the intervals. Returns (the window's 16 state sums, [(step, its 16
 *     state sums)] for each step swept, [(step or None for the window, first, last, flops, has flops,
 *     model flops, has model flops, recomputed)] for each with ops, the number carried).
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
 * Both raise ValueError on an order, a stream or a category out of range and on arrays of the wrong
 * lengths. The numpy sweeps in analysis/breakdown.py and analysis/idle.py compute the same where this
 * is not built, and tests keep each pair equal.
 */
#include "_buffers.h" /* Python.h first, as Python asks */

#include <stdlib.h>
#include <string.h>

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


/* ---- window(): the breakdown of one window of ops, from its columns (see the module's comment) ---- */

/* What the window keeps per step (and, in `whole`, for the window): sums per state, its sweep and its span. */
typedef struct {
    int64_t value;
    int64_t sums[16];
    Sweep sweep;
    int swept;     /* a useful interval of the step was swept */
    int has_ops;   /* a kept op is in the step: it has a span */
    int64_t first, last;
    double flops, model, recomputed;
    int has_flops, has_model;
} Step;

typedef struct {
    Step *steps;
    Py_ssize_t count, capacity;
    int64_t *slots;   /* open addressing: 1 + index into steps, 0 empty */
    Py_ssize_t mask;
    int64_t last_value, last_index;  /* steps come in runs: the last one found */
} Steps;

static uint64_t mix(int64_t v) {
    uint64_t x = (uint64_t)v * 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 29);
}

/* The index of step `value` (>= 0), added if new; -1 when out of memory. */
static int64_t step_of(Steps *t, int64_t value) {
    if (t->count && value == t->last_value) return t->last_index;
    if (2 * (t->count + 1) > t->mask + 1) {  /* keep the table at most half full */
        Py_ssize_t size = (t->mask + 1) * 2;
        int64_t *slots = calloc((size_t)size, sizeof(int64_t));
        if (slots == NULL) return -1;
        for (Py_ssize_t i = 0; i < t->count; i++) {
            Py_ssize_t at = (Py_ssize_t)(mix(t->steps[i].value) & (uint64_t)(size - 1));
            while (slots[at]) at = (at + 1) & (size - 1);
            slots[at] = i + 1;
        }
        free(t->slots);
        t->slots = slots;
        t->mask = size - 1;
    }
    Py_ssize_t at = (Py_ssize_t)(mix(value) & (uint64_t)t->mask);
    while (t->slots[at]) {
        if (t->steps[t->slots[at] - 1].value == value) {
            t->last_value = value;
            return t->last_index = t->slots[at] - 1;
        }
        at = (at + 1) & t->mask;
    }
    if (t->count == t->capacity) {
        Py_ssize_t capacity = t->capacity ? t->capacity * 2 : 16;
        Step *steps = realloc(t->steps, (size_t)capacity * sizeof(Step));
        if (steps == NULL) return -1;
        t->steps = steps;
        t->capacity = capacity;
    }
    Step *s = &t->steps[t->count];
    memset(s, 0, sizeof(Step));
    s->value = value;
    t->slots[at] = t->count + 1;
    t->last_value = value;
    return t->last_index = t->count++;
}

static void span_add(Step *s, int64_t first, int64_t last, const double *flops, const uint8_t *flops_ok,
                     const double *model, const uint8_t *model_ok, const double *recomputed,
                     const uint8_t *recomputed_ok, Py_ssize_t i) {
    if (!s->has_ops || first < s->first) s->first = first;
    if (!s->has_ops || last > s->last) s->last = last;
    s->has_ops = 1;
    if (flops_ok[i]) s->flops += flops[i], s->has_flops = 1;
    if (model_ok[i]) s->model += model[i], s->has_model = 1;
    if (recomputed_ok[i]) s->recomputed += recomputed[i];
}

/* A stable order of keys[0 .. n) into order, by a natural merge sort (linear on keys already in runs); 1 when
   the keys are in order already (order is then left unwritten), -1 when out of memory, else 0. */
static int order_of(const int64_t *keys, Py_ssize_t n, int64_t *order, int64_t *scratch) {
    Py_ssize_t runs = 1;
    for (Py_ssize_t i = 1; i < n; i++) runs += keys[i - 1] > keys[i];
    if (runs == 1) return 1;
    /* the runs of non-decreasing keys, merged pairwise until one is left */
    Py_ssize_t *bounds = malloc(((size_t)runs + 1) * sizeof(Py_ssize_t));
    if (bounds == NULL) return -1;
    runs = 0;
    bounds[runs++] = 0;
    for (Py_ssize_t i = 1; i < n; i++)
        if (keys[i - 1] > keys[i]) bounds[runs++] = i;
    bounds[runs] = n;
    for (Py_ssize_t i = 0; i < n; i++) order[i] = i;
    int64_t *from = order, *to = scratch;
    while (runs > 1) {
        Py_ssize_t merged = 0;
        for (Py_ssize_t r = 0; r < runs; r += 2) {
            Py_ssize_t lo = bounds[r], mid = bounds[r + 1], hi = r + 2 <= runs ? bounds[r + 2] : mid;
            Py_ssize_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) to[k++] = keys[from[b]] < keys[from[a]] ? from[b++] : from[a++];
            while (a < mid) to[k++] = from[a++];
            while (b < hi) to[k++] = from[b++];
            bounds[merged++] = lo;
        }
        bounds[merged] = n;
        runs = merged;
        int64_t *swap = from;
        from = to;
        to = swap;
    }
    if (from != order) memcpy(order, from, (size_t)n * sizeof(int64_t));
    free(bounds);
    return 0;
}

/* The points of two parts of the intervals in time order: part a (positions 0 .. na) and part b (na .. na + nb),
   each in order already (sorted_) or through its order (order[0 .. na) for a, order[na ..] less na for b). */
typedef struct {
    const int64_t *keys, *order;
    int sorted_a, sorted_b;
    Py_ssize_t a, na, b, nb;
} Points;

/* The position of the next point (of part a at a tie), -1 when none is left. */
static inline int64_t next_of(const Points *p) {
    int64_t x = p->a < p->na ? (p->sorted_a ? p->a : p->order[p->a]) : -1;
    int64_t y = p->b < p->nb ? p->na + (p->sorted_b ? p->b : p->order[p->na + p->b]) : -1;
    if (x < 0) return y;
    return y >= 0 && p->keys[y] < p->keys[x] ? y : x;
}

static inline void advance(Points *p, int64_t position) {
    if (position < p->na) p->a++;
    else p->b++;
}

static PyObject *span_tuple(const Step *s, int whole) {
    PyObject *step = whole ? Py_NewRef(Py_None) : PyLong_FromLongLong(s->value);
    if (step == NULL) return NULL;
    return Py_BuildValue("(NLLdidid)", step, (long long)s->first, (long long)s->last, s->flops, s->has_flops,
                         s->model, s->has_model, s->recomputed);
}

static PyObject *sums_list(const int64_t *sums) {
    PyObject *out = PyList_New(16);
    if (out == NULL) return NULL;
    for (int i = 0; i < 16; i++) {
        PyObject *v = PyLong_FromLongLong(sums[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

#define WINDOW_ARRAYS 15

static PyObject *window(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[WINDOW_ARRAYS];
    long long low, high;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOLLO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &low, &high, &o[14]))
        return NULL;
    /* ts dur code step | flops flops_ok model model_ok recomputed recomputed_ok | extra start end code step | work */
    static const char kinds[WINDOW_ARRAYS] = {'q', 'q', 'q', 'q', 'd', '?', 'd', '?', 'd', '?', 'q', 'q', 'q', 'q',
                                              'q'};
    Arr a[WINDOW_ARRAYS];
    int got = 0;
    for (; got < WINDOW_ARRAYS; got++)
        if ((kinds[got] == 'q' ? arr(o[got], &a[got], got == 14) : typed(o[got], &a[got], kinds[got])) < 0) {
            release(a, got);
            return NULL;
        }
    Py_ssize_t n = a[0].n, m = a[10].n, cap = n + m;
    int equal = a[14].n >= 10 * cap;
    for (int i = 1; i < 10; i++) equal &= a[i].n == n;
    for (int i = 11; i < 14; i++) equal &= a[i].n == m;
    if (!equal) {
        release(a, WINDOW_ARRAYS);
        PyErr_SetString(PyExc_ValueError, "window: arrays of unequal lengths, or too little work space");
        return NULL;
    }
    const int64_t *ts = a[0].p, *dur = a[1].p, *code = a[2].p, *step = a[3].p;
    const double *flops = (const double *)a[4].b.buf, *model = (const double *)a[6].b.buf,
                 *recomputed = (const double *)a[8].b.buf;
    const uint8_t *flops_ok = a[5].b.buf, *model_ok = a[7].b.buf, *recomputed_ok = a[9].b.buf;
    const int64_t *x_start = a[10].p, *x_end = a[11].p, *x_code = a[12].p, *x_step = a[13].p;
    /* the work space: the carried intervals (start, end, code, step), then per useful interval its clipped start,
       clipped end, step index (-1: none) + 1 << 3 | code (the ops', then the others'), and the orders of the starts
       and the ends where they are not in order (each part apart) */
    int64_t *w = a[14].p;
    int64_t *c_start = w, *c_end = w + cap, *c_code = w + 2 * cap, *c_step = w + 3 * cap;
    int64_t *cs = w + 4 * cap, *ce = w + 5 * cap, *packed = w + 6 * cap, *o_start = w + 7 * cap,
            *o_end = w + 8 * cap, *scratch = w + 9 * cap;
    Steps table = {NULL, 0, 0, calloc(16, sizeof(int64_t)), 15, 0, 0};
    Step whole;
    memset(&whole, 0, sizeof(Step));
    Py_ssize_t carried = 0, useful = 0, useful_ops = 0;  /* the ops come first among the useful intervals */
    const char *bad = NULL;
    if (table.slots == NULL) {
        release(a, WINDOW_ARRAYS);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < cap && bad == NULL; i++) {
        int extra = i >= n;
        Py_ssize_t j = extra ? i - n : i;
        int64_t c = extra ? x_code[j] : code[j], value = extra ? x_step[j] : step[j];
        if (c < 0 || c > 5 || (!extra && c == 3)) {
            bad = "a category out of range";
            break;
        }
        if (c == 5) continue;  /* sync, or no category: not work */
        int64_t s = extra ? x_start[j] : ts[j], e;
        if (extra) {
            e = x_end[j];
        } else {
            if (dur[j] < 0) continue;  /* no duration */
            e = s + dur[j];
        }
        int64_t k = -1;
        if (value >= 0 && (k = step_of(&table, value)) < 0) {
            bad = "out of memory";
            break;
        }
        if (!extra) {
            span_add(&whole, s, e, flops, flops_ok, model, model_ok, recomputed, recomputed_ok, j);
            if (k >= 0)
                span_add(&table.steps[k], s, e, flops, flops_ok, model, model_ok, recomputed, recomputed_ok, j);
        }
        if (e > high) {  /* runs into the next window: carried there whole */
            c_start[carried] = s, c_end[carried] = e, c_code[carried] = c, c_step[carried] = value < 0 ? -1 : value;
            carried++;
        }
        int64_t from = s > low ? s : low, to = e < high ? e : high;
        if (to <= from) continue;  /* nothing of it in the window */
        cs[useful] = from, ce[useful] = to, packed[useful] = (k + 1) << 3 | c;
        useful++;
        useful_ops += !extra;
    }
    /* the ops' points and the other intervals' apart: the ops' starts (and on a TPU line their ends) are most often
       in order already, and a few others would otherwise make them all be sorted */
    Py_ssize_t nb = useful - useful_ops;
    int sa = bad == NULL ? order_of(cs, useful_ops, o_start, scratch) : 0,
        sb = bad == NULL ? order_of(cs + useful_ops, nb, o_start + useful_ops, scratch) : 0,
        ea = bad == NULL ? order_of(ce, useful_ops, o_end, scratch) : 0,
        eb = bad == NULL ? order_of(ce + useful_ops, nb, o_end + useful_ops, scratch) : 0;
    if (sa < 0 || sb < 0 || ea < 0 || eb < 0) bad = "out of memory";
    if (bad == NULL) {
        Points starts = {cs, o_start, sa, sb, 0, useful_ops, 0, nb}, ends = {ce, o_end, ea, eb, 0, useful_ops, 0, nb};
        for (;;) {
            int64_t s = next_of(&starts), e = next_of(&ends);
            if (s < 0 && e < 0) break;
            int is_start = e < 0 || (s >= 0 && cs[s] <= ce[e]);  /* a start before an end at the same time */
            int64_t at = is_start ? s : e, t = is_start ? cs[s] : ce[e];
            advance(is_start ? &starts : &ends, at);
            int64_t k = (packed[at] >> 3) - 1;
            int c = (int)(packed[at] & 7);
            step_to(&whole.sweep, whole.sums, t, c, is_start);
            if (k >= 0) {
                table.steps[k].swept = 1;
                step_to(&table.steps[k].sweep, table.steps[k].sums, t, c, is_start);
            }
        }
    }
    Py_END_ALLOW_THREADS
    free(table.slots);
    release(a, WINDOW_ARRAYS);
    PyObject *result = NULL;
    if (bad != NULL) {
        PyErr_Format(strcmp(bad, "out of memory") ? PyExc_ValueError : PyExc_MemoryError, "window: %s", bad);
    } else {
        /* (whole's state sums, [(step, state sums)], [spans: (step, first, last, flops, has_flops, model,
           has_model, recomputed)], the number carried) */
        PyObject *steps = PyList_New(0), *spans = PyList_New(0), *sums = sums_list(whole.sums);
        int failed = steps == NULL || spans == NULL || sums == NULL;
        if (!failed && whole.has_ops) {
            PyObject *span = span_tuple(&whole, 1);
            failed = span == NULL || PyList_Append(spans, span) < 0;
            Py_XDECREF(span);
        }
        for (Py_ssize_t k = 0; k < table.count && !failed; k++) {
            const Step *s = &table.steps[k];
            if (s->swept) {
                PyObject *row = Py_BuildValue("(LN)", (long long)s->value, sums_list(s->sums));
                failed = row == NULL || PyList_Append(steps, row) < 0;
                Py_XDECREF(row);
            }
            if (!failed && s->has_ops) {
                PyObject *span = span_tuple(s, 0);
                failed = span == NULL || PyList_Append(spans, span) < 0;
                Py_XDECREF(span);
            }
        }
        if (!failed) result = Py_BuildValue("(OOOn)", sums, steps, spans, carried);
        Py_XDECREF(steps);
        Py_XDECREF(spans);
        Py_XDECREF(sums);
    }
    free(table.steps);
    return result;
}

static PyMethodDef METHODS[] = {
    {"window", window, METH_VARARGS, "The breakdown of one window of ops from its columns (see the module's comment)."},
    {"idle", idle, METH_VARARGS, "The idle gaps per stream of one window (see the module's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_sweep", "The stored analyses' sweeps of a window.", -1, METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sweep(void) { return PyModule_Create(&MODULE); }
