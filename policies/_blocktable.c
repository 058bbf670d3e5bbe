/* policies._blocktable: the compiled block table (see policies/block_table.py).
 *
 * One table holds (block hash, replica slot) pairs for every replica at once:
 *
 * - keys: open addressing (linear probing, backward-shift deletion, load <= 0.8,
 *   grown by 1.5x) from a block hash to its holders. A block one replica holds
 *   (the common case) stores that replica and its pair's value inline: 16 bytes.
 *   A block several replicas hold points to a bitmask of them (a pool of
 *   ``words`` uint64 per mask, widened as replica slots grow) and keeps each
 *   holder's value in ``pairs``, a second open-addressing table keyed by
 *   (hash, replica).
 * - ordered tables (LRU): a pair's value is a node; nodes form one doubly linked
 *   list per replica, oldest first, each with its key and stamp (a time).
 *   Counted tables: a pair's value is a reference count.
 *
 * match walks the prompt's hashes once, intersecting holder sets: a replica's
 * leading run ends where its bit drops out; replicas holding nothing of the
 * prompt cost nothing. Freshness (stamps) is checked per matching replica
 * afterwards, see match() below.
 *
 * Memory comes from PyMem_Raw*, which tracemalloc traces.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NIL UINT32_MAX
#define NONE SIZE_MAX
#define MAX_WORDS 64 /* 4096 replica slots */
#define MAX_SLOTS (MAX_WORDS * 64)
#define PREFETCH_AHEAD 8

typedef struct { uint64_t key; uint32_t holder; uint32_t value; } KeySlot;
typedef struct { uint64_t key; uint32_t replica; uint32_t value; } PairSlot; /* replica: slot+1 */

/* holder: 0 empty; odd: one replica (slot << 1 | 1); even: a mask ((index + 1) << 1). */
#define IS_SINGLE(h) ((h) & 1u)
#define SLOT_OF(h) ((h) >> 1)
#define MASK_OF(h) (((h) >> 1) - 1u)
#define SINGLE(s) ((((uint32_t)(s)) << 1) | 1u)
#define MULTI(m) ((((uint32_t)(m)) + 1u) << 1)

typedef struct {
    PyObject_HEAD
    int ordered;
    KeySlot *keys; size_t key_cap, key_count;
    PairSlot *pairs; size_t pair_cap, pair_count;
    uint64_t *masks; size_t words, mask_cap, mask_used; uint32_t mask_free;
    uint64_t *node_key; double *node_stamp; uint32_t *node_prev, *node_next;
    size_t node_cap, node_used; uint32_t node_free;
    uint32_t *head, *tail; uint64_t *size; size_t slot_cap;
} Table;

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}
static inline size_t home(uint64_t hashed, size_t cap) {
    return (size_t)(((unsigned __int128)hashed * cap) >> 64);
}
static inline uint64_t pair_hash(uint64_t key, uint32_t slot) {
    return mix64(key ^ ((uint64_t)(slot + 1u) * 0x9e3779b97f4a7c15ULL));
}
static inline size_t grown(size_t cap, size_t floor) {
    size_t next = cap + cap / 2;
    return next < floor ? floor : next;
}

static void *raw_realloc(void *old, size_t count, size_t item) {
    if (count != 0 && item > SIZE_MAX / count) return NULL;
    return PyMem_RawRealloc(old, count * item);
}

/* -- keys -------------------------------------------------------------------------- */

static size_t key_find(const Table *t, uint64_t key) {
    if (t->key_count == 0) return NONE;
    size_t i = home(mix64(key), t->key_cap);
    for (;;) {
        const KeySlot *s = &t->keys[i];
        if (s->holder == 0) return NONE;
        if (s->key == key) return i;
        if (++i == t->key_cap) i = 0;
    }
}

static size_t key_place(const KeySlot *keys, size_t cap, uint64_t key) {
    size_t i = home(mix64(key), cap);
    while (keys[i].holder != 0) if (++i == cap) i = 0;
    return i;
}

static int key_resize(Table *t, size_t cap) {
    KeySlot *keys = PyMem_RawCalloc(cap, sizeof(KeySlot));
    if (keys == NULL) { PyErr_NoMemory(); return -1; }
    for (size_t i = 0; i < t->key_cap; i++)
        if (t->keys[i].holder != 0) keys[key_place(keys, cap, t->keys[i].key)] = t->keys[i];
    PyMem_RawFree(t->keys);
    t->keys = keys; t->key_cap = cap;
    return 0;
}

static int key_room(Table *t) {
    if ((t->key_count + 1) * 5 <= t->key_cap * 4) return 0;
    return key_resize(t, grown(t->key_cap, 16));
}

static void key_delete(Table *t, size_t i) {
    size_t cap = t->key_cap, j = i;
    for (;;) {
        j = (j + 1 == cap) ? 0 : j + 1;
        if (t->keys[j].holder == 0) break;
        size_t k = home(mix64(t->keys[j].key), cap);
        /* j may move to the hole at i when i lies on its probe path k..j */
        if ((j + cap - i) % cap <= (j + cap - k) % cap) { t->keys[i] = t->keys[j]; i = j; }
    }
    memset(&t->keys[i], 0, sizeof(KeySlot));
    t->key_count--;
}

/* -- pairs of multi-holder keys ------------------------------------------------------ */

static size_t pairs_find(const Table *t, uint64_t key, uint32_t slot) {
    if (t->pair_count == 0) return NONE;
    size_t i = home(pair_hash(key, slot), t->pair_cap);
    for (;;) {
        const PairSlot *p = &t->pairs[i];
        if (p->replica == 0) return NONE;
        if (p->key == key && p->replica == slot + 1u) return i;
        if (++i == t->pair_cap) i = 0;
    }
}

static int pairs_resize(Table *t, size_t cap) {
    PairSlot *pairs = PyMem_RawCalloc(cap, sizeof(PairSlot));
    if (pairs == NULL) { PyErr_NoMemory(); return -1; }
    for (size_t i = 0; i < t->pair_cap; i++) {
        PairSlot *p = &t->pairs[i];
        if (p->replica == 0) continue;
        size_t j = home(pair_hash(p->key, p->replica - 1u), cap);
        while (pairs[j].replica != 0) if (++j == cap) j = 0;
        pairs[j] = *p;
    }
    PyMem_RawFree(t->pairs);
    t->pairs = pairs; t->pair_cap = cap;
    return 0;
}

static int pairs_room(Table *t, size_t more) {
    if ((t->pair_count + more) * 5 <= t->pair_cap * 4) return 0;
    size_t cap = grown(t->pair_cap, 16);
    while ((t->pair_count + more) * 5 > cap * 4) cap = grown(cap, 16);
    return pairs_resize(t, cap);
}

static void pairs_insert(Table *t, uint64_t key, uint32_t slot, uint32_t value) {
    size_t i = home(pair_hash(key, slot), t->pair_cap);
    while (t->pairs[i].replica != 0) if (++i == t->pair_cap) i = 0;
    t->pairs[i].key = key; t->pairs[i].replica = slot + 1u; t->pairs[i].value = value;
    t->pair_count++;
}

static void pairs_delete(Table *t, size_t i) {
    size_t cap = t->pair_cap, j = i;
    for (;;) {
        j = (j + 1 == cap) ? 0 : j + 1;
        if (t->pairs[j].replica == 0) break;
        size_t k = home(pair_hash(t->pairs[j].key, t->pairs[j].replica - 1u), cap);
        if ((j + cap - i) % cap <= (j + cap - k) % cap) { t->pairs[i] = t->pairs[j]; i = j; }
    }
    memset(&t->pairs[i], 0, sizeof(PairSlot));
    t->pair_count--;
}

/* -- masks ----------------------------------------------------------------------------- */

static inline uint64_t *mask_at(const Table *t, uint32_t m) { return t->masks + (size_t)m * t->words; }

static int mask_alloc(Table *t, uint32_t *out) {
    if (t->mask_free != NIL) {
        uint32_t m = t->mask_free;
        t->mask_free = (uint32_t)mask_at(t, m)[0];
        memset(mask_at(t, m), 0, t->words * sizeof(uint64_t));
        *out = m; return 0;
    }
    if (t->mask_used == t->mask_cap) {
        size_t cap = grown(t->mask_cap, 16);
        uint64_t *masks = raw_realloc(t->masks, cap * t->words, sizeof(uint64_t));
        if (masks == NULL) { PyErr_NoMemory(); return -1; }
        t->masks = masks; t->mask_cap = cap;
    }
    *out = (uint32_t)t->mask_used++;
    memset(mask_at(t, *out), 0, t->words * sizeof(uint64_t));
    return 0;
}

static void mask_release(Table *t, uint32_t m) {
    mask_at(t, m)[0] = t->mask_free;
    t->mask_free = m;
}

/* -- replica slots ---------------------------------------------------------------------- */

static int slot_room(Table *t, Py_ssize_t slot) {
    if (slot < 0 || slot >= MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "replica slot must be in [0, %d)", MAX_SLOTS);
        return -1;
    }
    size_t words = (size_t)slot / 64 + 1;
    if (words > t->words) {
        uint64_t *masks = NULL;
        if (t->mask_cap) {
            masks = PyMem_RawCalloc(t->mask_cap * words, sizeof(uint64_t));
            if (masks == NULL) { PyErr_NoMemory(); return -1; }
            for (size_t m = 0; m < t->mask_used; m++)
                memcpy(masks + m * words, t->masks + m * t->words, t->words * sizeof(uint64_t));
        }
        PyMem_RawFree(t->masks);
        t->masks = masks; t->words = words;
    }
    if ((size_t)slot < t->slot_cap) return 0;
    size_t cap = grown(t->slot_cap, 8);
    while (cap <= (size_t)slot) cap = grown(cap, 8);
    uint32_t *head = raw_realloc(t->head, cap, sizeof(uint32_t));
    if (head) t->head = head;
    uint32_t *tail = raw_realloc(t->tail, cap, sizeof(uint32_t));
    if (tail) t->tail = tail;
    uint64_t *size = raw_realloc(t->size, cap, sizeof(uint64_t));
    if (size) t->size = size;
    if (!head || !tail || !size) { PyErr_NoMemory(); return -1; }
    for (size_t s = t->slot_cap; s < cap; s++) { head[s] = tail[s] = NIL; size[s] = 0; }
    t->slot_cap = cap;
    return 0;
}

/* -- pairs: (key, slot) -> value ------------------------------------------------------------ */

static inline int has_bit(const uint64_t *mask, size_t words, uint32_t slot) {
    return slot / 64 < words && ((mask[slot / 64] >> (slot % 64)) & 1u);
}

/* The value's address, or NULL when the pair is absent. */
static uint32_t *pair_value(Table *t, uint64_t key, uint32_t slot) {
    size_t i = key_find(t, key);
    if (i == NONE) return NULL;
    KeySlot *ks = &t->keys[i];
    if (IS_SINGLE(ks->holder)) return SLOT_OF(ks->holder) == slot ? &ks->value : NULL;
    if (!has_bit(mask_at(t, MASK_OF(ks->holder)), t->words, slot)) return NULL;
    return &t->pairs[pairs_find(t, key, slot)].value;
}

/* Insert an absent pair. */
static int pair_insert(Table *t, uint64_t key, uint32_t slot, uint32_t value) {
    size_t i = key_find(t, key);
    if (i == NONE) {
        if (key_room(t) < 0) return -1;
        i = key_place(t->keys, t->key_cap, key);
        t->keys[i].key = key; t->keys[i].holder = SINGLE(slot); t->keys[i].value = value;
        t->key_count++;
    } else if (IS_SINGLE(t->keys[i].holder)) {
        uint32_t m;
        if (pairs_room(t, 2) < 0 || mask_alloc(t, &m) < 0) return -1;
        uint32_t first = SLOT_OF(t->keys[i].holder);
        uint64_t *mask = mask_at(t, m);
        mask[first / 64] |= 1ULL << (first % 64);
        mask[slot / 64] |= 1ULL << (slot % 64);
        pairs_insert(t, key, first, t->keys[i].value);
        pairs_insert(t, key, slot, value);
        t->keys[i].holder = MULTI(m); t->keys[i].value = 0;
    } else {
        if (pairs_room(t, 1) < 0) return -1;
        mask_at(t, MASK_OF(t->keys[i].holder))[slot / 64] |= 1ULL << (slot % 64);
        pairs_insert(t, key, slot, value);
    }
    t->size[slot]++;
    return 0;
}

/* Delete a pair; 1 and its value when it was there. */
static int pair_delete(Table *t, uint64_t key, uint32_t slot, uint32_t *old) {
    size_t i = key_find(t, key);
    if (i == NONE) return 0;
    KeySlot *ks = &t->keys[i];
    if (IS_SINGLE(ks->holder)) {
        if (SLOT_OF(ks->holder) != slot) return 0;
        *old = ks->value;
        key_delete(t, i);
    } else {
        uint32_t m = MASK_OF(ks->holder);
        uint64_t *mask = mask_at(t, m);
        if (!has_bit(mask, t->words, slot)) return 0;
        size_t p = pairs_find(t, key, slot);
        *old = t->pairs[p].value;
        pairs_delete(t, p);
        mask[slot / 64] &= ~(1ULL << (slot % 64));
        int count = 0; size_t last = 0;
        for (size_t w = 0; w < t->words; w++)
            if (mask[w]) { count += __builtin_popcountll(mask[w]); last = w; }
        if (count == 1) { /* back to one holder, inline */
            uint32_t other = (uint32_t)(last * 64 + (size_t)__builtin_ctzll(mask[last]));
            size_t q = pairs_find(t, key, other);
            ks->value = t->pairs[q].value;
            ks->holder = SINGLE(other);
            pairs_delete(t, q);
            mask_release(t, m);
        }
    }
    t->size[slot]--;
    return 1;
}

/* -- nodes (ordered tables): one LRU list per slot ------------------------------------------- */

static int node_alloc(Table *t, uint32_t *out) {
    if (t->node_free != NIL) { *out = t->node_free; t->node_free = t->node_next[*out]; return 0; }
    if (t->node_used == t->node_cap) {
        size_t cap = grown(t->node_cap, 16);
        if (cap >= NIL) { PyErr_NoMemory(); return -1; }
        uint64_t *key = raw_realloc(t->node_key, cap, sizeof(uint64_t));
        if (key) t->node_key = key;
        double *stamp = raw_realloc(t->node_stamp, cap, sizeof(double));
        if (stamp) t->node_stamp = stamp;
        uint32_t *prev = raw_realloc(t->node_prev, cap, sizeof(uint32_t));
        if (prev) t->node_prev = prev;
        uint32_t *next = raw_realloc(t->node_next, cap, sizeof(uint32_t));
        if (next) t->node_next = next;
        if (!key || !stamp || !prev || !next) { PyErr_NoMemory(); return -1; }
        t->node_cap = cap;
    }
    *out = (uint32_t)t->node_used++;
    return 0;
}

static void unlink_node(Table *t, uint32_t slot, uint32_t n) {
    uint32_t prev = t->node_prev[n], next = t->node_next[n];
    if (prev == NIL) t->head[slot] = next; else t->node_next[prev] = next;
    if (next == NIL) t->tail[slot] = prev; else t->node_prev[next] = prev;
}

static void append_node(Table *t, uint32_t slot, uint32_t n) {
    uint32_t last = t->tail[slot];
    t->node_prev[n] = last; t->node_next[n] = NIL;
    if (last == NIL) t->head[slot] = n; else t->node_next[last] = n;
    t->tail[slot] = n;
}

static void pop_oldest(Table *t, uint32_t slot) {
    uint32_t n = t->head[slot], unused;
    pair_delete(t, t->node_key[n], slot, &unused);
    unlink_node(t, slot, n);
    t->node_next[n] = t->node_free; t->node_free = n;
}

static inline int fresh(double stamp, double threshold, int strict) {
    return strict ? stamp > threshold : stamp >= threshold;
}

/* -- Python glue ------------------------------------------------------------------------------ */

typedef struct { uint64_t *keys; Py_ssize_t count; uint64_t stack[512]; } Keys;

static int keys_of(PyObject *sequence, Keys *out) {
    PyObject *fast = PySequence_Fast(sequence, "block hashes must be a sequence");
    if (fast == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    out->count = count;
    out->keys = count <= 512 ? out->stack : PyMem_RawMalloc((size_t)count * sizeof(uint64_t));
    if (out->keys == NULL) { Py_DECREF(fast); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "block hashes must be ints");
            goto fail;
        }
        out->keys[i] = PyLong_AsUnsignedLongLongMask(items[i]);
        if (out->keys[i] == (uint64_t)-1 && PyErr_Occurred()) goto fail;
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    if (out->keys != out->stack) PyMem_RawFree(out->keys);
    return -1;
}

static void keys_free(Keys *k) { if (k->keys != k->stack) PyMem_RawFree(k->keys); }

static int key_arg(PyObject *obj, uint64_t *out) {
    if (!PyLong_Check(obj)) { PyErr_SetString(PyExc_TypeError, "a block hash must be an int"); return -1; }
    *out = PyLong_AsUnsignedLongLongMask(obj);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static int need_ordered(Table *t, int ordered) {
    if (t->ordered == ordered) return 0;
    PyErr_SetString(PyExc_TypeError, ordered ? "an ordered table's method" : "a counted table's method");
    return -1;
}

static int Table_init(Table *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"ordered", NULL};
    int ordered;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "p", names, &ordered)) return -1;
    if (self->words) { PyErr_SetString(PyExc_RuntimeError, "already initialised"); return -1; }
    self->ordered = ordered;
    self->words = 1;
    self->mask_free = self->node_free = NIL;
    return 0;
}

static void Table_dealloc(Table *self) {
    PyMem_RawFree(self->keys); PyMem_RawFree(self->pairs); PyMem_RawFree(self->masks);
    PyMem_RawFree(self->node_key); PyMem_RawFree(self->node_stamp);
    PyMem_RawFree(self->node_prev); PyMem_RawFree(self->node_next);
    PyMem_RawFree(self->head); PyMem_RawFree(self->tail); PyMem_RawFree(self->size);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Table_touch(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hashes; double stamp; int reverse;
    if (!PyArg_ParseTuple(args, "nOdp", &slot, &hashes, &stamp, &reverse)) return NULL;
    if (need_ordered(t, 1) < 0 || slot_room(t, slot) < 0) return NULL;
    Keys k;
    if (keys_of(hashes, &k) < 0) return NULL;
    uint32_t s = (uint32_t)slot;
    for (Py_ssize_t j = 0; j < k.count; j++) {
        uint64_t key = k.keys[reverse ? k.count - 1 - j : j];
        uint32_t *value = pair_value(t, key, s), n;
        if (value != NULL) {
            n = *value;
            unlink_node(t, s, n);
        } else {
            if (node_alloc(t, &n) < 0) goto fail;
            if (pair_insert(t, key, s, n) < 0) {
                t->node_next[n] = t->node_free; t->node_free = n;
                goto fail;
            }
            t->node_key[n] = key;
        }
        t->node_stamp[n] = stamp;
        append_node(t, s, n);
    }
    keys_free(&k);
    Py_RETURN_NONE;
fail:
    keys_free(&k);
    return NULL;
}

static PyObject *Table_evict(Table *t, PyObject *args) {
    Py_ssize_t slot; long long keep;
    if (!PyArg_ParseTuple(args, "nL", &slot, &keep)) return NULL;
    if (need_ordered(t, 1) < 0 || slot_room(t, slot) < 0) return NULL;
    long long dropped = 0;
    while ((long long)t->size[slot] > (keep < 0 ? 0 : keep)) { pop_oldest(t, (uint32_t)slot); dropped++; }
    return PyLong_FromLongLong(dropped);
}

static PyObject *Table_drop_stale(Table *t, PyObject *args) {
    Py_ssize_t slot; double threshold; int strict;
    if (!PyArg_ParseTuple(args, "ndp", &slot, &threshold, &strict)) return NULL;
    if (need_ordered(t, 1) < 0 || slot_room(t, slot) < 0) return NULL;
    long long dropped = 0;
    while (t->head[slot] != NIL && !fresh(t->node_stamp[t->head[slot]], threshold, strict)) {
        pop_oldest(t, (uint32_t)slot);
        dropped++;
    }
    return PyLong_FromLongLong(dropped);
}

static PyObject *Table_stamp(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hash; uint64_t key;
    if (!PyArg_ParseTuple(args, "nO", &slot, &hash)) return NULL;
    if (need_ordered(t, 1) < 0 || slot_room(t, slot) < 0 || key_arg(hash, &key) < 0) return NULL;
    uint32_t *value = pair_value(t, key, (uint32_t)slot);
    if (value == NULL) Py_RETURN_NONE;
    return PyFloat_FromDouble(t->node_stamp[*value]);
}

/* One reference more to a pair of a counted table (inserted at 1); -1 with an exception set. */
static int count_up(Table *t, uint64_t key, uint32_t slot) {
    uint32_t *value = pair_value(t, key, slot);
    if (value == NULL) return pair_insert(t, key, slot, 1);
    if (*value == UINT32_MAX) { PyErr_SetString(PyExc_OverflowError, "count"); return -1; }
    (*value)++;
    return 0;
}

/* One reference less (the pair goes at 0); 1 when the pair was there. */
static int count_down(Table *t, uint64_t key, uint32_t slot) {
    uint32_t *value = pair_value(t, key, slot), unused;
    if (value == NULL) return 0;
    if (*value > 1) (*value)--;
    else pair_delete(t, key, slot, &unused);
    return 1;
}

static PyObject *Table_add(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hash; uint64_t key;
    if (!PyArg_ParseTuple(args, "nO", &slot, &hash)) return NULL;
    if (need_ordered(t, 0) < 0 || slot_room(t, slot) < 0 || key_arg(hash, &key) < 0) return NULL;
    if (count_up(t, key, (uint32_t)slot) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Table_release(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hash; uint64_t key;
    if (!PyArg_ParseTuple(args, "nO", &slot, &hash)) return NULL;
    if (need_ordered(t, 0) < 0 || slot_room(t, slot) < 0 || key_arg(hash, &key) < 0) return NULL;
    count_down(t, key, (uint32_t)slot);
    Py_RETURN_NONE;
}

static PyObject *Table_add_all(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hashes;
    if (!PyArg_ParseTuple(args, "nO", &slot, &hashes)) return NULL;
    if (need_ordered(t, 0) < 0 || slot_room(t, slot) < 0) return NULL;
    Keys k;
    if (keys_of(hashes, &k) < 0) return NULL;
    Py_ssize_t j = 0;
    while (j < k.count && count_up(t, k.keys[j], (uint32_t)slot) == 0) j++;
    int failed = j < k.count;
    for (Py_ssize_t q = 0; failed && q < j; q++)  /* undo what was added: all or nothing */
        count_down(t, k.keys[q], (uint32_t)slot);
    keys_free(&k);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Table_release_all(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hashes;
    if (!PyArg_ParseTuple(args, "nO", &slot, &hashes)) return NULL;
    if (need_ordered(t, 0) < 0 || slot_room(t, slot) < 0) return NULL;
    Keys k;
    if (keys_of(hashes, &k) < 0) return NULL;
    Py_ssize_t released = 0;
    for (Py_ssize_t j = 0; j < k.count; j++)
        released += count_down(t, k.keys[j], (uint32_t)slot);
    keys_free(&k);
    return PyLong_FromSsize_t(released);
}

static PyObject *Table_count(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hash; uint64_t key;
    if (!PyArg_ParseTuple(args, "nO", &slot, &hash)) return NULL;
    if (need_ordered(t, 0) < 0 || slot_room(t, slot) < 0 || key_arg(hash, &key) < 0) return NULL;
    uint32_t *value = pair_value(t, key, (uint32_t)slot);
    return PyLong_FromUnsignedLong(value == NULL ? 0 : *value);
}

static PyObject *Table_discard(Table *t, PyObject *args) {
    Py_ssize_t slot; PyObject *hashes;
    if (!PyArg_ParseTuple(args, "nO", &slot, &hashes)) return NULL;
    if (slot_room(t, slot) < 0) return NULL;
    Keys k;
    if (keys_of(hashes, &k) < 0) return NULL;
    for (Py_ssize_t j = 0; j < k.count; j++) {
        uint32_t n;
        if (pair_delete(t, k.keys[j], (uint32_t)slot, &n) && t->ordered) {
            unlink_node(t, (uint32_t)slot, n);
            t->node_next[n] = t->node_free; t->node_free = n;
        }
    }
    keys_free(&k);
    Py_RETURN_NONE;
}

static PyObject *Table_clear(Table *t, PyObject *args) {
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "n", &slot)) return NULL;
    if (slot_room(t, slot) < 0) return NULL;
    uint32_t s = (uint32_t)slot, unused;
    if (t->ordered) {
        while (t->head[s] != NIL) pop_oldest(t, s);
    } else {
        /* No per-slot list: scan. A deletion shifts later entries back into i: look again. */
        size_t i = 0;
        while (t->size[s] != 0 && i < t->key_cap) {
            KeySlot *ks = &t->keys[i];
            if (ks->holder != 0 && IS_SINGLE(ks->holder) && SLOT_OF(ks->holder) == s) {
                pair_delete(t, ks->key, s, &unused);
                continue;
            }
            if (ks->holder != 0 && !IS_SINGLE(ks->holder)) pair_delete(t, ks->key, s, &unused);
            i++;
        }
    }
    /* Give memory back once the table is mostly empty. */
    if (t->key_cap > 64 && t->key_count * 5 < t->key_cap && key_resize(t, t->key_count * 2 + 16) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Table_size(Table *t, PyObject *args) {
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "n", &slot)) return NULL;
    if (slot < 0) { PyErr_SetString(PyExc_ValueError, "negative slot"); return NULL; }
    return PyLong_FromUnsignedLongLong((size_t)slot < t->slot_cap ? t->size[slot] : 0);
}

/* The holders of a key ORed into out (words wide); 0 when none. */
static inline int holders(const Table *t, uint64_t key, uint64_t *out, size_t words) {
    size_t i = key_find(t, key);
    if (i == NONE) return 0;
    uint32_t h = t->keys[i].holder;
    if (IS_SINGLE(h)) { uint32_t s = SLOT_OF(h); out[s / 64] |= 1ULL << (s % 64); return 1; }
    const uint64_t *mask = mask_at(t, MASK_OF(h));
    size_t n = t->words < words ? t->words : words;
    for (size_t w = 0; w < n; w++) out[w] |= mask[w];
    return 1;
}

static inline int ordered_fresh(Table *t, uint64_t key, uint32_t slot, double threshold, int strict) {
    uint32_t *value = pair_value(t, key, slot);
    return value != NULL && fresh(t->node_stamp[*value], threshold, strict);
}

/* match(hashes, ids, threshold, strict, speculative=None) -> {ids[slot]: leading blocks}
 *
 * One walk over the hashes intersects holder sets; a replica's raw run ends where it
 * drops out. Then freshness, per matching replica only:
 * - this table ordered (approximate): a held chain block implies its whole prefix was
 *   touched no earlier, so if the run's last block is fresh all are; otherwise the
 *   fresh run is binary-searched inside it.
 * - this table counted, speculative ordered (precise): a block held only
 *   speculatively must be fresh there. If the last such block of the run is fresh,
 *   the earlier ones are (they were speculated with it or later); otherwise the run
 *   is walked block by block for that replica.
 */
static PyObject *Table_match(Table *t, PyObject *args) {
    PyObject *hashes, *ids, *other_obj = Py_None;
    double threshold; int strict;
    if (!PyArg_ParseTuple(args, "OO!dp|O", &hashes, &PyList_Type, &ids, &threshold, &strict,
                          &other_obj))
        return NULL;
    Table *spec = NULL;
    if (other_obj != Py_None) {
        if (Py_TYPE(other_obj) != Py_TYPE(t)) { PyErr_SetString(PyExc_TypeError, "speculative must be a BlockTable"); return NULL; }
        spec = (Table *)other_obj;
        if (t->ordered || !spec->ordered) { PyErr_SetString(PyExc_TypeError, "match(speculative=...) needs a counted table and an ordered one"); return NULL; }
    }
    Keys k;
    if (keys_of(hashes, &k) < 0) return NULL;
    PyObject *result = PyDict_New();
    if (result == NULL || k.count == 0) { keys_free(&k); return result; }
    size_t words = t->words;
    if (spec && spec->words > words) words = spec->words;
    uint64_t alive[MAX_WORDS] = {0}, hold[MAX_WORDS], held_here[MAX_WORDS];
    /* Scratch per matching replica; static (not on the stack) as the GIL serialises calls. */
    static int32_t last_spec[MAX_SLOTS];
    static uint32_t found_slot[MAX_SLOTS];
    static Py_ssize_t found_run[MAX_SLOTS];
    size_t found = 0;
    int any = holders(t, k.keys[0], alive, words);
    if (spec) {
        memcpy(held_here, alive, words * sizeof(uint64_t));
        any |= holders(spec, k.keys[0], alive, words);
        for (size_t w = 0; w < words; w++) {
            uint64_t bits = alive[w];
            while (bits) {
                uint32_t s = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(bits)); bits &= bits - 1;
                last_spec[s] = ((held_here[w] >> (s % 64)) & 1u) ? -1 : 0;
            }
        }
    }
    Py_ssize_t i = 1;
    for (; any && i < k.count; i++) {
        if (i + PREFETCH_AHEAD < k.count && t->key_cap)
            __builtin_prefetch(&t->keys[home(mix64(k.keys[i + PREFETCH_AHEAD]), t->key_cap)]);
        memset(hold, 0, words * sizeof(uint64_t));
        holders(t, k.keys[i], hold, words);
        if (spec) {
            memcpy(held_here, hold, words * sizeof(uint64_t));
            holders(spec, k.keys[i], hold, words);
        }
        any = 0;
        for (size_t w = 0; w < words; w++) {
            uint64_t dropped = alive[w] & ~hold[w];
            while (dropped) {
                uint32_t s = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(dropped)); dropped &= dropped - 1;
                found_slot[found] = s; found_run[found++] = i;
            }
            alive[w] &= hold[w];
            if (spec) {
                uint64_t speculative_only = alive[w] & ~held_here[w];
                while (speculative_only) {
                    uint32_t s = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(speculative_only));
                    speculative_only &= speculative_only - 1;
                    last_spec[s] = (int32_t)i;
                }
            }
            any |= alive[w] != 0;
        }
    }
    for (size_t w = 0; any && w < words; w++) {
        uint64_t bits = alive[w];
        while (bits) {
            uint32_t s = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(bits)); bits &= bits - 1;
            found_slot[found] = s; found_run[found++] = k.count;
        }
    }
    for (size_t f = 0; f < found; f++) {
        uint32_t s = found_slot[f];
        Py_ssize_t run = found_run[f];
        if (t->ordered && !ordered_fresh(t, k.keys[run - 1], s, threshold, strict)) {
            Py_ssize_t low = 0, high = run - 1;
            while (low < high) {
                Py_ssize_t middle = (low + high + 1) / 2;
                if (ordered_fresh(t, k.keys[middle - 1], s, threshold, strict)) low = middle;
                else high = middle - 1;
            }
            run = low;
        } else if (spec && last_spec[s] >= 0
                   && !ordered_fresh(spec, k.keys[last_spec[s]], s, threshold, strict)) {
            Py_ssize_t q = 0;
            while (q < run && (pair_value(t, k.keys[q], s) != NULL
                               || ordered_fresh(spec, k.keys[q], s, threshold, strict)))
                q++;
            run = q;
        }
        if (run == 0) continue;
        if ((Py_ssize_t)s >= PyList_GET_SIZE(ids)) { PyErr_SetString(PyExc_IndexError, "ids shorter than the slots"); goto fail; }
        PyObject *count = PyLong_FromSsize_t(run);
        if (count == NULL || PyDict_SetItem(result, PyList_GET_ITEM(ids, s), count) < 0) { Py_XDECREF(count); goto fail; }
        Py_DECREF(count);
    }
    keys_free(&k);
    return result;
fail:
    keys_free(&k);
    Py_DECREF(result);
    return NULL;
}

static PyObject *Table_ordered(Table *t, void *closure) { return PyBool_FromLong(t->ordered); }

static PyMethodDef Table_methods[] = {
    {"touch", (PyCFunction)Table_touch, METH_VARARGS, "touch(slot, hashes, stamp, reverse): ordered: move to the newest end (insert if absent), with this stamp"},
    {"evict", (PyCFunction)Table_evict, METH_VARARGS, "evict(slot, keep) -> dropped: ordered: drop the oldest until at most keep remain"},
    {"drop_stale", (PyCFunction)Table_drop_stale, METH_VARARGS, "drop_stale(slot, threshold, strict) -> dropped: ordered: drop the oldest while not fresh"},
    {"stamp", (PyCFunction)Table_stamp, METH_VARARGS, "stamp(slot, hash) -> float | None: ordered"},
    {"add", (PyCFunction)Table_add, METH_VARARGS, "add(slot, hash): counted: one more reference"},
    {"release", (PyCFunction)Table_release, METH_VARARGS, "release(slot, hash): counted: one reference less (gone at 0)"},
    {"add_all", (PyCFunction)Table_add_all, METH_VARARGS, "add_all(slot, hashes): counted: one more reference to each (a repeated hash counts twice)"},
    {"release_all", (PyCFunction)Table_release_all, METH_VARARGS, "release_all(slot, hashes) -> released: counted: one reference less to each held (gone at 0); how many were held"},
    {"count", (PyCFunction)Table_count, METH_VARARGS, "count(slot, hash) -> int: counted"},
    {"discard", (PyCFunction)Table_discard, METH_VARARGS, "discard(slot, hashes): drop these pairs"},
    {"clear", (PyCFunction)Table_clear, METH_VARARGS, "clear(slot): drop every pair of the slot"},
    {"size", (PyCFunction)Table_size, METH_VARARGS, "size(slot) -> int: distinct hashes of the slot"},
    {"match", (PyCFunction)Table_match, METH_VARARGS, "match(hashes, ids, threshold, strict, speculative=None) -> {ids[slot]: leading blocks}"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Table_getset[] = {
    {"ordered", (getter)Table_ordered, NULL, "LRU lists and stamps (True) or reference counts", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "policies._blocktable.BlockTable",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "(block hash, replica slot) pairs, indexed by hash; see policies/block_table.py",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
    .tp_getset = Table_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_blocktable", "The compiled block table of policies.block_table.", -1, NULL,
};

PyMODINIT_FUNC PyInit__blocktable(void) {
    if (PyType_Ready(&TableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "BlockTable", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType); Py_DECREF(m); return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_SLOTS", MAX_SLOTS) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
