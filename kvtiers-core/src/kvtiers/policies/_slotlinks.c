/* kvtiers.policies._slotlinks: the slot policies' per-key list moves and ARC's
 * ghost lists, in C (this file: move, gather and the module; Ghosts in
 * slotlinks_ghosts.c, SlotIndex in slotlinks_index.c). Optional: kvtiers.policies.slot_links (move) and
 * kvtiers.policies.ghosts (GhostLists) are the same in Python, and the policies use
 * these when they were built (setup.py).
 *
 * move(marks, prev, next, slots, table, heads) -> list
 *     For each slot of `slots` in order (None entries are skipped): m = marks[slot];
 *     t = table[m]; when t is 255 nothing happens; otherwise marks[slot] = t, and
 *     by the action byte a = table[k + m] (k = len(table) // 2): a & 1 unlinks the
 *     slot from its list, then a & 2 links it at the newest end of the list whose
 *     sentinel is heads[t]. Returns how many slots moved per old mark (k counts).
 *
 * `marks` is a writable buffer of bytes indexed by slot; `prev` and `next` writable
 * buffers of 4-byte ints (array('i')), the lists threaded through them (`next[h]`
 * is a list's oldest entry, `prev[h]` its newest); `table` bytes of even length 2k,
 * every mark below k; `heads` a sequence of k ints. Every slot must be an int below
 * len(marks) (checked, IndexError); a mark at or above k raises ValueError (the
 * slots before it have moved, as the Python loop leaves them). Single-threaded, like
 * the policy that calls it; the GIL is held.
 *
 * gather(buffer, slots) -> bytes
 *     bytes(buffer[s] for s in slots): a buffer of bytes indexed by slot read at
 *     each slot of the list `slots` (ints, checked: IndexError).
 *
 * Ghosts() -> a new, empty pair of ARC ghost lists: the C form of
 *     kvtiers.policies.ghosts.GhostLists, with the same methods and attributes
 *     (find, add, discard, pop_oldest, clear, len(), len1, len2) and the same answers;
 *     its table and rings are allocated with PyMem_* (traced by tracemalloc).
 *
 * SlotIndex(keys) -> the key -> slot index of a slot policy, where `keys` is the
 *     policy's slot -> key list (None: a free slot); capacity = len(keys). A mapping
 *     with the dict methods the policies use (get, pop, items, [], in, del, len);
 *     it writes keys[slot] = key on insertion and keys[slot] = None on removal, and
 *     finds entries through that list: an open-addressing table of uint32 cells
 *     (the slot number and a tag of hash bits; linear probing, backward-shift
 *     deletion, at least twice as many cells as slots, allocated once). Per entry ~8-11 bytes where a dict costs ~52
 *     plus an int object (~32) per value: values are returned as new ints. A slot
 *     already holding another key raises ValueError. */
#include "slotlinks.h"

#define MAX_MARKS 16

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable,
                      const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s must hold %zd-byte items", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *slotlinks_move(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "move(marks, prev, next, slots, table, heads)");
        return NULL;
    }
    PyObject *slots = args[3];
    if (!PyList_Check(slots)) {
        PyErr_SetString(PyExc_TypeError, "slots must be a list");
        return NULL;
    }
    PyObject *result = NULL;
    Py_buffer vm, vp, vn, vt;
    if (get_buffer(args[0], &vm, 1, 1, "marks") < 0)
        return NULL;
    if (get_buffer(args[1], &vp, 4, 1, "prev") < 0)
        goto release_m;
    if (get_buffer(args[2], &vn, 4, 1, "next") < 0)
        goto release_p;
    if (get_buffer(args[4], &vt, 1, 0, "table") < 0)
        goto release_n;
    Py_ssize_t k = vt.len / 2, links = vp.len / 4, nmarks = vm.len;
    if (vt.len % 2 || k == 0 || k > MAX_MARKS) {
        PyErr_Format(PyExc_ValueError, "table must hold 2..%d bytes, an even number", 2 * MAX_MARKS);
        goto release_t;
    }
    if (vn.len != vp.len || links < nmarks) {
        PyErr_SetString(PyExc_ValueError, "prev and next must be as long, and cover every slot");
        goto release_t;
    }
    int32_t heads[MAX_MARKS];
    PyObject *hs = PySequence_Fast(args[5], "heads must be a sequence");
    if (hs == NULL)
        goto release_t;
    if (PySequence_Fast_GET_SIZE(hs) != k) {
        PyErr_SetString(PyExc_ValueError, "heads must have one entry per mark");
        Py_DECREF(hs);
        goto release_t;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t h = PyLong_AsSsize_t(PySequence_Fast_ITEMS(hs)[i]);
        if (h == -1 && PyErr_Occurred()) {
            Py_DECREF(hs);
            goto release_t;
        }
        if (h < 0 || h >= links) {
            PyErr_Format(PyExc_IndexError, "head %zd out of range 0..%zd", h, links - 1);
            Py_DECREF(hs);
            goto release_t;
        }
        heads[i] = (int32_t)h;
    }
    Py_DECREF(hs);
    const uint8_t *table = (const uint8_t *)vt.buf, *action = table + k;
    uint8_t *marks = (uint8_t *)vm.buf;
    int32_t *prev = (int32_t *)vp.buf, *next = (int32_t *)vn.buf;
    Py_ssize_t counts[MAX_MARKS] = {0};
    Py_ssize_t len = PyList_GET_SIZE(slots);
    int failed = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *o = PyList_GET_ITEM(slots, i);
        if (o == Py_None)
            continue;
        Py_ssize_t s = PyLong_AsSsize_t(o);
        if (s == -1 && PyErr_Occurred()) {
            failed = 1;
            break;
        }
        if (s < 0 || s >= nmarks) {
            PyErr_Format(PyExc_IndexError, "slot %zd out of range 0..%zd", s, nmarks - 1);
            failed = 1;
            break;
        }
        uint8_t m = marks[s];
        if (m >= k) {
            PyErr_Format(PyExc_ValueError, "slot %zd: mark %d not in the table", s, (int)m);
            failed = 1;
            break;
        }
        uint8_t t = table[m];
        if (t == 255)
            continue;
        uint8_t a = action[m];
        if ((a & 2) && t >= k) {
            PyErr_Format(PyExc_ValueError, "mark %d has no head", (int)t);
            failed = 1;
            break;
        }
        marks[s] = t;
        counts[m]++;
        if (a & 1) {
            int32_t p = prev[s], n = next[s];
            next[p] = n;
            prev[n] = p;
        }
        if (a & 2) {
            int32_t h = heads[t], last = prev[h];
            next[last] = (int32_t)s;
            prev[s] = last;
            next[s] = h;
            prev[h] = (int32_t)s;
        }
    }
    if (!failed) {
        result = PyList_New(k);
        if (result != NULL) {
            for (Py_ssize_t i = 0; i < k; i++) {
                PyObject *c = PyLong_FromSsize_t(counts[i]);
                if (c == NULL) {
                    Py_CLEAR(result);
                    break;
                }
                PyList_SET_ITEM(result, i, c);
            }
        }
    }
release_t:
    PyBuffer_Release(&vt);
release_n:
    PyBuffer_Release(&vn);
release_p:
    PyBuffer_Release(&vp);
release_m:
    PyBuffer_Release(&vm);
    return result;
}


static PyObject *slotlinks_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "gather(buffer, slots)");
        return NULL;
    }
    PyObject *slots = args[1];
    if (!PyList_Check(slots)) {
        PyErr_SetString(PyExc_TypeError, "slots must be a list");
        return NULL;
    }
    Py_buffer view;
    if (get_buffer(args[0], &view, 1, 0, "buffer") < 0)
        return NULL;
    Py_ssize_t len = PyList_GET_SIZE(slots), n = view.len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, len);
    if (out == NULL)
        goto done;
    const uint8_t *src = (const uint8_t *)view.buf;
    char *dst = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyList_GET_ITEM(slots, i));
        if (s == -1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        if (s < 0 || s >= n) {
            PyErr_Format(PyExc_IndexError, "slot %zd out of range 0..%zd", s, n - 1);
            Py_CLEAR(out);
            break;
        }
        dst[i] = (char)src[s];
    }
done:
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"move", (PyCFunction)(void (*)(void))slotlinks_move, METH_FASTCALL,
     "Move each slot by its mark's entry in the table; moves per old mark."},
    {"gather", (PyCFunction)(void (*)(void))slotlinks_gather, METH_FASTCALL,
     "bytes(buffer[s] for s in slots)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slotlinks", NULL, -1, methods};

PyMODINIT_FUNC PyInit__slotlinks(void) {
    if (PyType_Ready(&SlotlinksGhostsType) < 0 || PyType_Ready(&SlotlinksIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SlotlinksGhostsType);
    if (PyModule_AddObject(m, "Ghosts", (PyObject *)&SlotlinksGhostsType) < 0) {
        Py_DECREF(&SlotlinksGhostsType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SlotlinksIndexType);
    if (PyModule_AddObject(m, "SlotIndex", (PyObject *)&SlotlinksIndexType) < 0) {
        Py_DECREF(&SlotlinksIndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
