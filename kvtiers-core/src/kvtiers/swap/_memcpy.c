/* kvtiers.swap._memcpy: one memcpy per entry of a batch, in C, without the GIL.
 *
 * copy_batch(dst_addrs, src_addrs, lengths, threads) takes three C-contiguous
 * buffers of 8-byte integers (addresses and byte counts) of equal length and copies
 * lengths[i] bytes from src_addrs[i] to dst_addrs[i]. The bytes are split evenly over
 * `threads` pthreads (an entry may be shared); threads=1 runs on the caller's thread.
 * The caller guarantees that every range is valid and that no destination overlaps
 * another range of the batch: nothing here can check raw addresses. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 64

typedef struct {
    const uint64_t *dst, *src, *len;
    Py_ssize_t i0, i1;  /* from entry i0 at byte off0 to entry i1 at byte off1 (excl.) */
    uint64_t off0, off1;
} task_t;

static void *run_task(void *arg) {
    const task_t *t = (const task_t *)arg;
    for (Py_ssize_t i = t->i0; i <= t->i1; i++) {
        uint64_t lo = i == t->i0 ? t->off0 : 0;
        uint64_t hi = i == t->i1 ? t->off1 : t->len[i];
        if (hi > lo)
            memcpy((char *)(uintptr_t)t->dst[i] + lo, (const char *)(uintptr_t)t->src[i] + lo, hi - lo);
    }
    return NULL;
}

static int get_words(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    char c = f[strlen(f) - 1];
    if (view->itemsize != 8 || !strchr("qQlLnN", c)) {
        PyErr_Format(PyExc_TypeError, "%s must hold 8-byte integers (format '%s')", name, f);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *copy_batch(PyObject *self, PyObject *args) {
    PyObject *od, *os, *ol;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOO|i:copy_batch", &od, &os, &ol, &threads))
        return NULL;
    if (threads < 1) {
        PyErr_SetString(PyExc_ValueError, "threads must be at least 1");
        return NULL;
    }
    Py_buffer vd, vs, vl;
    if (get_words(od, &vd, "dst_addrs") < 0) return NULL;
    if (get_words(os, &vs, "src_addrs") < 0) { PyBuffer_Release(&vd); return NULL; }
    if (get_words(ol, &vl, "lengths") < 0) { PyBuffer_Release(&vd); PyBuffer_Release(&vs); return NULL; }
    Py_ssize_t n = vl.len / 8;
    PyObject *result = NULL;
    if (vd.len / 8 != n || vs.len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "lengths differ: %zd destinations, %zd sources, %zd lengths",
                     vd.len / 8, vs.len / 8, n);
        goto done;
    }
    if (n > 0) {
        const uint64_t *len = (const uint64_t *)vl.buf;
        task_t tasks[MAX_THREADS];
        pthread_t tids[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        if (threads > MAX_THREADS) threads = MAX_THREADS;
        Py_BEGIN_ALLOW_THREADS
        uint64_t total = 0;
        for (Py_ssize_t i = 0; i < n; i++) total += len[i];
        if (total < (uint64_t)threads) threads = 1;
        /* cut the byte stream at total*k/threads: thread k gets [cut k, cut k+1) */
        Py_ssize_t i = 0;
        uint64_t before = 0; /* bytes of entries before entry i */
        for (int k = 0; k < threads; k++) {
            task_t *t = &tasks[k];
            t->dst = (const uint64_t *)vd.buf; t->src = (const uint64_t *)vs.buf; t->len = len;
            t->i0 = k == 0 ? 0 : tasks[k - 1].i1;
            t->off0 = k == 0 ? 0 : tasks[k - 1].off1;
            uint64_t cut = k == threads - 1 ? total : total / threads * (k + 1);
            while (i < n - 1 && before + len[i] <= cut) { before += len[i]; i++; }
            t->i1 = i;
            t->off1 = cut - before;
        }
        for (int k = 1; k < threads; k++)
            started[k] = pthread_create(&tids[k], NULL, run_task, &tasks[k]) == 0;
        run_task(&tasks[0]);
        for (int k = 1; k < threads; k++) {
            if (started[k]) pthread_join(tids[k], NULL);
            else run_task(&tasks[k]); /* no thread: copy it here */
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&vd);
    PyBuffer_Release(&vs);
    PyBuffer_Release(&vl);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_batch", copy_batch, METH_VARARGS,
     "copy_batch(dst_addrs, src_addrs, lengths, threads=1): memcpy(dst[i], src[i], len[i]) "
     "for every i, without the GIL, the bytes split over `threads` threads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_memcpy", NULL, 0, methods};

PyMODINIT_FUNC PyInit__memcpy(void) { return PyModule_Create(&module); }
