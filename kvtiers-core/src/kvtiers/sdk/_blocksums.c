/* kvtiers.sdk._blocksums: the checksums of many pool blocks in one call, without the GIL.
 *
 * A verifying tier that lands thousands of small blocks per job (32 KiB KV blocks
 * pulled from a peer) spent more time calling the hash once per block from Python,
 * holding the GIL, than hashing: these take the whole batch in C and let the other
 * threads (the event loop, the copier moving the next blocks) run meanwhile.
 *
 * The hash is xxHash's XXH3-64 from the `xxhash` package's own extension module
 * (found at import with dlsym: it exports its API), so the values are those of
 * kvtiers.sdk.integrity.checksum by construction; a build of xxhash that does not
 * export it makes the import fail and kvtiers uses its Python path.
 *
 * sum_slots(base, stride, length, count, slots) -> list[int]
 *     The XXH3-64 of `length` bytes at base + slot * stride for each slot of
 *     `slots` (0 <= slot < count, else IndexError and nothing is hashed).
 * land_slots(base, stride, length, count, slots, buffers) -> list[int]
 *     Copy buffers[i] (exactly `length` bytes each, else ValueError and nothing is
 *     copied) into slot slots[i] and return each block's XXH3-64, taken right after
 *     its copy while the bytes are in the cache.
 *
 * The caller guarantees that base..base + count * stride is one live, writable
 * region (a PoolView's buffer, kept alive across the call) and that no buffer
 * overlaps a destination slot. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef uint64_t (*xxh3_fn)(const void *, size_t);
static xxh3_fn xxh3 = NULL;

/* The slot numbers of `seq` as C integers, each checked against `count`. */
static Py_ssize_t *slot_numbers(PyObject *seq, Py_ssize_t count, Py_ssize_t *n_out) {
    PyObject *fast = PySequence_Fast(seq, "slots must be a sequence of integers");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t *idx = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
    if (idx == NULL) { Py_DECREF(fast); PyErr_NoMemory(); return NULL; }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(items[i]);
        if (v == -1 && PyErr_Occurred()) goto fail;
        if (v < 0 || v >= count) {
            PyErr_Format(PyExc_IndexError, "slot %zd out of range 0..%zd", v, count - 1);
            goto fail;
        }
        idx[i] = v;
    }
    Py_DECREF(fast);
    *n_out = n;
    return idx;
fail:
    Py_DECREF(fast);
    PyMem_Free(idx);
    return NULL;
}

static PyObject *as_list(const uint64_t *sums, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(sums[i]);
        if (v == NULL) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static int check_region(unsigned long long base, Py_ssize_t stride, Py_ssize_t length,
                        Py_ssize_t count) {
    if (base == 0 || stride < 1 || length < 0 || length > stride || count < 0) {
        PyErr_Format(PyExc_ValueError,
                     "a region needs base != 0, stride >= 1, 0 <= length <= stride and "
                     "count >= 0 (got stride %zd, length %zd, count %zd)", stride, length, count);
        return -1;
    }
    return 0;
}

static PyObject *sum_slots(PyObject *self, PyObject *args) {
    unsigned long long base;
    Py_ssize_t stride, length, count, n;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "KnnnO:sum_slots", &base, &stride, &length, &count, &seq))
        return NULL;
    if (check_region(base, stride, length, count) < 0) return NULL;
    Py_ssize_t *idx = slot_numbers(seq, count, &n);
    if (idx == NULL) return NULL;
    uint64_t *sums = PyMem_Malloc((n ? n : 1) * sizeof(uint64_t));
    if (sums == NULL) { PyMem_Free(idx); return PyErr_NoMemory(); }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        sums[i] = xxh3((const char *)(uintptr_t)base + (size_t)idx[i] * (size_t)stride,
                       (size_t)length);
    Py_END_ALLOW_THREADS
    PyObject *out = as_list(sums, n);
    PyMem_Free(sums);
    PyMem_Free(idx);
    return out;
}

static PyObject *land_slots(PyObject *self, PyObject *args) {
    unsigned long long base;
    Py_ssize_t stride, length, count, n;
    PyObject *seq, *bufs;
    if (!PyArg_ParseTuple(args, "KnnnOO:land_slots", &base, &stride, &length, &count, &seq,
                          &bufs))
        return NULL;
    if (check_region(base, stride, length, count) < 0) return NULL;
    Py_ssize_t *idx = slot_numbers(seq, count, &n);
    if (idx == NULL) return NULL;
    PyObject *out = NULL, *fast = NULL;
    Py_buffer *views = NULL;
    uint64_t *sums = NULL;
    Py_ssize_t got = 0;
    fast = PySequence_Fast(bufs, "buffers must be a sequence of buffers");
    if (fast == NULL) goto done;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%zd buffers for %zd slots",
                     PySequence_Fast_GET_SIZE(fast), n);
        goto done;
    }
    views = PyMem_Malloc((n ? n : 1) * sizeof(Py_buffer));
    sums = PyMem_Malloc((n ? n : 1) * sizeof(uint64_t));
    if (views == NULL || sums == NULL) { PyErr_NoMemory(); goto done; }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &views[got],
                               PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (views[got].len != length) {
            PyErr_Format(PyExc_ValueError, "buffer %zd holds %zd bytes, a block is %zd", got,
                         views[got].len, length);
            PyBuffer_Release(&views[got]);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        char *dst = (char *)(uintptr_t)base + (size_t)idx[i] * (size_t)stride;
        memcpy(dst, views[i].buf, (size_t)length);
        sums[i] = xxh3(dst, (size_t)length);
    }
    Py_END_ALLOW_THREADS
    out = as_list(sums, n);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(sums);
    PyMem_Free(idx);
    Py_XDECREF(fast);
    return out;
}

/* XXH3_64bits from the xxhash package's extension, which must be importable. */
static int find_xxh3(void) {
    PyObject *mod = PyImport_ImportModule("xxhash._xxhash");
    if (mod == NULL) return -1;
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    Py_DECREF(mod);
    if (file == NULL) return -1;
    const char *path = PyUnicode_AsUTF8(file);
    if (path == NULL) { Py_DECREF(file); return -1; }
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) lib = dlopen(path, RTLD_NOW);
    Py_DECREF(file);
    if (lib != NULL) xxh3 = (xxh3_fn)dlsym(lib, "XXH3_64bits_dispatch");
    if (xxh3 == NULL) {
        PyErr_SetString(PyExc_ImportError, "the xxhash extension exports no XXH3_64bits");
        return -1;
    }
    return 0;
}

static PyMethodDef methods[] = {
    {"sum_slots", sum_slots, METH_VARARGS,
     "sum_slots(base, stride, length, count, slots): the XXH3-64 of each slot's block, "
     "without the GIL."},
    {"land_slots", land_slots, METH_VARARGS,
     "land_slots(base, stride, length, count, slots, buffers): copy each buffer into its "
     "slot and return each block's XXH3-64, without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_blocksums", NULL, 0, methods};

PyMODINIT_FUNC PyInit__blocksums(void) {
    if (find_xxh3() < 0) return NULL;
    return PyModule_Create(&module);
}
