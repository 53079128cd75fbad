/* kvtiers.policies._slotlinks: the slot policies' per-key list moves and ARC's
 * ghost lists, in C. Optional: kvtiers.policies.slot_links (move) and
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

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

static PyTypeObject GhostsType = {
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

/* ------------------------------------------------------------------ SlotIndex */

/* A cell: the entry's slot in the low `slot_bits` bits, and above them as many bits
 * of its key's hash as fit (a tag: probes skip other keys without reading them);
 * EMPTY (all ones) is never an entry, as slots are below 2**slot_bits - 1. */
#define EMPTY 0xFFFFFFFFu

typedef struct {
    PyObject_HEAD
    PyObject *keys;  /* the policy's slot -> key list (owned reference) */
    uint32_t *cells;
    Py_ssize_t mask, used, capacity;
    int slot_bits;
    uint32_t slot_mask;
} SlotIndex;

static inline uint32_t cell_tag(SlotIndex *x, Py_hash_t h) {
    int bits = 32 - x->slot_bits;
    return bits ? (uint32_t)((uint64_t)h >> (64 - bits)) << x->slot_bits : 0;
}

/* The cell of `key` (hash `h`), or -(first empty cell) - 1 when absent; -2**62 on
 * an error (a key's comparison raised). */
#define LOOKUP_ERROR (-((Py_ssize_t)1 << 62))

static Py_ssize_t index_lookup(SlotIndex *x, PyObject *key, Py_hash_t h) {
    Py_ssize_t i = (Py_ssize_t)((size_t)h & (size_t)x->mask);
    uint32_t tag = cell_tag(x, h), slot_mask = x->slot_mask;
    for (;;) {
        uint32_t c = x->cells[i];
        if (c == EMPTY)
            return -i - 1;
        if ((c & ~slot_mask) != tag) {
            i = (i + 1) & x->mask;
            continue;
        }
        PyObject *k = PyList_GET_ITEM(x->keys, c & slot_mask);
        if (k == key)
            return i;
        if (k != Py_None) {
            Py_hash_t h2 = PyObject_Hash(k);
            if (h2 == -1 && PyErr_Occurred())
                return LOOKUP_ERROR;
            if (h2 == h) {
                Py_INCREF(k);
                int eq = PyObject_RichCompareBool(k, key, Py_EQ);
                Py_DECREF(k);
                if (eq < 0)
                    return LOOKUP_ERROR;
                if (eq)
                    return i;
            }
        }
        i = (i + 1) & x->mask;
    }
}

static Py_ssize_t index_find(SlotIndex *x, PyObject *key) {
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1 && PyErr_Occurred())
        return LOOKUP_ERROR;
    return index_lookup(x, key, h);
}

static int index_home(SlotIndex *x, uint32_t c, Py_ssize_t *out) {
    Py_hash_t h = PyObject_Hash(PyList_GET_ITEM(x->keys, c & x->slot_mask));
    if (h == -1 && PyErr_Occurred())
        return -1;
    *out = (Py_ssize_t)((size_t)h & (size_t)x->mask);
    return 0;
}

/* Empty cell `i` (its entry's keys[slot] becomes None), shifting later entries of
 * its probe run back. */
static int index_delete_at(SlotIndex *x, Py_ssize_t i) {
    Py_ssize_t slot = x->cells[i] & x->slot_mask;
    Py_ssize_t mask = x->mask, j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint32_t c = x->cells[j];
        if (c == EMPTY)
            break;
        Py_ssize_t k;
        if (index_home(x, c, &k) < 0)
            return -1;
        int moves = i < j ? (k <= i || k > j) : (k <= i && k > j);
        if (moves) {
            x->cells[i] = c;
            i = j;
        }
    }
    x->cells[i] = EMPTY;
    x->used--;
    Py_INCREF(Py_None);
    PyObject *old = PyList_GET_ITEM(x->keys, slot);
    PyList_SET_ITEM(x->keys, slot, Py_None);
    Py_DECREF(old);
    return 0;
}

static int index_check_keys(SlotIndex *x) {
    if (PyList_GET_SIZE(x->keys) != x->capacity) {
        PyErr_SetString(PyExc_RuntimeError, "the slot -> key list changed length");
        return -1;
    }
    return 0;
}

static PyObject *SlotIndex_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *keys;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "SlotIndex(keys) takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!:SlotIndex", &PyList_Type, &keys))
        return NULL;
    Py_ssize_t capacity = PyList_GET_SIZE(keys);
    if (capacity > 0x3FFFFFFF) { /* 2 * capacity cells, and a slot in 30 bits */
        PyErr_SetString(PyExc_ValueError, "too many slots");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < capacity; i++)
        if (PyList_GET_ITEM(keys, i) != Py_None) {
            PyErr_SetString(PyExc_ValueError, "keys must be all None (no slot in use)");
            return NULL;
        }
    Py_ssize_t size = 8;
    while (size < 2 * capacity)
        size *= 2;
    SlotIndex *x = (SlotIndex *)type->tp_alloc(type, 0);
    if (x == NULL)
        return NULL;
    x->cells = PyMem_Malloc((size_t)size * sizeof(uint32_t));
    if (x->cells == NULL) {
        Py_DECREF(x);
        return PyErr_NoMemory();
    }
    memset(x->cells, 0xff, (size_t)size * sizeof(uint32_t));
    Py_INCREF(keys);
    x->keys = keys;
    x->mask = size - 1;
    x->capacity = capacity;
    int bits = 0;
    while (((Py_ssize_t)1 << bits) <= capacity)
        bits++; /* 2**bits > capacity: the largest slot is below 2**bits - 1 */
    x->slot_bits = bits;
    x->slot_mask = (uint32_t)(((uint64_t)1 << bits) - 1);
    return (PyObject *)x;
}

static void SlotIndex_dealloc(SlotIndex *x) {
    PyMem_Free(x->cells);
    Py_XDECREF(x->keys);
    Py_TYPE(x)->tp_free((PyObject *)x);
}

static Py_ssize_t SlotIndex_len(SlotIndex *x) { return x->used; }

static int SlotIndex_contains(SlotIndex *x, PyObject *key) {
    if (index_check_keys(x) < 0)
        return -1;
    Py_ssize_t i = index_find(x, key);
    if (i == LOOKUP_ERROR)
        return -1;
    return i >= 0;
}

static PyObject *SlotIndex_subscript(SlotIndex *x, PyObject *key) {
    if (index_check_keys(x) < 0)
        return NULL;
    Py_ssize_t i = index_find(x, key);
    if (i == LOOKUP_ERROR)
        return NULL;
    if (i < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return PyLong_FromLong((long)(x->cells[i] & x->slot_mask));
}

static int SlotIndex_ass_subscript(SlotIndex *x, PyObject *key, PyObject *value) {
    if (index_check_keys(x) < 0)
        return -1;
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t i = index_lookup(x, key, h);
    if (i == LOOKUP_ERROR)
        return -1;
    if (value == NULL) { /* del index[key] */
        if (i < 0) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        return index_delete_at(x, i);
    }
    Py_ssize_t slot = PyLong_AsSsize_t(value);
    if (slot == -1 && PyErr_Occurred())
        return -1;
    if (slot < 0 || slot >= x->capacity) {
        PyErr_Format(PyExc_ValueError, "slot %zd out of range 0..%zd", slot, x->capacity - 1);
        return -1;
    }
    PyObject *held = PyList_GET_ITEM(x->keys, slot);
    if (held != Py_None && held != key) {
        PyErr_Format(PyExc_ValueError, "slot %zd holds another key", slot);
        return -1;
    }
    uint32_t cell = cell_tag(x, h) | (uint32_t)slot;
    if (i >= 0) { /* present: the entry moves to `slot` (its old slot is left as it is) */
        x->cells[i] = cell;
    } else {
        x->cells[-i - 1] = cell;
        x->used++;
    }
    Py_INCREF(key);
    PyList_SET_ITEM(x->keys, slot, key);
    Py_DECREF(held);
    return 0;
}

static PyObject *SlotIndex_get(SlotIndex *x, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    if (index_check_keys(x) < 0)
        return NULL;
    Py_ssize_t i = index_find(x, args[0]);
    if (i == LOOKUP_ERROR)
        return NULL;
    if (i >= 0)
        return PyLong_FromLong((long)(x->cells[i] & x->slot_mask));
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(d);
    return d;
}

static PyObject *SlotIndex_pop(SlotIndex *x, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    if (index_check_keys(x) < 0)
        return NULL;
    Py_ssize_t i = index_find(x, args[0]);
    if (i == LOOKUP_ERROR)
        return NULL;
    if (i < 0) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *slot = PyLong_FromLong((long)(x->cells[i] & x->slot_mask));
    if (slot == NULL || index_delete_at(x, i) < 0) {
        Py_XDECREF(slot);
        return NULL;
    }
    return slot;
}

static PyObject *SlotIndex_items(SlotIndex *x, PyObject *unused) {
    if (index_check_keys(x) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i <= x->mask; i++) {
        uint32_t c = x->cells[i];
        if (c == EMPTY)
            continue;
        c &= x->slot_mask;
        PyObject *pair = Py_BuildValue("(Oi)", PyList_GET_ITEM(x->keys, c), (int)c);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(pair);
    }
    return out;
}

static PyMethodDef SlotIndex_methods[] = {
    {"get", (PyCFunction)(void (*)(void))SlotIndex_get, METH_FASTCALL,
     "The slot of key, else default."},
    {"pop", (PyCFunction)(void (*)(void))SlotIndex_pop, METH_FASTCALL,
     "Remove key and return its slot (else default, or KeyError)."},
    {"items", (PyCFunction)SlotIndex_items, METH_NOARGS, "A list of (key, slot) pairs."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods SlotIndex_as_mapping = {
    .mp_length = (lenfunc)SlotIndex_len,
    .mp_subscript = (binaryfunc)SlotIndex_subscript,
    .mp_ass_subscript = (objobjargproc)SlotIndex_ass_subscript,
};

static PySequenceMethods SlotIndex_as_sequence = {.sq_contains = (objobjproc)SlotIndex_contains};

static PyTypeObject SlotIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtiers.policies._slotlinks.SlotIndex",
    .tp_basicsize = sizeof(SlotIndex),
    .tp_dealloc = (destructor)SlotIndex_dealloc,
    .tp_as_mapping = &SlotIndex_as_mapping,
    .tp_as_sequence = &SlotIndex_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A slot policy's key -> slot index over its slot -> key list, in C.",
    .tp_methods = SlotIndex_methods,
    .tp_new = SlotIndex_new,
};

static PyMethodDef methods[] = {
    {"move", (PyCFunction)(void (*)(void))slotlinks_move, METH_FASTCALL,
     "Move each slot by its mark's entry in the table; moves per old mark."},
    {"gather", (PyCFunction)(void (*)(void))slotlinks_gather, METH_FASTCALL,
     "bytes(buffer[s] for s in slots)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slotlinks", NULL, -1, methods};

PyMODINIT_FUNC PyInit__slotlinks(void) {
    if (PyType_Ready(&GhostsType) < 0 || PyType_Ready(&SlotIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&GhostsType);
    if (PyModule_AddObject(m, "Ghosts", (PyObject *)&GhostsType) < 0) {
        Py_DECREF(&GhostsType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SlotIndexType);
    if (PyModule_AddObject(m, "SlotIndex", (PyObject *)&SlotIndexType) < 0) {
        Py_DECREF(&SlotIndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
