/* kvtiers_fs.disk._readmany: open and read many block files in one call, without the GIL.
 *
 * read_files(dir_fd, paths, vecs, flags) -> list of (err, mode, size, nread, dev, ino)
 *
 *   paths  a list of bytes, each "<shard>/<file>" relative to dir_fd
 *   vecs   a list (one per path) of lists of writable buffers, read in order
 *          (the header page, the slot's aligned part, maybe a tail page)
 *   flags  open(2) flags; O_NOFOLLOW and O_CLOEXEC are added
 *
 * Each file is opened with openat2(2) and RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH |
 * RESOLVE_NO_MAGICLINKS (no symlink followed anywhere, nothing outside dir_fd; EAGAIN
 * from a racing rename is retried), fstat-ed, read with preadv(2) until the buffers
 * are full or the file ends, and closed. err is 0 or the errno of the call that
 * failed (ENOSYS: no openat2 here); nread says how many bytes were read. A file that
 * is not a regular file is not read (err 0, nread 0: the caller looks at mode).
 * Python's side (blockio.py) verifies what was read: this only moves bytes, so that
 * small blocks cost one GIL release per batch instead of four per block. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#define MAX_VECS 4

struct how {
    uint64_t flags, mode, resolve;
};

typedef struct {
    const char *path;
    struct iovec iov[MAX_VECS];
    int niov;
    int err;
    unsigned mode;
    long long size, nread;
    unsigned long long dev, ino;
} item_t;

static void read_one(int dir_fd, int flags, item_t *it) {
    struct how how = {(uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC), 0, 0x02 | 0x04 | 0x08};
    long fd = -1;
    for (int tries = 0; tries < 4; tries++) {
        fd = syscall(SYS_openat2, dir_fd, it->path, &how, sizeof how);
        if (fd >= 0 || errno != EAGAIN)
            break;
    }
    if (fd < 0) {
        it->err = errno;
        return;
    }
    struct stat st;
    if (fstat((int)fd, &st) != 0) {
        it->err = errno;
        close((int)fd);
        return;
    }
    it->mode = st.st_mode;
    it->size = st.st_size;
    it->dev = st.st_dev;
    it->ino = st.st_ino;
    if (S_ISREG(st.st_mode)) {
        struct iovec iov[MAX_VECS];
        int niov = it->niov;
        memcpy(iov, it->iov, sizeof iov);
        struct iovec *v = iov;
        off_t off = 0;
        while (niov > 0) {
            ssize_t n = preadv((int)fd, v, niov, off);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                it->err = errno;
                break;
            }
            if (n == 0)
                break; /* end of file: the caller compares nread with the size */
            off += n;
            while (niov > 0 && (size_t)n >= v->iov_len) {
                n -= (ssize_t)v->iov_len;
                v++;
                niov--;
            }
            if (niov > 0 && n > 0) {
                v->iov_base = (char *)v->iov_base + n;
                v->iov_len -= (size_t)n;
            }
        }
        it->nread = off;
    }
    close((int)fd);
}

static PyObject *read_files(PyObject *self, PyObject *args) {
    (void)self;
    int dir_fd, flags;
    PyObject *paths, *vecs;
    if (!PyArg_ParseTuple(args, "iO!O!i", &dir_fd, &PyList_Type, &paths, &PyList_Type, &vecs,
                          &flags))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(vecs) != n) {
        PyErr_SetString(PyExc_ValueError, "paths and vecs differ in length");
        return NULL;
    }
    item_t *items = PyMem_Calloc(n ? n : 1, sizeof(item_t));
    Py_buffer *views = PyMem_Calloc(n ? n * MAX_VECS : 1, sizeof(Py_buffer));
    PyObject **keep = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    PyObject *out = NULL;
    Py_ssize_t kept = 0;
    if (!items || !views || !keep) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(paths, i);
        if (!PyBytes_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "paths must be bytes");
            goto done;
        }
        Py_INCREF(p);  /* held while the GIL is released */
        keep[kept++] = p;
        items[i].path = PyBytes_AS_STRING(p);
        PyObject *vl = PyList_GET_ITEM(vecs, i);
        if (!PyList_Check(vl) || PyList_GET_SIZE(vl) < 1 || PyList_GET_SIZE(vl) > MAX_VECS) {
            PyErr_SetString(PyExc_TypeError, "each vecs item must be a list of 1-4 buffers");
            goto done;
        }
        items[i].niov = (int)PyList_GET_SIZE(vl);
        for (int k = 0; k < items[i].niov; k++) {
            Py_buffer *view = &views[i * MAX_VECS + k];
            if (PyObject_GetBuffer(PyList_GET_ITEM(vl, k), view,
                                   PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            items[i].iov[k].iov_base = view->buf;
            items[i].iov[k].iov_len = (size_t)view->len;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        read_one(dir_fd, flags, &items[i]);
    Py_END_ALLOW_THREADS
    out = PyList_New(n);
    if (!out)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        PyObject *t = Py_BuildValue("(iILLKK)", it->err, it->mode, it->size, it->nread,
                                    it->dev, it->ino);
        if (!t) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, t);
    }
done:
    if (views) {
        for (Py_ssize_t i = 0; i < n * MAX_VECS; i++)
            if (views[i].obj)
                PyBuffer_Release(&views[i]);
    }
    for (Py_ssize_t i = 0; i < kept; i++)
        Py_DECREF(keep[i]);
    PyMem_Free(items);
    PyMem_Free(views);
    PyMem_Free(keep);
    return out;
}

static PyMethodDef methods[] = {
    {"read_files", read_files, METH_VARARGS,
     "read_files(dir_fd, paths, vecs, flags) -> [(err, mode, size, nread, dev, ino)]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_readmany", "Open and read many block files without the GIL.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__readmany(void) { return PyModule_Create(&module); }
