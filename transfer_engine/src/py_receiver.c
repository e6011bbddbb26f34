/* The Python type Receiver (automdt.transfer_engine._engine.Receiver): see py_common.h. */
#include "py_common.h"
#include "receiver.h"

/* ---- the engine calls the shared methods use ------------------------------------------ */

static void *receiver_new(const void *cfg, char *err, size_t errlen)
{
    return amdt_receiver_new(cfg, err, errlen);
}

static void receiver_close(void *e)
{
    amdt_receiver_close(e);
}

static void receiver_free(void *e)
{
    amdt_receiver_free(e);
}

static amdt_events *receiver_events(void *e)
{
    return &((amdt_receiver *)e)->events;
}

static amdt_stage *receiver_stage(void *e, const char *name)
{
    if (strcmp(name, "write") == 0)
        return &((amdt_receiver *)e)->write;
    return strcmp(name, "recv") == 0 ? &((amdt_receiver *)e)->recv : NULL;
}

static const amdt_py_kind receiver_kind = {
    .name = "receiver",
    .stage_names = "'write' or 'recv'",
    .new_error = &PyExc_OSError,
    .new = receiver_new,
    .close = receiver_close,
    .free = receiver_free,
    .events = receiver_events,
    .stage = receiver_stage,
};

void *amdt_py_receiver_engine(PyObject *obj)
{
    if (Py_TYPE(obj)->tp_dealloc != amdt_py_dealloc ||
        ((amdt_py_engine *)obj)->kind != &receiver_kind) {
        PyErr_Format(PyExc_TypeError, "local must be a Receiver, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return amdt_py_usable((amdt_py_engine *)obj);
}

/* ---- methods --------------------------------------------------------------------------- */

static PyObject *Receiver_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    return amdt_py_new(type, &receiver_kind);
}

static int Receiver_init(amdt_py_engine *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"host",
                             "port",
                             "token",
                             "chunk_size",
                             "memory_bytes",
                             "max_threads",
                             "write_thread_bps",
                             "write_total_bps",
                             "rcvbuf",
                             "write_threads",
                             "tls_key",
                             "tls_per_record",
                             "write_shared",
                             NULL};
    const char *host;
    int port, max_threads = 64, rcvbuf = 0, nw = 1, tls_per_record = 0;
    Py_buffer tok = {0};
    long long chunk, mem, wt = 0, wT = 0;
    PyObject *tls_obj = Py_None, *shared_obj = Py_None;
    amdt_shared_clock *shared = NULL;
    uint8_t tls_key[AMDT_TLS_KEY_LEN];
    const uint8_t *key;

    if (amdt_py_init_once(self) != 0)
        return -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "siy*LL|iLLiiOpO", kwlist, &host, &port, &tok,
                                     &chunk, &mem, &max_threads, &wt, &wT, &rcvbuf, &nw, &tls_obj,
                                     &tls_per_record, &shared_obj))
        return -1;
    if (amdt_py_check_engine_args(&tok, chunk, mem, tls_obj, tls_key, &key) != 0 ||
        amdt_py_check_nonneg(wt, "write_thread_bps") != 0 ||
        amdt_py_check_nonneg(wT, "write_total_bps") != 0 ||
        amdt_py_check_range(port, 0, 65535, "port") != 0)
        goto error;
    if (shared_obj != Py_None && (shared = amdt_py_shared_clock(shared_obj)) == NULL)
        goto error;
    if (nw < 0 || nw > max_threads) {
        PyErr_Format(PyExc_ValueError, "write_threads must be in 0..max_threads (%d)", max_threads);
        goto error;
    }
    amdt_receiver_cfg cfg = {
        .host = host,
        .port = port,
        .token = tok.buf,
        .chunk_size = (uint64_t)chunk,
        .memory_bytes = (uint64_t)mem,
        .max_threads = max_threads,
        .write_thread_bps = (uint64_t)wt,
        .write_total_bps = (uint64_t)wT,
        .write_shared = shared,
        .rcvbuf = rcvbuf,
        .write_threads = nw,
        .tls_key = key,
        .tls_per_record = tls_per_record,
    };
    if (shared != NULL)
        self->peer = Py_NewRef(shared_obj); /* before the threads start: they use its clock */
    int rc = amdt_py_start(self, &cfg);
    if (rc != 0)
        Py_CLEAR(self->peer);
    PyBuffer_Release(&tok);
    return rc;

error:
    PyBuffer_Release(&tok);
    return -1;
}

static PyObject *Receiver_add_file(amdt_py_engine *self, PyObject *args)
{
    long long id, size;
    int fd, jfd;
    PyObject *done = Py_None;
    Py_buffer buf = {0};
    char err[AMDT_ERRLEN] = "";
    amdt_receiver *r = amdt_py_usable(self);

    if (r == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "LiiL|O", &id, &fd, &jfd, &size, &done))
        return NULL;
    if (amdt_py_check_u32(id, "file_id") != 0 || amdt_py_check_nonneg(size, "size") != 0)
        return NULL;
    if (done != Py_None && PyObject_GetBuffer(done, &buf, PyBUF_SIMPLE) != 0)
        return NULL;
    int rc = amdt_receiver_add_file(r, (uint32_t)id, fd, jfd < 0 ? -1 : jfd, (uint64_t)size,
                                    done != Py_None ? buf.buf : NULL,
                                    done != Py_None ? (size_t)buf.len : 0, err, sizeof(err));
    if (done != Py_None)
        PyBuffer_Release(&buf);
    if (rc != 0)
        return amdt_py_engine_error(rc, PyExc_ValueError, err);
    Py_RETURN_NONE;
}

static PyObject *Receiver_remove_file(amdt_py_engine *self, PyObject *args)
{
    uint32_t id;
    int rc;
    amdt_receiver *r = amdt_py_usable(self);
    if (r == NULL || amdt_py_parse_file_id(args, &id) != 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS /* waits for the file's in-flight writes */
    rc = amdt_receiver_remove_file(r, id);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return amdt_py_unknown_file(id);
    Py_RETURN_NONE;
}

static PyObject *Receiver_missing(amdt_py_engine *self, PyObject *args)
{
    uint32_t id;
    uint64_t *idx = NULL, size = 0;
    size_t n = 0;
    PyObject *list = NULL;
    amdt_receiver *r = amdt_py_usable(self);
    if (r == NULL || amdt_py_parse_file_id(args, &id) != 0)
        return NULL;
    int rc = amdt_receiver_missing(r, id, &idx, &n, &size);
    if (rc == -1)
        return amdt_py_unknown_file(id);
    if (rc == -3)
        return PyErr_NoMemory();
    list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        goto error;
    uint64_t chunk = r->chunk_size;
    for (size_t i = 0; i < n; i++) {
        uint64_t off = idx[i] * chunk;
        uint64_t len = size - off < chunk ? size - off : chunk;
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)off, (unsigned long long)len);
        if (t == NULL)
            goto error;
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    free(idx);
    return list;

error:
    free(idx);
    Py_XDECREF(list);
    return NULL;
}

static PyObject *Receiver_set_threads(amdt_py_engine *self, PyObject *args)
{
    int nw, old = 0;
    amdt_receiver *r = amdt_py_usable(self);
    if (r == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "i", &nw))
        return NULL;
    if (nw < 0 || nw > r->write.max_threads) {
        PyErr_Format(PyExc_ValueError, "write threads must be in 0..%d, got %d",
                     r->write.max_threads, nw);
        return NULL;
    }
    /* Keeps the GIL: starting/joining exited threads is quick and needs no Python. */
    int rc = amdt_receiver_set_threads(r, nw, &old);
    if (rc != 0)
        return amdt_py_thread_error(rc);
    return PyLong_FromLong(old);
}

static PyObject *Receiver_set_memory(amdt_py_engine *self, PyObject *args)
{
    unsigned long long bytes;
    amdt_receiver *r = amdt_py_usable(self);
    if (r == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "K", &bytes))
        return NULL;
    if (bytes < r->pool.chunk_size) {
        PyErr_Format(PyExc_ValueError, "memory must hold at least one chunk (%zu bytes), got %llu",
                     r->pool.chunk_size, bytes);
        return NULL;
    }
    /* Keeps the GIL: the pool's lock is held only to free slots already free. */
    return PyLong_FromUnsignedLongLong(amdt_receiver_set_memory(r, bytes));
}

static PyObject *Receiver_set_write_behind(amdt_py_engine *self, PyObject *args)
{
    int on;
    amdt_receiver *r = amdt_py_usable(self);
    if (r == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
    amdt_receiver_set_write_behind(r, on);
    Py_RETURN_NONE;
}

static PyObject *Receiver_stats(amdt_py_engine *self, PyObject *Py_UNUSED(ignored))
{
    amdt_receiver_stats st;
    amdt_receiver *r = amdt_py_readable(self);
    if (r == NULL)
        return NULL;
    amdt_receiver_get_stats(r, &st);
    return Py_BuildValue(
        "(KNNNKKKKKKKK)", (unsigned long long)st.time_ns, amdt_py_stage_tuple(&st.recv),
        amdt_py_stage_tuple(&st.write), amdt_py_buffer_tuple(&st.buffer),
        (unsigned long long)st.chunks_written, (unsigned long long)st.chunks_bad,
        (unsigned long long)st.chunks_duplicate, (unsigned long long)st.chunks_orphaned,
        (unsigned long long)st.connections, (unsigned long long)st.connections_total,
        (unsigned long long)st.connections_rejected, (unsigned long long)st.protocol_errors);
}

static PyObject *Receiver_get_port(amdt_py_engine *self, void *Py_UNUSED(closure))
{
    const amdt_receiver *r = amdt_py_readable(self);
    return r != NULL ? PyLong_FromLong(r->port) : NULL;
}

/* ---- the type -------------------------------------------------------------------------- */

static PyMethodDef Receiver_methods[] = {
    {"add_file", (PyCFunction)Receiver_add_file, METH_VARARGS,
     "add_file(file_id, fd, journal_fd, size, done_chunks=None)"},
    {"remove_file", (PyCFunction)Receiver_remove_file, METH_VARARGS, "remove_file(file_id)"},
    {"missing", (PyCFunction)Receiver_missing, METH_VARARGS,
     "missing(file_id) -> list of (offset, length)"},
    {"set_threads", (PyCFunction)Receiver_set_threads, METH_VARARGS,
     "set_threads(write) -> old_write"},
    {"set_throttle", amdt_py_set_throttle, METH_VARARGS,
     "set_throttle('write' or 'recv', thread_bps, total_bps)"},
    {"set_memory", (PyCFunction)Receiver_set_memory, METH_VARARGS,
     "set_memory(bytes) -> old_bytes: the staging buffer's cap, changed while running"},
    {"set_write_behind", (PyCFunction)Receiver_set_write_behind, METH_VARARGS,
     "set_write_behind(on): start each chunk's write-back once written"},
    {"stats", (PyCFunction)Receiver_stats, METH_NOARGS, "stats() -> tuple"},
    AMDT_PY_ENGINE_METHODS,
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Receiver_getset[] = {
    {"port", (getter)Receiver_get_port, NULL, "the bound TCP port", NULL},
    AMDT_PY_ENGINE_GETSET,
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Receiver_slots[] = {
    {Py_tp_doc, "Receiver(host, port, token, chunk_size, memory_bytes, max_threads=64, "
                "write_thread_bps=0, write_total_bps=0, rcvbuf=0, write_threads=1, tls_key=None, "
                "tls_per_record=False, write_shared=None)"},
    {Py_tp_new, Receiver_new},
    {Py_tp_init, Receiver_init},
    {Py_tp_dealloc, amdt_py_dealloc},
    {Py_tp_methods, Receiver_methods},
    {Py_tp_getset, Receiver_getset},
    {0, NULL},
};

PyType_Spec amdt_py_receiver_spec = {
    .name = "automdt.transfer_engine._engine.Receiver",
    .basicsize = sizeof(amdt_py_engine),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Receiver_slots,
};
