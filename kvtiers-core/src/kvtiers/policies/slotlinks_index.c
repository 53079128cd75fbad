/* kvtiers.policies._slotlinks.SlotIndex: a slot policy's key -> slot index (see
 * _slotlinks.c). */
#include "slotlinks.h"

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

PyTypeObject SlotlinksIndexType = {
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

