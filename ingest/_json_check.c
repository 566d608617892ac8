/* A strict JSON syntax check of one array of trace events, for ingest/chrome_json.py (the check
 * itself is in _json_check.h, which the scanner shares).
 *
 * The batch cutter must know that a batch is valid JSON before the scanner reads it. msgspec
 * did that by decoding the batch into a list of raw values, holding the GIL, at about a third
 * of the time of the whole first phase on real-shaped traces. This check does the same work
 * without the GIL. It accepts a subset of what msgspec accepts (RFC 8259 JSON, arrays and
 * objects nested at most MAX_DEPTH deep, no \u escape of a UTF-16 surrogate): whatever it
 * refuses goes to msgspec, which accepts it or says exactly where it goes wrong. So the check
 * never changes what is accepted or the error a user sees (docs/formats.md, section 1).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_json_check.h"

/* The number of elements of the array that is the whole of ``buf`` (whitespace around it
 * allowed), or -1 where the check does not vouch for it. */
static Py_ssize_t count_elements(const unsigned char *buf, Py_ssize_t len) {
    Cursor c = {buf, buf + len};
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '[') return -1;
    c.p++;
    skip_ws(&c);
    if (c.p < c.end && *c.p == ']') {
        c.p++;
        skip_ws(&c);
        return c.p == c.end ? 0 : -1;
    }
    int64_t count = 1;
    if (!check_value(&c, 1) || !check_array_rest(&c, &count)) return -1;
    return (Py_ssize_t)count;
}

PyObject *tracelake_json_array_length(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS
    count = count_elements((const unsigned char *)view.buf, view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (count < 0) Py_RETURN_NONE;
    return PyLong_FromSsize_t(count);
}
