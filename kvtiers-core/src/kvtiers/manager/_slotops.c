/* kvtiers.manager._slotops: the CPU pool's per-block loops over hold counts and
 * slot states, in C. Optional: kvtiers.manager.slotops has the same functions in
 * Python and uses these when they were built (setup.py).
 *
 * hold(holds, keys, slots) -> list
 *     holds[slot] += 1 for each slot; returns the keys (keys[i] for slots[i]) whose
 *     count went from 0 to 1, in order.
 * release(holds, keys, slots) -> list
 *     holds[slot] -= 1 for each slot that is not None; returns the keys whose count
 *     reached 0, in order. A count already 0 raises AssertionError (the counts
 *     before it have been changed, as the Python loop leaves them).
 * fill(buffer, slots, value) -> None
 *     buffer[slot] = value for each slot (a writable buffer of bytes).
 *
 * `holds` is a writable C-contiguous buffer of 4-byte ints (array('i')); `keys` and
 * `slots` are lists of equal length; every slot must be an int in range (checked).
 * Scheduler thread only, like the table that calls them; the GIL is held. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s must hold %zd-byte items", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int slot_at(PyObject *slots, Py_ssize_t i, Py_ssize_t n, Py_ssize_t *out) {
    PyObject *o = PyList_GET_ITEM(slots, i);
    Py_ssize_t s = PyLong_AsSsize_t(o);
    if (s == -1 && PyErr_Occurred())
        return -1;
    if (s < 0 || s >= n) {
        PyErr_Format(PyExc_IndexError, "slot %zd out of range 0..%zd", s, n - 1);
        return -1;
    }
    *out = s;
    return 0;
}

static int check_lists(PyObject *keys, PyObject *slots) {
    if (!PyList_Check(keys) || !PyList_Check(slots)) {
        PyErr_SetString(PyExc_TypeError, "keys and slots must be lists");
        return -1;
    }
    if (PyList_GET_SIZE(keys) != PyList_GET_SIZE(slots)) {
        PyErr_SetString(PyExc_ValueError, "keys and slots differ in length");
        return -1;
    }
    return 0;
}

static PyObject *slotops_hold(PyObject *self, PyObject *args) {
    PyObject *buf, *keys, *slots;
    if (!PyArg_ParseTuple(args, "OO!O!:hold", &buf, &PyList_Type, &keys, &PyList_Type, &slots))
        return NULL;
    if (check_lists(keys, slots) < 0)
        return NULL;
    Py_buffer view;
    if (get_buffer(buf, &view, 4, "holds") < 0)
        return NULL;
    int32_t *holds = (int32_t *)view.buf;
    Py_ssize_t n = view.len / 4, len = PyList_GET_SIZE(slots);
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_ssize_t s;
        if (slot_at(slots, i, n, &s) < 0)
            goto fail;
        if (holds[s]++ == 0 && PyList_Append(fresh, PyList_GET_ITEM(keys, i)) < 0)
            goto fail;
    }
    PyBuffer_Release(&view);
    return fresh;
fail:
    Py_XDECREF(fresh);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *slotops_release(PyObject *self, PyObject *args) {
    PyObject *buf, *keys, *slots;
    if (!PyArg_ParseTuple(args, "OO!O!:release", &buf, &PyList_Type, &keys, &PyList_Type, &slots))
        return NULL;
    if (check_lists(keys, slots) < 0)
        return NULL;
    Py_buffer view;
    if (get_buffer(buf, &view, 4, "holds") < 0)
        return NULL;
    int32_t *holds = (int32_t *)view.buf;
    Py_ssize_t n = view.len / 4, len = PyList_GET_SIZE(slots);
    PyObject *last = PyList_New(0);
    if (last == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (PyList_GET_ITEM(slots, i) == Py_None)
            continue;
        Py_ssize_t s;
        if (slot_at(slots, i, n, &s) < 0)
            goto fail;
        if (holds[s] <= 0) {
            PyErr_Format(PyExc_AssertionError, "slot %zd: hold count below zero", s);
            goto fail;
        }
        if (--holds[s] == 0 && PyList_Append(last, PyList_GET_ITEM(keys, i)) < 0)
            goto fail;
    }
    PyBuffer_Release(&view);
    return last;
fail:
    Py_XDECREF(last);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *slotops_fill(PyObject *self, PyObject *args) {
    PyObject *buf, *slots;
    int value;
    if (!PyArg_ParseTuple(args, "OO!i:fill", &buf, &PyList_Type, &slots, &value))
        return NULL;
    if (value < 0 || value > 255) {
        PyErr_SetString(PyExc_ValueError, "value must be a byte");
        return NULL;
    }
    Py_buffer view;
    if (get_buffer(buf, &view, 1, "buffer") < 0)
        return NULL;
    uint8_t *bytes = (uint8_t *)view.buf;
    Py_ssize_t n = view.len, len = PyList_GET_SIZE(slots);
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_ssize_t s;
        if (slot_at(slots, i, n, &s) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        bytes[s] = (uint8_t)value;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"hold", slotops_hold, METH_VARARGS, "holds[s] += 1 per slot; the keys whose count was 0."},
    {"release", slotops_release, METH_VARARGS,
     "holds[s] -= 1 per slot not None; the keys whose count reached 0."},
    {"fill", slotops_fill, METH_VARARGS, "buffer[s] = value per slot."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slotops", NULL, -1, methods};

PyMODINIT_FUNC PyInit__slotops(void) { return PyModule_Create(&module); }
