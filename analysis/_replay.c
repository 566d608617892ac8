/*
 * The two loops of the critical-path replay (analysis/critical_path.py; docs/analyses.md,
 * "Critical path"), over int64 arrays given as buffers:
 *
 *   replay(order, ptr, src, ws, w0, step_of, slack, t, choice, step)
 *     For each node v of `order` (one step's nodes in topological order) with in-edges
 *     ptr[v]..ptr[v+1] (edges by target; src[e] their sources): t[v] = the latest
 *     t[src[e]] + weight over them, plus slack[v], where the weight is ws[e] when the
 *     source belongs to `step` (step_of) and w0[e] otherwise (an edge into the step keeps
 *     its measured weight); choice[v] = that edge. Nodes without in-edges keep t[v].
 *     Writes t and choice in place.
 *
 *   walk(v, start, t, choice, src, ws, w0, step_of, step, rank, slack_kind, slack_label,
 *        edge_of, kind, label, out_rank, out_kind, out_label, out_start, out_dur, out_node,
 *        idle)
 *     From node v back through choice to the step's start: per node its slack stretch
 *     (t[v] beyond what its latest in-edge reached) and the edge's own stretch, each
 *     clipped at `start`; before a node without in-edges, an `idle` stretch from `start`.
 *     Writes the stretches latest first into the out_* buffers (room for 2 per node + 1)
 *     and returns how many.
 *
 * The Python versions in analysis/critical_path.py do the same where this is not built.
 */
#include "_buffers.h"

static PyObject *replay(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[9];
    long long step;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOL", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &step))
        return NULL;
    Arr a[9];
    int got = 0;
    for (; got < 9; got++)
        if (arr(o[got], &a[got], got >= 7) < 0) {
            release(a, got);
            return NULL;
        }
    const int64_t *order = a[0].p, *ptr = a[1].p, *src = a[2].p, *ws = a[3].p, *w0 = a[4].p, *step_of = a[5].p,
                  *slack = a[6].p;
    int64_t *t = a[7].p, *choice = a[8].p;
    Py_ssize_t nodes = a[7].n, edges = a[2].n;
    for (Py_ssize_t i = 0; i < a[0].n; i++) {
        int64_t v = order[i];
        if (v < 0 || v >= nodes) continue;
        int64_t lo = ptr[v], hi = ptr[v + 1];
        if (lo >= hi || hi > edges) continue;
        int64_t best = 0, arg = -1;
        for (int64_t e = lo; e < hi; e++) {
            int64_t u = src[e];
            int64_t x = t[u] + (step_of[u] == step ? ws[e] : w0[e]);
            if (arg < 0 || x > best) {
                best = x;
                arg = e;
            }
        }
        t[v] = best + slack[v];
        choice[v] = arg;
    }
    release(a, 9);
    Py_RETURN_NONE;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[19];
    long long v, start, step, idle;
    if (!PyArg_ParseTuple(args, "LLOOOOOOLOOOOOOOOOOOOL", &v, &start, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &step, &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16],
                          &o[17], &idle))
        return NULL;
    Arr a[18];
    int got = 0;
    for (; got < 18; got++)
        if (arr(o[got], &a[got], got >= 12) < 0) {
            release(a, got);
            return NULL;
        }
    const int64_t *t = a[0].p, *choice = a[1].p, *src = a[2].p, *ws = a[3].p, *w0 = a[4].p, *step_of = a[5].p,
                  *rank = a[6].p, *slack_kind = a[7].p, *slack_label = a[8].p, *edge_of = a[9].p, *kind = a[10].p,
                  *label = a[11].p;
    int64_t *out_rank = a[12].p, *out_kind = a[13].p, *out_label = a[14].p, *out_start = a[15].p,
            *out_dur = a[16].p, *out_node = a[17].p;
    Py_ssize_t room = a[12].n, count = 0;
    for (Py_ssize_t guard = 0; guard <= a[0].n && count + 2 <= room; guard++) {
        int64_t e = choice[v], r = rank[v];
        if (e < 0) {
            if (t[v] > start) {
                out_rank[count] = r, out_kind[count] = idle, out_label[count] = -1;
                out_start[count] = start, out_dur[count] = t[v] - start, out_node[count] = -1;
                count++;
            }
            break;
        }
        int64_t u = src[e], edge = edge_of[e];
        int64_t w = step_of[u] == step ? ws[e] : w0[e];
        int64_t reach = t[u] + w;
        if (t[v] > reach) {
            int64_t lo = reach > start ? reach : start;
            if (t[v] > lo) {
                out_rank[count] = r, out_kind[count] = slack_kind[v], out_label[count] = slack_label[v];
                out_start[count] = lo, out_dur[count] = t[v] - lo, out_node[count] = v;
                count++;
            }
        }
        if (w > 0 && reach > start) {
            int64_t lo = t[u] > start ? t[u] : start;
            out_rank[count] = r >= 0 ? r : rank[u], out_kind[count] = kind[edge], out_label[count] = label[edge];
            out_start[count] = lo, out_dur[count] = reach - lo, out_node[count] = v;
            count++;
        }
        if (t[u] <= start) break;
        v = u;
    }
    release(a, 18);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef METHODS[] = {
    {"replay", replay, METH_VARARGS, "Replay one step's nodes in place (see the module's comment)."},
    {"walk", walk, METH_VARARGS, "The critical path's stretches from a node back to the step's start."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_replay", "The critical-path replay's loops.", -1, METHODS,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&MODULE); }
