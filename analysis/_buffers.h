/*
 * Arrays handed to the analyses' C loops (_replay.c, _sweep.c) as buffers: numpy's, C-contiguous.
 * arr() takes an int64 one (writable where asked), refusing any buffer whose items are not 8-byte integers;
 * typed() takes one of float64 ('d') or bool ('?') items the same way; release() lets go of the first
 * `count` taken.
 */
#ifndef TRACELAKE_BUFFERS_H
#define TRACELAKE_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    Py_buffer b;
    int64_t *p;
    Py_ssize_t n;
} Arr;

static int arr(PyObject *obj, Arr *a, int writable) {
    if (PyObject_GetBuffer(obj, &a->b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (a->b.itemsize != 8 || a->b.len % 8 != 0 || (a->b.format && a->b.format[0] != 'q' && a->b.format[0] != 'l')) {
        PyBuffer_Release(&a->b);
        PyErr_SetString(PyExc_TypeError, "expected an int64 buffer");
        return -1;
    }
    a->p = (int64_t *)a->b.buf;
    a->n = a->b.len / 8;
    return 0;
}

static int typed(PyObject *obj, Arr *a, char kind) {
    Py_ssize_t size = kind == 'd' ? 8 : 1;
    if (PyObject_GetBuffer(obj, &a->b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (a->b.itemsize != size || a->b.len % size != 0 || a->b.format == NULL || a->b.format[0] != kind ||
        a->b.format[1] != '\0') {
        PyBuffer_Release(&a->b);
        PyErr_Format(PyExc_TypeError, "expected a buffer of '%c' items", kind);
        return -1;
    }
    a->p = (int64_t *)a->b.buf;
    a->n = a->b.len / size;
    return 0;
}

static void release(Arr *a, int count) {
    for (int i = 0; i < count; i++) PyBuffer_Release(&a[i].b);
}

#endif
