/* gateway._relay: a relayed stream's per-chunk work, compiled (see
 * gateway/request/streaming.py, "EventTap", and gateway/server/http.py,
 * "CycleBodyWriter").
 *
 * Once a stream is poured (engine.backends.h1), every chunk the replica's
 * parser takes out is handed to one callable, in the call that parsed it. In
 * Python that callable was three functions deep (the usage observer's feed, the
 * event-edge check, the chunked-encoding write): at a hundred streams, with the
 * interpreter's caches cold between chunks, those frames cost as much as the
 * system call that writes the chunk (docs/benchmarks/overhead.md). Here they are
 * two C calls:
 *
 * - EventTap(edge, write): counts a chunk's events and bytes and keeps the
 *   stream's tail (what the usage observer reads at the end:
 *   gateway.request.usage.StreamObserver.merge), hands a chunk that does not end
 *   an event to ``edge.take`` (Python, the rare case), and passes the rest to
 *   ``write``.
 * - ChunkedWriter(cycle): uvicorn's httptools cycle's own framing of a body
 *   chunk (hex length, CRLF, the bytes, CRLF) written on its transport unless
 *   the client is gone; returns False when the transport asks to pause.
 *
 * Both have pure-Python twins with the same behaviour (PyEventTap,
 * CycleBodyWriter.write), used where this module is not built; the unit tests
 * run both on the same chunks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define TAIL_BYTES 16384 /* gateway.request.usage._TAIL_BYTES */

static PyObject *str_held, *str_take, *str_disconnected, *str_write_paused, *str_transport,
    *str_flow, *str_write;

/* -- ChunkedWriter --------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *cycle;
    PyObject *flow;
    PyObject *write; /* the cycle's transport.write */
} ChunkedWriter;

static int ChunkedWriter_init(ChunkedWriter *self, PyObject *args, PyObject *kwds) {
    PyObject *cycle;
    if (!PyArg_ParseTuple(args, "O:ChunkedWriter", &cycle))
        return -1;
    PyObject *transport = PyObject_GetAttr(cycle, str_transport);
    if (!transport)
        return -1;
    PyObject *write = PyObject_GetAttr(transport, str_write);
    Py_DECREF(transport);
    if (!write)
        return -1;
    PyObject *flow = PyObject_GetAttr(cycle, str_flow);
    if (!flow) {
        Py_DECREF(write);
        return -1;
    }
    Py_INCREF(cycle);
    Py_XSETREF(self->cycle, cycle);
    Py_XSETREF(self->flow, flow);
    Py_XSETREF(self->write, write);
    return 0;
}

static int truth_of(PyObject *owner, PyObject *name) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (!value)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

static PyObject *chunked_write(ChunkedWriter *self, PyObject *chunk) {
    if (!PyBytes_Check(chunk)) {
        PyErr_SetString(PyExc_TypeError, "a chunk is bytes");
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(chunk);
    if (size) {
        int gone = truth_of(self->cycle, str_disconnected);
        if (gone < 0)
            return NULL;
        if (!gone) {
            char head[24];
            int at = snprintf(head, sizeof head, "%zx\r\n", (size_t)size);
            PyObject *frame = PyBytes_FromStringAndSize(NULL, at + size + 2);
            if (!frame)
                return NULL;
            char *out = PyBytes_AS_STRING(frame);
            memcpy(out, head, (size_t)at);
            memcpy(out + at, PyBytes_AS_STRING(chunk), (size_t)size);
            out[at + size] = '\r';
            out[at + size + 1] = '\n';
            PyObject *done = PyObject_CallOneArg(self->write, frame);
            Py_DECREF(frame);
            if (!done)
                return NULL;
            Py_DECREF(done);
        }
    }
    int paused = truth_of(self->flow, str_write_paused);
    if (paused < 0)
        return NULL;
    return PyBool_FromLong(!paused);
}

static PyObject *ChunkedWriter_call(ChunkedWriter *self, PyObject *args, PyObject *kwds) {
    PyObject *chunk;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "ChunkedWriter takes one chunk");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:ChunkedWriter", &chunk))
        return NULL;
    return chunked_write(self, chunk);
}

static int ChunkedWriter_traverse(ChunkedWriter *self, visitproc visit, void *arg) {
    Py_VISIT(self->cycle);
    Py_VISIT(self->flow);
    Py_VISIT(self->write);
    return 0;
}

static int ChunkedWriter_clear(ChunkedWriter *self) {
    Py_CLEAR(self->cycle);
    Py_CLEAR(self->flow);
    Py_CLEAR(self->write);
    return 0;
}

static void ChunkedWriter_dealloc(ChunkedWriter *self) {
    PyObject_GC_UnTrack(self);
    ChunkedWriter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ChunkedWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._relay.ChunkedWriter",
    .tp_doc = "ChunkedWriter(cycle): write(chunk) -> bool, a body chunk in chunked encoding "
              "on the cycle's transport unless its client is gone; False when the "
              "transport asks to pause.",
    .tp_basicsize = sizeof(ChunkedWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ChunkedWriter_init,
    .tp_call = (ternaryfunc)ChunkedWriter_call,
    .tp_traverse = (traverseproc)ChunkedWriter_traverse,
    .tp_clear = (inquiry)ChunkedWriter_clear,
    .tp_dealloc = (destructor)ChunkedWriter_dealloc,
};

/* -- EventTap ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *edge;  /* an EventEdge, or None */
    PyObject *write; /* write(chunk) -> bool */
    PyObject *kept;  /* list of the last chunks; those before `first` are dropped */
    Py_ssize_t first;
    Py_ssize_t kept_bytes; /* bytes of kept[first:] */
    long long events;
    long long size;
} EventTap;

static int EventTap_init(EventTap *self, PyObject *args, PyObject *kwds) {
    PyObject *edge, *write;
    if (!PyArg_ParseTuple(args, "OO:EventTap", &edge, &write))
        return -1;
    PyObject *kept = PyList_New(0);
    if (!kept)
        return -1;
    Py_INCREF(edge);
    Py_INCREF(write);
    Py_XSETREF(self->edge, edge);
    Py_XSETREF(self->write, write);
    Py_XSETREF(self->kept, kept);
    self->first = 0;
    self->kept_bytes = 0;
    self->events = 0;
    self->size = 0;
    return 0;
}

static Py_ssize_t count_events(const char *data, Py_ssize_t size) {
    /* occurrences of "data: " (what StreamObserver.feed counts) */
    Py_ssize_t found = 0;
    const char *at = data, *end = data + size;
    while (end - at >= 6) {
        const char *d = memchr(at, 'd', (size_t)(end - at - 5));
        if (!d)
            break;
        if (memcmp(d, "data: ", 6) == 0) {
            found++;
            at = d + 6;
        } else {
            at = d + 1;
        }
    }
    return found;
}

static int ends_an_event(const char *data, Py_ssize_t size) {
    /* gateway.request.streaming.EVENT_ENDS: "\n\n", "\r\n\r\n", "\r\r" */
    if (size >= 2 && data[size - 1] == '\n' && data[size - 2] == '\n')
        return 1;
    if (size >= 4 && memcmp(data + size - 4, "\r\n\r\n", 4) == 0)
        return 1;
    if (size >= 2 && data[size - 1] == '\r' && data[size - 2] == '\r')
        return 1;
    return 0;
}

static int keep(EventTap *self, PyObject *chunk) {
    /* StreamObserver.feed's tail: the last chunks, at least TAIL_BYTES of them */
    if (PyList_Append(self->kept, chunk) < 0)
        return -1;
    self->kept_bytes += PyBytes_GET_SIZE(chunk);
    Py_ssize_t count = PyList_GET_SIZE(self->kept);
    while (self->first < count - 1) {
        Py_ssize_t oldest = PyBytes_GET_SIZE(PyList_GET_ITEM(self->kept, self->first));
        if (self->kept_bytes - oldest < TAIL_BYTES)
            break;
        self->kept_bytes -= oldest;
        self->first++;
    }
    if (self->first >= 64 && self->first * 2 >= count) {
        if (PyList_SetSlice(self->kept, 0, self->first, NULL) < 0)
            return -1;
        self->first = 0;
    }
    return 0;
}

static PyObject *tap(EventTap *self, PyObject *chunk) {
    if (!PyBytes_Check(chunk)) {
        PyErr_SetString(PyExc_TypeError, "a chunk is bytes");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(chunk);
    Py_ssize_t size = PyBytes_GET_SIZE(chunk);
    self->events += count_events(data, size);
    self->size += size;
    if (keep(self, chunk) < 0)
        return NULL;
    PyObject *out = chunk;
    Py_INCREF(out);
    if (self->edge != Py_None) {
        int held = truth_of(self->edge, str_held);
        if (held < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if (held || !ends_an_event(data, size)) {
            Py_SETREF(out, PyObject_CallMethodOneArg(self->edge, str_take, chunk));
            if (!out)
                return NULL;
            int any = PyObject_IsTrue(out);
            if (any <= 0) {
                Py_DECREF(out);
                if (any < 0)
                    return NULL;
                Py_RETURN_TRUE;
            }
        }
    }
    PyObject *result;
    if (Py_IS_TYPE(self->write, &ChunkedWriterType))
        result = chunked_write((ChunkedWriter *)self->write, out);
    else
        result = PyObject_CallOneArg(self->write, out);
    Py_DECREF(out);
    return result;
}

static PyObject *EventTap_call(EventTap *self, PyObject *args, PyObject *kwds) {
    PyObject *chunk;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "EventTap takes one chunk");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:EventTap", &chunk))
        return NULL;
    return tap(self, chunk);
}

static PyObject *EventTap_tail(EventTap *self, PyObject *unused) {
    return PyList_GetSlice(self->kept, self->first, PyList_GET_SIZE(self->kept));
}

static int EventTap_traverse(EventTap *self, visitproc visit, void *arg) {
    Py_VISIT(self->edge);
    Py_VISIT(self->write);
    Py_VISIT(self->kept);
    return 0;
}

static int EventTap_clear(EventTap *self) {
    Py_CLEAR(self->edge);
    Py_CLEAR(self->write);
    Py_CLEAR(self->kept);
    return 0;
}

static void EventTap_dealloc(EventTap *self) {
    PyObject_GC_UnTrack(self);
    EventTap_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef EventTap_methods[] = {
    {"tail", (PyCFunction)EventTap_tail, METH_NOARGS,
     "The last chunks tapped, at least 16 KiB of them once that much went by."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef EventTap_members[] = {
    {"events", T_LONGLONG, offsetof(EventTap, events), READONLY,
     "occurrences of 'data: ' in the chunks tapped"},
    {"size", T_LONGLONG, offsetof(EventTap, size), READONLY, "bytes tapped"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject EventTapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._relay.EventTap",
    .tp_doc = "EventTap(edge, write): tap(chunk) -> bool; see gateway.request.streaming.",
    .tp_basicsize = sizeof(EventTap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)EventTap_init,
    .tp_call = (ternaryfunc)EventTap_call,
    .tp_traverse = (traverseproc)EventTap_traverse,
    .tp_clear = (inquiry)EventTap_clear,
    .tp_dealloc = (destructor)EventTap_dealloc,
    .tp_methods = EventTap_methods,
    .tp_members = EventTap_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_relay", "A relayed stream's per-chunk work, compiled.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__relay(void) {
#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL
    INTERN(str_held, "held");
    INTERN(str_take, "take");
    INTERN(str_disconnected, "disconnected");
    INTERN(str_write_paused, "write_paused");
    INTERN(str_transport, "transport");
    INTERN(str_flow, "flow");
    INTERN(str_write, "write");
#undef INTERN
    if (PyType_Ready(&ChunkedWriterType) < 0 || PyType_Ready(&EventTapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&ChunkedWriterType);
    Py_INCREF(&EventTapType);
    if (PyModule_AddObject(m, "ChunkedWriter", (PyObject *)&ChunkedWriterType) < 0 ||
        PyModule_AddObject(m, "EventTap", (PyObject *)&EventTapType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "TAIL_BYTES", TAIL_BYTES);
    return m;
}
