/* What the Python types share (see py_common.h). */
#include "py_common.h"

/* ---- life cycle ------------------------------------------------------------------------ */

PyObject *amdt_py_new(PyTypeObject *type, const amdt_py_kind *kind)
{
    amdt_py_engine *self = (amdt_py_engine *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->kind = kind;
    return (PyObject *)self;
}

void amdt_py_dealloc(PyObject *obj)
{
    amdt_py_engine *self = (amdt_py_engine *)obj;
    PyTypeObject *tp = Py_TYPE(obj);
    if (self->engine != NULL) {
        void *e = self->engine;
        void (*free_engine)(void *) = self->kind->free;
        self->engine = NULL;
        Py_BEGIN_ALLOW_THREADS /* joins threads */
        free_engine(e);
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(self->peer); /* after the join: no thread uses the peer's engine any more */
    tp->tp_free(obj);
    Py_DECREF(tp);
}

PyObject *amdt_py_close(PyObject *obj, PyObject *Py_UNUSED(ignored))
{
    amdt_py_engine *self = (amdt_py_engine *)obj;
    if (self->engine == NULL || self->closing)
        Py_RETURN_NONE;
    self->closing = 1;
    void *e = self->engine;
    void (*close_engine)(void *) = self->kind->close;
    Py_BEGIN_ALLOW_THREADS /* joins every thread */
    close_engine(e);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyObject *amdt_py_get_closed(PyObject *obj, void *Py_UNUSED(closure))
{
    amdt_py_engine *self = (amdt_py_engine *)obj;
    return PyBool_FromLong(self->engine == NULL || self->closing);
}

int amdt_py_init_once(amdt_py_engine *self)
{
    if (self->engine != NULL) {
        const char *dot = strrchr(Py_TYPE(self)->tp_name, '.');
        PyErr_Format(PyExc_RuntimeError, "%s.__init__ called twice",
                     dot != NULL ? dot + 1 : Py_TYPE(self)->tp_name);
        return -1;
    }
    return 0;
}

int amdt_py_start(amdt_py_engine *self, const void *cfg)
{
    char err[AMDT_ERRLEN] = "";
    void *e;
    void *(*new_engine)(const void *, char *, size_t) = self->kind->new;
    Py_BEGIN_ALLOW_THREADS
    e = new_engine(cfg, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (e == NULL) {
        PyErr_SetString(*self->kind->new_error, err);
        return -1;
    }
    self->engine = e;
    return 0;
}

void *amdt_py_usable(amdt_py_engine *self)
{
    if (self->engine == NULL || self->closing) {
        PyErr_Format(PyExc_RuntimeError, "the %s is closed", self->kind->name);
        return NULL;
    }
    return self->engine;
}

void *amdt_py_readable(amdt_py_engine *self)
{
    if (self->engine == NULL)
        PyErr_Format(PyExc_RuntimeError, "the %s is not initialised", self->kind->name);
    return self->engine;
}

/* ---- shared methods -------------------------------------------------------------------- */

static PyObject *amdt_py_event_tuple(const amdt_event *ev)
{
    switch (ev->kind) {
    case AMDT_EV_FILE_ERROR:
        return Py_BuildValue("(sIis)", "file_error", ev->file_id, ev->err, ev->msg);
    case AMDT_EV_CONN_ERROR:
        return Py_BuildValue("(sis)", "conn_error", ev->err, ev->msg);
    case AMDT_EV_CONN_REJECTED:
        return Py_BuildValue("(ss)", "conn_rejected", ev->msg);
    case AMDT_EV_PROTOCOL_ERROR:
        return Py_BuildValue("(ss)", "protocol_error", ev->msg);
    case AMDT_EV_CHUNK_BAD:
        return Py_BuildValue("(sIKI)", "chunk_bad", ev->file_id, (unsigned long long)ev->offset,
                             ev->length);
    case AMDT_EV_FILE_DONE:
        return Py_BuildValue("(sI)", "file_done", ev->file_id);
    case AMDT_EV_WRITE_ERROR:
        return Py_BuildValue("(sIis)", "write_error", ev->file_id, ev->err, ev->msg);
    case AMDT_EV_DROPPED:
        return Py_BuildValue("(sK)", "events_dropped", (unsigned long long)ev->offset);
    default:
        return Py_BuildValue("(si)", "unknown", ev->kind);
    }
}

PyObject *amdt_py_events(PyObject *obj, PyObject *Py_UNUSED(ignored))
{
    amdt_py_engine *self = (amdt_py_engine *)obj;
    size_t n = 0;
    PyObject *list = NULL;
    if (amdt_py_readable(self) == NULL)
        return NULL;
    amdt_event *evs = amdt_events_drain(self->kind->events(self->engine), &n);
    if (evs == NULL && n == (size_t)-1)
        return PyErr_NoMemory();
    list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        goto error;
    for (size_t i = 0; i < n; i++) {
        PyObject *t = amdt_py_event_tuple(&evs[i]);
        if (t == NULL)
            goto error;
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    free(evs);
    return list;

error:
    free(evs);
    Py_XDECREF(list);
    return NULL;
}

PyObject *amdt_py_set_throttle(PyObject *obj, PyObject *args)
{
    amdt_py_engine *self = (amdt_py_engine *)obj;
    const char *name;
    long long t, T;
    void *e = amdt_py_usable(self);
    if (e == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "sLL", &name, &t, &T))
        return NULL;
    if (amdt_py_check_nonneg(t, "thread_bps") != 0 || amdt_py_check_nonneg(T, "total_bps") != 0)
        return NULL;
    amdt_stage *st = self->kind->stage(e, name);
    if (st == NULL) {
        PyErr_Format(PyExc_ValueError, "stage must be %s, got %R", self->kind->stage_names,
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    amdt_stage_set_throttle(st, (uint64_t)t, (uint64_t)T);
    Py_RETURN_NONE;
}

/* ---- arguments ------------------------------------------------------------------------- */

int amdt_py_check_u32(long long v, const char *name)
{
    if (v < 0 || v > 0xFFFFFFFFLL) {
        PyErr_Format(PyExc_ValueError, "%s must be in 0..2**32-1, got %lld", name, v);
        return -1;
    }
    return 0;
}

int amdt_py_check_nonneg(long long v, const char *name)
{
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0, got %lld", name, v);
        return -1;
    }
    return 0;
}

int amdt_py_check_range(long long v, long long lo, long long hi, const char *name)
{
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in %lld..%lld, got %lld", name, lo, hi, v);
        return -1;
    }
    return 0;
}

int amdt_py_check_engine_args(Py_buffer *token, long long chunk_size, long long memory_bytes,
                              PyObject *tls_key, uint8_t *key_buf, const uint8_t **key)
{
    *key = NULL;
    if (tls_key != NULL && tls_key != Py_None) {
        if (!PyBytes_Check(tls_key) || PyBytes_GET_SIZE(tls_key) != AMDT_TLS_KEY_LEN) {
            PyErr_Format(PyExc_ValueError, "tls_key must be None or %d bytes", AMDT_TLS_KEY_LEN);
            return -1;
        }
        memcpy(key_buf, PyBytes_AS_STRING(tls_key), AMDT_TLS_KEY_LEN);
        *key = key_buf;
    }
    if (token->len != AMDT_TOKEN_LEN) {
        PyErr_Format(PyExc_ValueError, "token must be %d bytes, got %zd", AMDT_TOKEN_LEN,
                     token->len);
        return -1;
    }
    if (amdt_py_check_nonneg(chunk_size, "chunk_size") != 0 ||
        amdt_py_check_nonneg(memory_bytes, "memory_bytes") != 0)
        return -1;
    return 0;
}

int amdt_py_parse_file_id(PyObject *args, uint32_t *id)
{
    long long v;
    if (!PyArg_ParseTuple(args, "L", &v) || amdt_py_check_u32(v, "file_id") != 0)
        return -1;
    *id = (uint32_t)v;
    return 0;
}

/* ---- results and errors ---------------------------------------------------------------- */

PyObject *amdt_py_stage_tuple(const amdt_stage_stats *st)
{
    return Py_BuildValue("(KKKKii)", (unsigned long long)st->bytes, (unsigned long long)st->busy_ns,
                         (unsigned long long)st->wait_ns, (unsigned long long)st->idle_ns,
                         st->target, st->live);
}

PyObject *amdt_py_buffer_tuple(const amdt_pool_stats *b)
{
    return Py_BuildValue("(KKKKKK)", (unsigned long long)b->fill_bytes,
                         (unsigned long long)b->capacity_bytes, (unsigned long long)b->slots_used,
                         (unsigned long long)b->slots_total, (unsigned long long)b->slots_allocated,
                         (unsigned long long)b->ready);
}

PyObject *amdt_py_engine_error(int rc, PyObject *exc, const char *err)
{
    if (rc == -3)
        return PyErr_NoMemory();
    PyErr_SetString(exc, err);
    return NULL;
}

PyObject *amdt_py_unknown_file(uint32_t id)
{
    PyErr_Format(PyExc_KeyError, "unknown file id %u", id);
    return NULL;
}

PyObject *amdt_py_thread_error(int rc)
{
    errno = rc;
    return PyErr_SetFromErrno(PyExc_OSError);
}
