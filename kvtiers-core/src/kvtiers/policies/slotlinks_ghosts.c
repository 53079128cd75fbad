/* kvtiers.policies._slotlinks.Ghosts: ARC's two ghost lists (see _slotlinks.c). */
#include "slotlinks.h"

/* ------------------------------------------------------------------ Ghosts
 * As GhostLists (ghosts.py): an open-addressing table (linear probing,
 * backward-shift deletion, at most half full) of nonzero int64 hashes with a
 * uint32 tag each (the list in bit 0, the ghost's sequence number in its ring mod
 * 2^31 above it), and one FIFO ring of hashes per list. A discarded ghost leaves a
 * stale ring entry, skipped when it reaches the front (its tag no longer matches). */

#define SEQ_MASK 0x7FFFFFFFu

typedef struct {
    int64_t *buf;
    Py_ssize_t cap, start, count; /* cap: a power of two */
    uint64_t seq;                 /* sequence number of the entry at `start` */
} Ring;

typedef struct {
    PyObject_HEAD
    int64_t *hashes;
    uint32_t *tags;
    Py_ssize_t mask, live, len1, len2;
    Ring rings[2];
} Ghosts;

static int ghosts_alloc_table(Ghosts *g, Py_ssize_t size) {
    int64_t *h = PyMem_Calloc((size_t)size, sizeof(int64_t));
    uint32_t *t = PyMem_Calloc((size_t)size, sizeof(uint32_t));
    if (h == NULL || t == NULL) {
        PyMem_Free(h);
        PyMem_Free(t);
        PyErr_NoMemory();
        return -1;
    }
    g->hashes = h;
    g->tags = t;
    g->mask = size - 1;
    return 0;
}

static void ghosts_free(Ghosts *g) {
    PyMem_Free(g->hashes);
    PyMem_Free(g->tags);
    g->hashes = NULL;
    g->tags = NULL;
    for (int w = 0; w < 2; w++) {
        PyMem_Free(g->rings[w].buf);
        memset(&g->rings[w], 0, sizeof(Ring));
    }
}

static int ghosts_reset(Ghosts *g) {
    ghosts_free(g);
    g->live = g->len1 = g->len2 = 0;
    return ghosts_alloc_table(g, 8);
}

static Py_ssize_t ghosts_find_cell(Ghosts *g, int64_t h) {
    Py_ssize_t i = (Py_ssize_t)((uint64_t)h & (uint64_t)g->mask);
    for (;;) {
        int64_t x = g->hashes[i];
        if (x == h)
            return i;
        if (x == 0)
            return -1;
        i = (i + 1) & g->mask;
    }
}

static void ghosts_put(int64_t *hashes, uint32_t *tags, Py_ssize_t mask, int64_t h, uint32_t tag) {
    Py_ssize_t i = (Py_ssize_t)((uint64_t)h & (uint64_t)mask);
    while (hashes[i])
        i = (i + 1) & mask;
    hashes[i] = h;
    tags[i] = tag;
}

static int ghosts_grow(Ghosts *g) {
    Py_ssize_t old_size = g->mask + 1, size = 2 * old_size;
    int64_t *old_h = g->hashes;
    uint32_t *old_t = g->tags;
    if (ghosts_alloc_table(g, size) < 0) {
        g->hashes = old_h;
        g->tags = old_t;
        return -1;
    }
    for (Py_ssize_t i = 0; i < old_size; i++)
        if (old_h[i])
            ghosts_put(g->hashes, g->tags, g->mask, old_h[i], old_t[i]);
    PyMem_Free(old_h);
    PyMem_Free(old_t);
    return 0;
}

static void ghosts_delete_at(Ghosts *g, Py_ssize_t i) {
    Py_ssize_t mask = g->mask, j = i;
    int64_t *hashes = g->hashes;
    for (;;) {
        j = (j + 1) & mask;
        int64_t x = hashes[j];
        if (x == 0)
            break;
        Py_ssize_t k = (Py_ssize_t)((uint64_t)x & (uint64_t)mask);
        int moves = i < j ? (k <= i || k > j) : (k <= i && k > j);
        if (moves) {
            hashes[i] = x;
            g->tags[i] = g->tags[j];
            i = j;
        }
    }
    hashes[i] = 0;
    g->live--;
}

static int ring_push(Ring *r, int64_t h) {
    if (r->count == r->cap) {
        Py_ssize_t cap = r->cap ? 2 * r->cap : 16;
        int64_t *buf = PyMem_Malloc((size_t)cap * sizeof(int64_t));
        if (buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < r->count; i++)
            buf[i] = r->buf[(r->start + i) & (r->cap - 1)];
        PyMem_Free(r->buf);
        r->buf = buf;
        r->cap = cap;
        r->start = 0;
    }
    r->buf[(r->start + r->count) & (r->cap - 1)] = h;
    r->count++;
    return 0;
}

static int parse_hash(PyObject *o, int64_t *out) {
    long long h = PyLong_AsLongLong(o);
    if (h == -1 && PyErr_Occurred())
        return -1;
    *out = h ? (int64_t)h : 1;
    return 0;
}

static int parse_which(PyObject *o, int *out) {
    long w = PyLong_AsLong(o);
    if (w == -1 && PyErr_Occurred())
        return -1;
    if (w != 1 && w != 2) {
        PyErr_SetString(PyExc_ValueError, "which must be 1 or 2");
        return -1;
    }
    *out = (int)w - 1;
    return 0;
}

static PyObject *Ghosts_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Ghosts() takes no arguments");
        return NULL;
    }
    Ghosts *g = (Ghosts *)type->tp_alloc(type, 0);
    if (g == NULL)
        return NULL;
    if (ghosts_reset(g) < 0) {
        Py_DECREF(g);
        return NULL;
    }
    return (PyObject *)g;
}

static void Ghosts_dealloc(Ghosts *g) {
    ghosts_free(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static PyObject *Ghosts_find(Ghosts *g, PyObject *arg) {
    int64_t h;
    if (parse_hash(arg, &h) < 0)
        return NULL;
    Py_ssize_t i = ghosts_find_cell(g, h);
    return PyLong_FromLong(i < 0 ? 0 : (long)(g->tags[i] & 1) + 1);
}

static PyObject *Ghosts_add(Ghosts *g, PyObject *const *args, Py_ssize_t nargs) {
    int w;
    int64_t h;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(which, hash)");
        return NULL;
    }
    if (parse_which(args[0], &w) < 0 || parse_hash(args[1], &h) < 0)
        return NULL;
    if (ghosts_find_cell(g, h) >= 0)
        Py_RETURN_NONE;
    if (2 * (g->live + 1) > g->mask + 1 && ghosts_grow(g) < 0)
        return NULL;
    Ring *r = &g->rings[w];
    uint64_t seq = r->seq + (uint64_t)r->count;
    if (ring_push(r, h) < 0)
        return NULL;
    ghosts_put(g->hashes, g->tags, g->mask, h, (uint32_t)(((seq & SEQ_MASK) << 1) | (uint64_t)w));
    g->live++;
    if (w)
        g->len2++;
    else
        g->len1++;
    Py_RETURN_NONE;
}

static PyObject *Ghosts_discard(Ghosts *g, PyObject *arg) {
    int64_t h;
    if (parse_hash(arg, &h) < 0)
        return NULL;
    Py_ssize_t i = ghosts_find_cell(g, h);
    if (i >= 0) {
        if (g->tags[i] & 1)
            g->len2--;
        else
            g->len1--;
        ghosts_delete_at(g, i);
    }
    Py_RETURN_NONE;
}

static PyObject *Ghosts_pop_oldest(Ghosts *g, PyObject *arg) {
    int w;
    if (parse_which(arg, &w) < 0)
        return NULL;
    Ring *r = &g->rings[w];
    while (r->count) {
        int64_t h = r->buf[r->start];
        uint32_t tag = (uint32_t)(((r->seq & SEQ_MASK) << 1) | (uint64_t)w);
        r->start = (r->start + 1) & (r->cap - 1);
        r->count--;
        r->seq++;
        Py_ssize_t i = ghosts_find_cell(g, h);
        if (i >= 0 && g->tags[i] == tag) {
            ghosts_delete_at(g, i);
            if (w)
                g->len2--;
            else
                g->len1--;
            break;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *Ghosts_clear(Ghosts *g, PyObject *unused) {
    if (ghosts_reset(g) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t Ghosts_len(Ghosts *g) { return g->live; }

static PyMethodDef Ghosts_methods[] = {
    {"find", (PyCFunction)Ghosts_find, METH_O, "1 or 2: the list that has the hash; 0: neither."},
    {"add", (PyCFunction)(void (*)(void))Ghosts_add, METH_FASTCALL,
     "Append the hash at the newest end of list `which` (one already remembered stays)."},
    {"discard", (PyCFunction)Ghosts_discard, METH_O, "Forget the hash (a ghost hit)."},
    {"pop_oldest", (PyCFunction)Ghosts_pop_oldest, METH_O, "Forget list `which`'s oldest ghost."},
    {"clear", (PyCFunction)Ghosts_clear, METH_NOARGS, "Forget every ghost."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Ghosts_members[] = {
    {"len1", T_PYSSIZET, offsetof(Ghosts, len1), READONLY, "live ghosts in list 1 (B1)"},
    {"len2", T_PYSSIZET, offsetof(Ghosts, len2), READONLY, "live ghosts in list 2 (B2)"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods Ghosts_as_sequence = {.sq_length = (lenfunc)Ghosts_len};

PyTypeObject SlotlinksGhostsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtiers.policies._slotlinks.Ghosts",
    .tp_basicsize = sizeof(Ghosts),
    .tp_dealloc = (destructor)Ghosts_dealloc,
    .tp_as_sequence = &Ghosts_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ARC's two ghost lists (as kvtiers.policies.ghosts.GhostLists), in C.",
    .tp_methods = Ghosts_methods,
    .tp_members = Ghosts_members,
    .tp_new = Ghosts_new,
};

