/* The Python type Sender (automdt.transfer_engine._engine.Sender): see py_common.h. */
#include "py_common.h"
#include "sender.h"

/* ---- the engine calls the shared methods use ------------------------------------------ */

static void *sender_new(const void *cfg, char *err, size_t errlen)
{
    return amdt_sender_new(cfg, err, errlen);
}

static void sender_close(void *e)
{
    amdt_sender_close(e);
}

static void sender_free(void *e)
{
    amdt_sender_free(e);
}

static amdt_events *sender_events(void *e)
{
    return &((amdt_sender *)e)->events;
}

static amdt_stage *sender_stage(void *e, const char *name)
{
    amdt_sender *s = e;
    if (strcmp(name, "read") == 0)
        return &s->read;
    if (strcmp(name, "net") == 0)
        return &s->net;
    return NULL;
}

static const amdt_py_kind sender_kind = {
    .name = "sender",
    .stage_names = "'read' or 'net'",
    .new_error = &PyExc_ValueError,
    .new = sender_new,
    .close = sender_close,
    .free = sender_free,
    .events = sender_events,
    .stage = sender_stage,
};

/* ---- methods --------------------------------------------------------------------------- */

static PyObject *Sender_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    return amdt_py_new(type, &sender_kind);
}

static int Sender_init(amdt_py_engine *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"host",           "port",          "token",           "chunk_size",
                             "memory_bytes",   "max_threads",   "read_thread_bps", "read_total_bps",
                             "net_thread_bps", "net_total_bps", "sndbuf",          "fault_corrupt",
                             "read_threads",   "net_threads",   "tls_key",         "zerocopy",
                             "local",          "files_at_once", "tls_per_record",  NULL};
    const char *host;
    int port, max_threads = 64, sndbuf = 0, fault = 0, nr = 1, nn = 1, zerocopy = 1;
    int files_at_once = 0, tls_per_record = 0;
    Py_buffer tok = {0};
    long long chunk, mem, rt = 0, rT = 0, nt = 0, nT = 0;
    PyObject *tls_obj = Py_None, *local_obj = Py_None;
    amdt_receiver *local = NULL;
    uint8_t tls_key[AMDT_TLS_KEY_LEN];
    const uint8_t *key;

    if (amdt_py_init_once(self) != 0)
        return -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "siy*LL|iLLLLiiiiOpOip", kwlist, &host, &port,
                                     &tok, &chunk, &mem, &max_threads, &rt, &rT, &nt, &nT, &sndbuf,
                                     &fault, &nr, &nn, &tls_obj, &zerocopy, &local_obj,
                                     &files_at_once, &tls_per_record))
        return -1;
    if (amdt_py_check_engine_args(&tok, chunk, mem, tls_obj, tls_key, &key) != 0 ||
        amdt_py_check_nonneg(rt, "read_thread_bps") != 0 ||
        amdt_py_check_nonneg(rT, "read_total_bps") != 0 ||
        amdt_py_check_nonneg(nt, "net_thread_bps") != 0 ||
        amdt_py_check_nonneg(nT, "net_total_bps") != 0 ||
        amdt_py_check_range(port, 1, 65535, "port") != 0 ||
        amdt_py_check_range(files_at_once, 0, AMDT_FILES_AT_ONCE_MAX, "files_at_once") != 0)
        goto error;
    if (local_obj != Py_None && (local = amdt_py_receiver_engine(local_obj)) == NULL)
        goto error;
    if (nr < 0 || nn < 0 || nr > max_threads || nn > max_threads) {
        PyErr_Format(PyExc_ValueError, "thread counts must be in 0..max_threads (%d)", max_threads);
        goto error;
    }
    amdt_sender_cfg cfg = {
        .host = host,
        .port = port,
        .token = tok.buf,
        .chunk_size = (uint64_t)chunk,
        .memory_bytes = (uint64_t)mem,
        .max_threads = max_threads,
        .read_thread_bps = (uint64_t)rt,
        .read_total_bps = (uint64_t)rT,
        .net_thread_bps = (uint64_t)nt,
        .net_total_bps = (uint64_t)nT,
        .sndbuf = sndbuf,
        .fault_corrupt = fault < 0 ? 0 : fault,
        .read_threads = nr,
        .net_threads = nn,
        .tls_key = key,
        .zerocopy = zerocopy,
        .local = local,
        .files_at_once = files_at_once,
        .tls_per_record = tls_per_record,
    };
    if (local != NULL)
        self->peer = Py_NewRef(local_obj); /* before the threads start: they use its engine */
    int rc = amdt_py_start(self, &cfg);
    if (rc != 0)
        Py_CLEAR(self->peer);
    PyBuffer_Release(&tok);
    return rc;

error:
    PyBuffer_Release(&tok);
    return -1;
}

/* ranges: None (the whole file) or a non-empty sequence of (offset, length) pairs, copied into
 * a PyMem array (*out, *n). 0 ok; -1 with an exception set. */
static int Sender_parse_ranges(PyObject *ranges, amdt_range **out, Py_ssize_t *n)
{
    *out = NULL;
    *n = 0;
    if (ranges == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(ranges, "ranges must be a sequence of (offset, length) pairs");
    if (seq == NULL)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    amdt_range *rv = NULL;
    if (len == 0) {
        PyErr_SetString(PyExc_ValueError, "ranges is empty (pass None for the whole file)");
        goto error;
    }
    rv = PyMem_Malloc((size_t)len * sizeof(*rv));
    if (rv == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        long long off, length;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i),
                              "LL;ranges items are (offset, length)", &off, &length))
            goto error;
        if (amdt_py_check_nonneg(off, "range offset") != 0 ||
            amdt_py_check_nonneg(length, "range length") != 0)
            goto error;
        rv[i].offset = (uint64_t)off;
        rv[i].length = (uint64_t)length;
    }
    Py_DECREF(seq);
    *out = rv;
    *n = len;
    return 0;

error:
    PyMem_Free(rv);
    Py_DECREF(seq);
    return -1;
}

static PyObject *Sender_add_file(amdt_py_engine *self, PyObject *args)
{
    long long id, size, mtime;
    PyObject *path = NULL, *ranges = Py_None, *result = NULL;
    amdt_range *rv = NULL;
    Py_ssize_t n = 0;
    char err[AMDT_ERRLEN] = "";
    amdt_sender *s = amdt_py_usable(self);

    if (s == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "LO&LL|O", &id, PyUnicode_FSConverter, &path, &size, &mtime,
                          &ranges))
        return NULL;
    if (amdt_py_check_u32(id, "file_id") != 0 || amdt_py_check_nonneg(size, "size") != 0 ||
        Sender_parse_ranges(ranges, &rv, &n) != 0)
        goto done;
    int rc = amdt_sender_add_file(s, (uint32_t)id, PyBytes_AS_STRING(path), (uint64_t)size,
                                  (int64_t)mtime, rv, (size_t)n, err, sizeof(err));
    if (rc != 0)
        amdt_py_engine_error(rc, PyExc_ValueError, err);
    else
        result = Py_NewRef(Py_None);

done:
    PyMem_Free(rv);
    Py_DECREF(path);
    return result;
}

static PyObject *Sender_requeue(amdt_py_engine *self, PyObject *args)
{
    long long id, off, len;
    char err[AMDT_ERRLEN] = "";
    amdt_sender *s = amdt_py_usable(self);
    if (s == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "LLL", &id, &off, &len))
        return NULL;
    if (amdt_py_check_u32(id, "file_id") != 0 || amdt_py_check_nonneg(off, "offset") != 0 ||
        amdt_py_check_nonneg(len, "length") != 0)
        return NULL;
    int rc = amdt_sender_requeue(s, (uint32_t)id, (uint64_t)off, (uint64_t)len, err, sizeof(err));
    if (rc < 0)
        return amdt_py_engine_error(rc, rc == -1 ? PyExc_KeyError : PyExc_ValueError, err);
    return PyBool_FromLong(rc == 1);
}

static PyObject *Sender_cancel_file(amdt_py_engine *self, PyObject *args)
{
    uint32_t id;
    amdt_sender *s = amdt_py_usable(self);
    if (s == NULL || amdt_py_parse_file_id(args, &id) != 0)
        return NULL;
    if (amdt_sender_cancel_file(s, id) != 0)
        return amdt_py_unknown_file(id);
    Py_RETURN_NONE;
}

static PyObject *Sender_set_threads(amdt_py_engine *self, PyObject *args)
{
    int nr, nn, old_r = 0, old_n = 0;
    amdt_sender *s = amdt_py_usable(self);
    if (s == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "ii", &nr, &nn))
        return NULL;
    if (nr < 0 || nn < 0 || nr > s->read.max_threads || nn > s->net.max_threads) {
        PyErr_Format(PyExc_ValueError, "thread counts must be in 0..%d, got (%d, %d)",
                     s->read.max_threads, nr, nn);
        return NULL;
    }
    /* Keeps the GIL: starting/joining exited threads is quick and needs no Python. */
    int rc = amdt_sender_set_threads(s, nr, nn, &old_r, &old_n);
    if (rc != 0)
        return amdt_py_thread_error(rc);
    return Py_BuildValue("(ii)", old_r, old_n);
}

static PyObject *Sender_set_fault_corrupt(amdt_py_engine *self, PyObject *args)
{
    int n;
    amdt_sender *s = amdt_py_usable(self);
    if (s == NULL)
        return NULL;
    if (!PyArg_ParseTuple(args, "i", &n))
        return NULL;
    if (amdt_py_check_nonneg(n, "n") != 0)
        return NULL;
    amdt_sender_set_fault_corrupt(s, n);
    Py_RETURN_NONE;
}

static PyObject *Sender_stats(amdt_py_engine *self, PyObject *Py_UNUSED(ignored))
{
    amdt_sender_stats st;
    amdt_sender *s = amdt_py_readable(self);
    if (s == NULL)
        return NULL;
    amdt_sender_get_stats(s, &st);
    return Py_BuildValue("(KNNNKKKKKKK)", (unsigned long long)st.time_ns,
                         amdt_py_stage_tuple(&st.read), amdt_py_stage_tuple(&st.net),
                         amdt_py_buffer_tuple(&st.buffer), (unsigned long long)st.chunks_sent,
                         (unsigned long long)st.chunks_requeued,
                         (unsigned long long)st.frames_corrupted,
                         (unsigned long long)st.chunks_pending, (unsigned long long)st.files_failed,
                         (unsigned long long)st.tcp_segs_out, (unsigned long long)st.tcp_retrans);
}

static PyObject *Sender_get_zerocopy(amdt_py_engine *self, void *Py_UNUSED(closure))
{
    const amdt_sender *s = self->engine;
    return PyBool_FromLong(s != NULL && s->zerocopy);
}

static PyObject *Sender_get_local(amdt_py_engine *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->peer != NULL);
}

/* ---- the type -------------------------------------------------------------------------- */

static PyMethodDef Sender_methods[] = {
    {"add_file", (PyCFunction)Sender_add_file, METH_VARARGS,
     "add_file(file_id, path, size, mtime_ns, ranges=None)"},
    {"requeue", (PyCFunction)Sender_requeue, METH_VARARGS,
     "requeue(file_id, offset, length) -> bool"},
    {"cancel_file", (PyCFunction)Sender_cancel_file, METH_VARARGS,
     "cancel_file(file_id): drop the file's chunks not sent yet"},
    {"set_threads", (PyCFunction)Sender_set_threads, METH_VARARGS,
     "set_threads(read, net) -> (old_read, old_net)"},
    {"set_throttle", amdt_py_set_throttle, METH_VARARGS,
     "set_throttle(stage, thread_bps, total_bps)"},
    {"set_fault_corrupt", (PyCFunction)Sender_set_fault_corrupt, METH_VARARGS,
     "set_fault_corrupt(n)"},
    {"stats", (PyCFunction)Sender_stats, METH_NOARGS, "stats() -> tuple"},
    AMDT_PY_ENGINE_METHODS,
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Sender_getset[] = {
    AMDT_PY_ENGINE_GETSET,
    {"zerocopy", (getter)Sender_get_zerocopy, NULL,
     "True when payloads go out with sendfile() (plain, zerocopy, switch sendfile on)", NULL},
    {"local", (getter)Sender_get_local, NULL,
     "True when chunks go to a Receiver of this process over the local link", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Sender_slots[] = {
    {Py_tp_doc, "Sender(host, port, token, chunk_size, memory_bytes, max_threads=64, "
                "read_thread_bps=0, read_total_bps=0, net_thread_bps=0, net_total_bps=0, "
                "sndbuf=0, fault_corrupt=0, read_threads=1, net_threads=1, tls_key=None, "
                "zerocopy=True, local=None)"},
    {Py_tp_new, Sender_new},
    {Py_tp_init, Sender_init},
    {Py_tp_dealloc, amdt_py_dealloc},
    {Py_tp_methods, Sender_methods},
    {Py_tp_getset, Sender_getset},
    {0, NULL},
};

PyType_Spec amdt_py_sender_spec = {
    .name = "automdt.transfer_engine._engine.Sender",
    .basicsize = sizeof(amdt_py_engine),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Sender_slots,
};
