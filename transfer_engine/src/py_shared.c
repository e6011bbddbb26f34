/* The Python type SharedLimit (automdt.transfer_engine._engine.SharedLimit): a total rate that
 * the write stages of several receivers share, one emulated destination disk (stage.h,
 * amdt_shared_clock). A Receiver given one keeps a reference until its threads are joined. */
#include "py_common.h"

typedef struct {
    PyObject_HEAD
    amdt_shared_clock clock;
    int ready; /* the mutex is initialised */
} amdt_py_shared;

static int SharedLimit_init(amdt_py_shared *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"total_bps", NULL};
    long long bps;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "SharedLimit.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L", kwlist, &bps))
        return -1;
    if (bps <= 0) {
        PyErr_Format(PyExc_ValueError, "total_bps must be > 0, got %lld", bps);
        return -1;
    }
    if (pthread_mutex_init(&self->clock.mu, NULL) != 0) {
        PyErr_SetString(PyExc_OSError, "SharedLimit: pthread_mutex_init failed");
        return -1;
    }
    self->clock.total_bps = (uint64_t)bps;
    self->clock.next_ns = 0;
    self->ready = 1;
    return 0;
}

static void SharedLimit_dealloc(PyObject *obj)
{
    amdt_py_shared *self = (amdt_py_shared *)obj;
    PyTypeObject *tp = Py_TYPE(obj);
    if (self->ready)
        pthread_mutex_destroy(&self->clock.mu);
    tp->tp_free(obj);
    Py_DECREF(tp);
}

static PyObject *SharedLimit_get_total_bps(amdt_py_shared *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->clock.total_bps);
}

amdt_shared_clock *amdt_py_shared_clock(PyObject *obj)
{
    if (Py_TYPE(obj)->tp_dealloc != SharedLimit_dealloc) {
        PyErr_Format(PyExc_TypeError, "write_shared must be a SharedLimit or None, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    amdt_py_shared *self = (amdt_py_shared *)obj;
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "SharedLimit was not initialised");
        return NULL;
    }
    return &self->clock;
}

static PyGetSetDef SharedLimit_getset[] = {
    {"total_bps", (getter)SharedLimit_get_total_bps, NULL, "the shared rate, bytes/s", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot SharedLimit_slots[] = {
    {Py_tp_doc, "SharedLimit(total_bps): a write rate several receivers share"},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, SharedLimit_init},
    {Py_tp_dealloc, SharedLimit_dealloc},
    {Py_tp_getset, SharedLimit_getset},
    {0, NULL},
};

PyType_Spec amdt_py_shared_spec = {
    .name = "automdt.transfer_engine._engine.SharedLimit",
    .basicsize = sizeof(amdt_py_shared),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = SharedLimit_slots,
};
