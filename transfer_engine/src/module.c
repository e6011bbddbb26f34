/*
 * automdt.transfer_engine._engine: the only file that includes Python.h.
 *
 * It parses arguments, calls the engine and converts its results (stats, events) to tuples;
 * transfer_engine/engine.py wraps those in NamedTuples and validates arguments first.
 *
 * GIL policy: worker threads never touch Python objects. The GIL is released around calls
 * that block: construction (name resolution, bind, thread start), close() and dealloc
 * (joining threads), and remove_file() (waits for in-flight writes). The other calls keep
 * it: they only take engine mutexes that workers hold for a few instructions and never
 * across a system call, and workers never wait for the GIL, so no deadlock is possible.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"
#include "hash.h"
#include "receiver.h"
#include "sender.h"
#include "wire.h"

#define ERRLEN 256

typedef struct {
    PyObject *sender_type;
    PyObject *receiver_type;
} amdt_modstate;

/* ---- helpers ----------------------------------------------------------------------- */

static PyObject *amdt_stage_tuple(const amdt_stage_stats *st)
{
    return Py_BuildValue("(KKKKii)", (unsigned long long)st->bytes, (unsigned long long)st->busy_ns,
                         (unsigned long long)st->wait_ns, (unsigned long long)st->idle_ns,
                         st->target, st->live);
}

static PyObject *amdt_buffer_tuple(const amdt_pool_stats *b)
{
    return Py_BuildValue("(KKKKKK)", (unsigned long long)b->fill_bytes,
                         (unsigned long long)b->capacity_bytes, (unsigned long long)b->slots_used,
                         (unsigned long long)b->slots_total, (unsigned long long)b->slots_allocated,
                         (unsigned long long)b->ready);
}

static PyObject *amdt_event_tuple(const amdt_event *ev)
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

static PyObject *amdt_events_list(amdt_events *q)
{
    size_t n = 0;
    PyObject *list = NULL;
    amdt_event *evs = amdt_events_drain(q, &n);
    if (evs == NULL && n == (size_t)-1)
        return PyErr_NoMemory();
    list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        goto error;
    for (size_t i = 0; i < n; i++) {
        PyObject *t = amdt_event_tuple(&evs[i]);
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

static int amdt_check_u32(long long v, const char *name)
{
    if (v < 0 || v > 0xFFFFFFFFLL) {
        PyErr_Format(PyExc_ValueError, "%s must be in 0..2**32-1, got %lld", name, v);
        return -1;
    }
    return 0;
}

static int amdt_check_nonneg(long long v, const char *name)
{
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0, got %lld", name, v);
        return -1;
    }
    return 0;
}

static int amdt_parse_token(Py_buffer *tok)
{
    if (tok->len != AMDT_TOKEN_LEN) {
        PyErr_Format(PyExc_ValueError, "token must be %d bytes, got %zd", AMDT_TOKEN_LEN, tok->len);
        return -1;
    }
    return 0;
}

/* tls_key: None (plain connections) or AMDT_TLS_KEY_LEN bytes copied into key.
 * Returns key, NULL for None, or NULL with an exception set (check PyErr_Occurred). */
static const uint8_t *amdt_parse_tls_key(PyObject *o, uint8_t *key)
{
    if (o == NULL || o == Py_None)
        return NULL;
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != AMDT_TLS_KEY_LEN) {
        PyErr_Format(PyExc_ValueError, "tls_key must be None or %d bytes", AMDT_TLS_KEY_LEN);
        return NULL;
    }
    memcpy(key, PyBytes_AS_STRING(o), AMDT_TLS_KEY_LEN);
    return key;
}

/* ---- Sender ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    amdt_sender *s;
    int closing;
} SenderObject;

static int Sender_ok(SenderObject *self)
{
    if (self->s == NULL || self->closing) {
        PyErr_SetString(PyExc_RuntimeError, "the sender is closed");
        return 0;
    }
    return 1;
}

static int Sender_init(SenderObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"host",
                             "port",
                             "token",
                             "chunk_size",
                             "memory_bytes",
                             "max_threads",
                             "read_thread_bps",
                             "read_total_bps",
                             "net_thread_bps",
                             "net_total_bps",
                             "sndbuf",
                             "fault_corrupt",
                             "read_threads",
                             "net_threads",
                             "tls_key",
                             "zerocopy",
                             NULL};
    const char *host;
    int port, max_threads = 64, sndbuf = 0, fault = 0, nr = 1, nn = 1, zerocopy = 1;
    Py_buffer tok = {0};
    long long chunk, mem, rt = 0, rT = 0, nt = 0, nT = 0;
    char err[ERRLEN] = "";
    amdt_sender *s;
    PyObject *tls_obj = Py_None;
    uint8_t tls_key[AMDT_TLS_KEY_LEN];

    if (self->s != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Sender.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "siy*LL|iLLLLiiiiOp", kwlist, &host, &port, &tok,
                                     &chunk, &mem, &max_threads, &rt, &rT, &nt, &nT, &sndbuf,
                                     &fault, &nr, &nn, &tls_obj, &zerocopy))
        return -1;
    const uint8_t *key = amdt_parse_tls_key(tls_obj, tls_key);
    if (key == NULL && PyErr_Occurred())
        goto error;
    if (amdt_parse_token(&tok) != 0 || amdt_check_nonneg(chunk, "chunk_size") != 0 ||
        amdt_check_nonneg(mem, "memory_bytes") != 0 || amdt_check_nonneg(rt, "read_thread_bps") ||
        amdt_check_nonneg(rT, "read_total_bps") || amdt_check_nonneg(nt, "net_thread_bps") ||
        amdt_check_nonneg(nT, "net_total_bps"))
        goto error;
    if (port < 1 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port must be in 1..65535, got %d", port);
        goto error;
    }
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
    };
    /* Name resolution and thread start can block. */
    Py_BEGIN_ALLOW_THREADS
    s = amdt_sender_new(&cfg, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (s == NULL) {
        PyErr_SetString(PyExc_ValueError, err);
        goto error;
    }
    self->s = s;
    PyBuffer_Release(&tok);
    return 0;

error:
    PyBuffer_Release(&tok);
    return -1;
}

static void Sender_dealloc(SenderObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->s != NULL) {
        amdt_sender *s = self->s;
        self->s = NULL;
        Py_BEGIN_ALLOW_THREADS /* joins threads */
        amdt_sender_free(s);
        Py_END_ALLOW_THREADS
    }
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *Sender_add_file(SenderObject *self, PyObject *args)
{
    long long id, size, mtime;
    PyObject *path = NULL, *ranges = Py_None, *seq = NULL;
    amdt_range *rv = NULL;
    Py_ssize_t n = 0;
    char err[ERRLEN] = "";

    if (!Sender_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "LO&LL|O", &id, PyUnicode_FSConverter, &path, &size, &mtime,
                          &ranges))
        return NULL;
    if (amdt_check_u32(id, "file_id") != 0 || amdt_check_nonneg(size, "size") != 0)
        goto error;
    if (ranges != Py_None) {
        seq = PySequence_Fast(ranges, "ranges must be a sequence of (offset, length) pairs");
        if (seq == NULL)
            goto error;
        n = PySequence_Fast_GET_SIZE(seq);
        if (n == 0) {
            PyErr_SetString(PyExc_ValueError, "ranges is empty (pass None for the whole file)");
            goto error;
        }
        rv = PyMem_Malloc((size_t)n * sizeof(*rv));
        if (rv == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            long long off, len;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i),
                                  "LL;ranges items are (offset, length)", &off, &len))
                goto error;
            if (amdt_check_nonneg(off, "range offset") != 0 ||
                amdt_check_nonneg(len, "range length") != 0)
                goto error;
            rv[i].offset = (uint64_t)off;
            rv[i].length = (uint64_t)len;
        }
    }
    int rc = amdt_sender_add_file(self->s, (uint32_t)id, PyBytes_AS_STRING(path), (uint64_t)size,
                                  (int64_t)mtime, rv, (size_t)n, err, sizeof(err));
    if (rc == -3) {
        PyErr_NoMemory();
        goto error;
    }
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, err);
        goto error;
    }
    PyMem_Free(rv);
    Py_XDECREF(seq);
    Py_DECREF(path);
    Py_RETURN_NONE;

error:
    PyMem_Free(rv);
    Py_XDECREF(seq);
    Py_XDECREF(path);
    return NULL;
}

static PyObject *Sender_requeue(SenderObject *self, PyObject *args)
{
    long long id, off, len;
    char err[ERRLEN] = "";
    if (!Sender_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "LLL", &id, &off, &len))
        return NULL;
    if (amdt_check_u32(id, "file_id") != 0 || amdt_check_nonneg(off, "offset") != 0 ||
        amdt_check_nonneg(len, "length") != 0)
        return NULL;
    int rc =
        amdt_sender_requeue(self->s, (uint32_t)id, (uint64_t)off, (uint64_t)len, err, sizeof(err));
    if (rc == -1) {
        PyErr_SetString(PyExc_KeyError, err);
        return NULL;
    }
    if (rc == -2) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    if (rc == -3)
        return PyErr_NoMemory();
    return PyBool_FromLong(rc == 1);
}

static PyObject *Sender_cancel_file(SenderObject *self, PyObject *args)
{
    long long id;
    if (!Sender_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "L", &id))
        return NULL;
    if (amdt_check_u32(id, "file_id") != 0)
        return NULL;
    if (amdt_sender_cancel_file(self->s, (uint32_t)id) != 0) {
        PyErr_Format(PyExc_KeyError, "unknown file id %lld", id);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Sender_set_threads(SenderObject *self, PyObject *args)
{
    int nr, nn, old_r = 0, old_n = 0;
    if (!Sender_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "ii", &nr, &nn))
        return NULL;
    if (nr < 0 || nn < 0 || nr > self->s->read.max_threads || nn > self->s->net.max_threads) {
        PyErr_Format(PyExc_ValueError, "thread counts must be in 0..%d, got (%d, %d)",
                     self->s->read.max_threads, nr, nn);
        return NULL;
    }
    /* Keeps the GIL: starting/joining exited threads is quick and needs no Python. */
    int rc = amdt_sender_set_threads(self->s, nr, nn, &old_r, &old_n);
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(ii)", old_r, old_n);
}

static PyObject *Sender_set_throttle(SenderObject *self, PyObject *args)
{
    const char *stage;
    long long t, T;
    if (!Sender_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "sLL", &stage, &t, &T))
        return NULL;
    if (amdt_check_nonneg(t, "thread_bps") != 0 || amdt_check_nonneg(T, "total_bps") != 0)
        return NULL;
    if (strcmp(stage, "read") == 0)
        amdt_stage_set_throttle(&self->s->read, (uint64_t)t, (uint64_t)T);
    else if (strcmp(stage, "net") == 0)
        amdt_stage_set_throttle(&self->s->net, (uint64_t)t, (uint64_t)T);
    else {
        PyErr_Format(PyExc_ValueError, "stage must be 'read' or 'net', got %R",
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Sender_set_fault_corrupt(SenderObject *self, PyObject *args)
{
    int n;
    if (!Sender_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "i", &n))
        return NULL;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "n must be >= 0, got %d", n);
        return NULL;
    }
    amdt_sender_set_fault_corrupt(self->s, n);
    Py_RETURN_NONE;
}

static PyObject *Sender_stats(SenderObject *self, PyObject *Py_UNUSED(ignored))
{
    amdt_sender_stats st;
    if (self->s == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the sender is not initialised");
        return NULL;
    }
    amdt_sender_get_stats(self->s, &st);
    return Py_BuildValue("(KNNNKKKKKKK)", (unsigned long long)st.time_ns,
                         amdt_stage_tuple(&st.read), amdt_stage_tuple(&st.net),
                         amdt_buffer_tuple(&st.buffer), (unsigned long long)st.chunks_sent,
                         (unsigned long long)st.chunks_requeued,
                         (unsigned long long)st.frames_corrupted,
                         (unsigned long long)st.chunks_pending, (unsigned long long)st.files_failed,
                         (unsigned long long)st.tcp_segs_out, (unsigned long long)st.tcp_retrans);
}

static PyObject *Sender_events(SenderObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->s == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the sender is not initialised");
        return NULL;
    }
    return amdt_events_list(&self->s->events);
}

static PyObject *Sender_close(SenderObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->s == NULL || self->closing)
        Py_RETURN_NONE;
    self->closing = 1;
    amdt_sender *s = self->s;
    Py_BEGIN_ALLOW_THREADS /* joins every thread */
    amdt_sender_close(s);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Sender_get_closed(SenderObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->s == NULL || self->closing);
}

static PyObject *Sender_get_zerocopy(SenderObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->s != NULL && self->s->zerocopy);
}

static PyMethodDef Sender_methods[] = {
    {"add_file", (PyCFunction)Sender_add_file, METH_VARARGS,
     "add_file(file_id, path, size, mtime_ns, ranges=None)"},
    {"requeue", (PyCFunction)Sender_requeue, METH_VARARGS,
     "requeue(file_id, offset, length) -> bool"},
    {"cancel_file", (PyCFunction)Sender_cancel_file, METH_VARARGS,
     "cancel_file(file_id): drop the file's chunks not sent yet"},
    {"set_threads", (PyCFunction)Sender_set_threads, METH_VARARGS,
     "set_threads(read, net) -> (old_read, old_net)"},
    {"set_throttle", (PyCFunction)Sender_set_throttle, METH_VARARGS,
     "set_throttle(stage, thread_bps, total_bps)"},
    {"set_fault_corrupt", (PyCFunction)Sender_set_fault_corrupt, METH_VARARGS,
     "set_fault_corrupt(n)"},
    {"stats", (PyCFunction)Sender_stats, METH_NOARGS, "stats() -> tuple"},
    {"events", (PyCFunction)Sender_events, METH_NOARGS, "events() -> list of tuples (drained)"},
    {"close", (PyCFunction)Sender_close, METH_NOARGS, "close(): stop and join every thread"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Sender_getset[] = {
    {"closed", (getter)Sender_get_closed, NULL, "True after close()", NULL},
    {"zerocopy", (getter)Sender_get_zerocopy, NULL,
     "True when payloads go out with sendfile() (plain connections, not AUTOMDT_SENDFILE=0)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Sender_slots[] = {
    {Py_tp_doc,
     "Sender(host, port, token, chunk_size, memory_bytes, max_threads=64, "
     "read_thread_bps=0, read_total_bps=0, net_thread_bps=0, net_total_bps=0, "
     "sndbuf=0, fault_corrupt=0, read_threads=1, net_threads=1, tls_key=None, zerocopy=True)"},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Sender_init},
    {Py_tp_dealloc, Sender_dealloc},
    {Py_tp_methods, Sender_methods},
    {Py_tp_getset, Sender_getset},
    {0, NULL},
};

static PyType_Spec Sender_spec = {
    .name = "automdt.transfer_engine._engine.Sender",
    .basicsize = sizeof(SenderObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Sender_slots,
};

/* ---- Receiver ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    amdt_receiver *r;
    int closing;
} ReceiverObject;

static int Receiver_ok(ReceiverObject *self)
{
    if (self->r == NULL || self->closing) {
        PyErr_SetString(PyExc_RuntimeError, "the receiver is closed");
        return 0;
    }
    return 1;
}

static int Receiver_init(ReceiverObject *self, PyObject *args, PyObject *kwds)
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
                             NULL};
    const char *host;
    int port, max_threads = 64, rcvbuf = 0, nw = 1;
    Py_buffer tok = {0};
    long long chunk, mem, wt = 0, wT = 0;
    char err[ERRLEN] = "";
    amdt_receiver *r;
    PyObject *tls_obj = Py_None;
    uint8_t tls_key[AMDT_TLS_KEY_LEN];

    if (self->r != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Receiver.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "siy*LL|iLLiiO", kwlist, &host, &port, &tok,
                                     &chunk, &mem, &max_threads, &wt, &wT, &rcvbuf, &nw, &tls_obj))
        return -1;
    const uint8_t *key = amdt_parse_tls_key(tls_obj, tls_key);
    if (key == NULL && PyErr_Occurred())
        goto error;
    if (amdt_parse_token(&tok) != 0 || amdt_check_nonneg(chunk, "chunk_size") != 0 ||
        amdt_check_nonneg(mem, "memory_bytes") != 0 ||
        amdt_check_nonneg(wt, "write_thread_bps") != 0 ||
        amdt_check_nonneg(wT, "write_total_bps") != 0)
        goto error;
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port must be in 0..65535, got %d", port);
        goto error;
    }
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
        .rcvbuf = rcvbuf,
        .write_threads = nw,
        .tls_key = key,
    };
    /* bind/listen and thread start can block. */
    Py_BEGIN_ALLOW_THREADS
    r = amdt_receiver_new(&cfg, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (r == NULL) {
        PyErr_SetString(PyExc_OSError, err);
        goto error;
    }
    self->r = r;
    PyBuffer_Release(&tok);
    return 0;

error:
    PyBuffer_Release(&tok);
    return -1;
}

static void Receiver_dealloc(ReceiverObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->r != NULL) {
        amdt_receiver *r = self->r;
        self->r = NULL;
        Py_BEGIN_ALLOW_THREADS /* joins threads */
        amdt_receiver_free(r);
        Py_END_ALLOW_THREADS
    }
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *Receiver_add_file(ReceiverObject *self, PyObject *args)
{
    long long id, size;
    int fd, jfd;
    PyObject *done = Py_None;
    Py_buffer buf = {0};
    char err[ERRLEN] = "";

    if (!Receiver_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "LiiL|O", &id, &fd, &jfd, &size, &done))
        return NULL;
    if (amdt_check_u32(id, "file_id") != 0 || amdt_check_nonneg(size, "size") != 0)
        return NULL;
    if (done != Py_None && PyObject_GetBuffer(done, &buf, PyBUF_SIMPLE) != 0)
        return NULL;
    int rc = amdt_receiver_add_file(self->r, (uint32_t)id, fd, jfd < 0 ? -1 : jfd, (uint64_t)size,
                                    done != Py_None ? buf.buf : NULL,
                                    done != Py_None ? (size_t)buf.len : 0, err, sizeof(err));
    if (done != Py_None)
        PyBuffer_Release(&buf);
    if (rc == -3)
        return PyErr_NoMemory();
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Receiver_remove_file(ReceiverObject *self, PyObject *args)
{
    long long id;
    int rc;
    if (!Receiver_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "L", &id))
        return NULL;
    if (amdt_check_u32(id, "file_id") != 0)
        return NULL;
    amdt_receiver *r = self->r;
    Py_BEGIN_ALLOW_THREADS /* waits for the file's in-flight writes */
    rc = amdt_receiver_remove_file(r, (uint32_t)id);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(PyExc_KeyError, "unknown file id %lld", id);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Receiver_missing(ReceiverObject *self, PyObject *args)
{
    long long id;
    uint64_t *idx = NULL, size = 0;
    size_t n = 0;
    PyObject *list = NULL;
    if (!Receiver_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "L", &id))
        return NULL;
    if (amdt_check_u32(id, "file_id") != 0)
        return NULL;
    int rc = amdt_receiver_missing(self->r, (uint32_t)id, &idx, &n, &size);
    if (rc == -1) {
        PyErr_Format(PyExc_KeyError, "unknown file id %lld", id);
        return NULL;
    }
    if (rc == -3)
        return PyErr_NoMemory();
    list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        goto error;
    uint64_t chunk = self->r->chunk_size;
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

static PyObject *Receiver_set_threads(ReceiverObject *self, PyObject *args)
{
    int nw, old = 0;
    if (!Receiver_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "i", &nw))
        return NULL;
    if (nw < 0 || nw > self->r->write.max_threads) {
        PyErr_Format(PyExc_ValueError, "write threads must be in 0..%d, got %d",
                     self->r->write.max_threads, nw);
        return NULL;
    }
    /* Keeps the GIL: starting/joining exited threads is quick and needs no Python. */
    int rc = amdt_receiver_set_threads(self->r, nw, &old);
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(old);
}

static PyObject *Receiver_set_throttle(ReceiverObject *self, PyObject *args)
{
    const char *stage;
    long long t, T;
    if (!Receiver_ok(self))
        return NULL;
    if (!PyArg_ParseTuple(args, "sLL", &stage, &t, &T))
        return NULL;
    if (amdt_check_nonneg(t, "thread_bps") != 0 || amdt_check_nonneg(T, "total_bps") != 0)
        return NULL;
    if (strcmp(stage, "write") != 0) {
        PyErr_Format(PyExc_ValueError, "stage must be 'write', got %R", PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    amdt_stage_set_throttle(&self->r->write, (uint64_t)t, (uint64_t)T);
    Py_RETURN_NONE;
}

static PyObject *Receiver_stats(ReceiverObject *self, PyObject *Py_UNUSED(ignored))
{
    amdt_receiver_stats st;
    if (self->r == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the receiver is not initialised");
        return NULL;
    }
    amdt_receiver_get_stats(self->r, &st);
    return Py_BuildValue(
        "(KNNNKKKKKKKK)", (unsigned long long)st.time_ns, amdt_stage_tuple(&st.recv),
        amdt_stage_tuple(&st.write), amdt_buffer_tuple(&st.buffer),
        (unsigned long long)st.chunks_written, (unsigned long long)st.chunks_bad,
        (unsigned long long)st.chunks_duplicate, (unsigned long long)st.chunks_orphaned,
        (unsigned long long)st.connections, (unsigned long long)st.connections_total,
        (unsigned long long)st.connections_rejected, (unsigned long long)st.protocol_errors);
}

static PyObject *Receiver_events(ReceiverObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->r == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the receiver is not initialised");
        return NULL;
    }
    return amdt_events_list(&self->r->events);
}

static PyObject *Receiver_close(ReceiverObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->r == NULL || self->closing)
        Py_RETURN_NONE;
    self->closing = 1;
    amdt_receiver *r = self->r;
    Py_BEGIN_ALLOW_THREADS /* joins every thread */
    amdt_receiver_close(r);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Receiver_get_port(ReceiverObject *self, void *Py_UNUSED(closure))
{
    if (self->r == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the receiver is not initialised");
        return NULL;
    }
    return PyLong_FromLong(self->r->port);
}

static PyObject *Receiver_get_closed(ReceiverObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->r == NULL || self->closing);
}

static PyMethodDef Receiver_methods[] = {
    {"add_file", (PyCFunction)Receiver_add_file, METH_VARARGS,
     "add_file(file_id, fd, journal_fd, size, done_chunks=None)"},
    {"remove_file", (PyCFunction)Receiver_remove_file, METH_VARARGS, "remove_file(file_id)"},
    {"missing", (PyCFunction)Receiver_missing, METH_VARARGS,
     "missing(file_id) -> list of (offset, length)"},
    {"set_threads", (PyCFunction)Receiver_set_threads, METH_VARARGS,
     "set_threads(write) -> old_write"},
    {"set_throttle", (PyCFunction)Receiver_set_throttle, METH_VARARGS,
     "set_throttle('write', thread_bps, total_bps)"},
    {"stats", (PyCFunction)Receiver_stats, METH_NOARGS, "stats() -> tuple"},
    {"events", (PyCFunction)Receiver_events, METH_NOARGS, "events() -> list of tuples (drained)"},
    {"close", (PyCFunction)Receiver_close, METH_NOARGS, "close(): stop and join every thread"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Receiver_getset[] = {
    {"port", (getter)Receiver_get_port, NULL, "the bound TCP port", NULL},
    {"closed", (getter)Receiver_get_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Receiver_slots[] = {
    {Py_tp_doc, "Receiver(host, port, token, chunk_size, memory_bytes, max_threads=64, "
                "write_thread_bps=0, write_total_bps=0, rcvbuf=0, write_threads=1, tls_key=None)"},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Receiver_init},
    {Py_tp_dealloc, Receiver_dealloc},
    {Py_tp_methods, Receiver_methods},
    {Py_tp_getset, Receiver_getset},
    {0, NULL},
};

static PyType_Spec Receiver_spec = {
    .name = "automdt.transfer_engine._engine.Receiver",
    .basicsize = sizeof(ReceiverObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Receiver_slots,
};

/* ---- module ------------------------------------------------------------------------ */

static PyObject *amdt_py_hash64(PyObject *mod, PyObject *args)
{
    Py_buffer buf;
    const char *impl = "";
    amdt_hash_fn fn = amdt_hash64;
    if (!PyArg_ParseTuple(args, "y*|s", &buf, &impl))
        return NULL;
    if (strcmp(impl, "libxxhash") == 0) {
        fn = amdt_hash64_lib;
    } else if (strcmp(impl, "xxh3-avx2") == 0) {
        fn = amdt_hash64_avx2;
        if (fn == NULL || strcmp(amdt_hash_impl, "xxh3-avx2") != 0) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_ValueError, "xxh3-avx2 is not available on this CPU/build");
            return NULL;
        }
    } else if (impl[0] != '\0') {
        PyBuffer_Release(&buf);
        PyErr_Format(PyExc_ValueError, "impl must be '', 'libxxhash' or 'xxh3-avx2', got '%s'",
                     impl);
        return NULL;
    }
    /* Keeps the GIL: a test/diagnostic helper, and hashing runs at tens of GB/s. */
    uint64_t h = fn(buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *amdt_py_trim_cache(PyObject *mod, PyObject *args)
{
    double max_age_s = 0.0;
    if (!PyArg_ParseTuple(args, "|d", &max_age_s))
        return NULL;
    if (!(max_age_s >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "max_age_s must be >= 0");
        return NULL;
    }
    amdt_pool_trim_cache((uint64_t)(max_age_s * 1e9));
    Py_RETURN_NONE;
}

static PyObject *amdt_py_cached_bytes(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSize_t(amdt_pool_cached_bytes());
}

static PyMethodDef amdt_module_methods[] = {
    {"cached_bytes", amdt_py_cached_bytes, METH_NOARGS,
     "cached_bytes() -> slot memory kept for the next engine now (see trim_cache)"},
    {"trim_cache", amdt_py_trim_cache, METH_VARARGS,
     "trim_cache(max_age_s=0.0): free the slot memory kept between engines (closed engines "
     "leave it for the next one) if it was kept that long"},
    {"hash64", amdt_py_hash64, METH_VARARGS,
     "hash64(data, impl='') -> XXH3_64bits(data) with the engine's implementation "
     "(or 'libxxhash' / 'xxh3-avx2')"},
    {NULL, NULL, 0, NULL},
};

static int amdt_exec(PyObject *m)
{
    amdt_modstate *st = PyModule_GetState(m);
    amdt_debug_init();
    amdt_hash_init();

    st->sender_type = PyType_FromModuleAndSpec(m, &Sender_spec, NULL);
    if (st->sender_type == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "Sender", st->sender_type) < 0)
        return -1;
    st->receiver_type = PyType_FromModuleAndSpec(m, &Receiver_spec, NULL);
    if (st->receiver_type == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "Receiver", st->receiver_type) < 0)
        return -1;

    /* Tunables and format constants, readable from Python and tests. */
    if (PyModule_AddIntConstant(m, "TOKEN_LEN", AMDT_TOKEN_LEN) < 0 ||
        PyModule_AddIntConstant(m, "TLS_KEY_LEN", AMDT_TLS_KEY_LEN) < 0 ||
        PyModule_AddIntConstant(m, "HELLO_LEN", AMDT_HELLO_LEN) < 0 ||
        PyModule_AddIntConstant(m, "FRAME_HEADER_LEN", AMDT_FRAME_HDR_LEN) < 0 ||
        PyModule_AddIntConstant(m, "FRAME_MAGIC", AMDT_FRAME_MAGIC) < 0 ||
        PyModule_AddIntConstant(m, "JOURNAL_RECORD_LEN", AMDT_JOURNAL_REC_LEN) < 0 ||
        PyModule_AddIntConstant(m, "CHUNK_SIZE_MAX", 1 << 30) < 0 ||
        PyModule_AddIntConstant(m, "WAIT_MS", AMDT_WAIT_MS) < 0 ||
        PyModule_AddIntConstant(m, "EVENTS_MAX", AMDT_EVENTS_MAX) < 0 ||
        PyModule_AddIntConstant(m, "DEBUG", amdt_debug_enabled) < 0 ||
        PyModule_AddStringConstant(m, "HASH_IMPL", amdt_hash_impl) < 0)
        return -1;
    return 0;
}

static int amdt_traverse(PyObject *m, visitproc visit, void *arg)
{
    amdt_modstate *st = PyModule_GetState(m);
    Py_VISIT(st->sender_type);
    Py_VISIT(st->receiver_type);
    return 0;
}

static int amdt_clear(PyObject *m)
{
    amdt_modstate *st = PyModule_GetState(m);
    Py_CLEAR(st->sender_type);
    Py_CLEAR(st->receiver_type);
    return 0;
}

static void amdt_free(void *m)
{
    amdt_clear((PyObject *)m);
}

static PyModuleDef_Slot amdt_slots[] = {
    {Py_mod_exec, amdt_exec},
    /* Not declared free-threading safe (Py_mod_gil): the `closing` flags of the Python
     * objects rely on the GIL. */
    {0, NULL},
};

static struct PyModuleDef amdt_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_engine",
    .m_doc = "AutoMDT transfer engine: read/network/write thread pools, staging buffers, "
             "checksums, throttles and counters (private; use automdt.transfer_engine).",
    .m_size = sizeof(amdt_modstate),
    .m_methods = amdt_module_methods,
    .m_slots = amdt_slots,
    .m_traverse = amdt_traverse,
    .m_clear = amdt_clear,
    .m_free = amdt_free,
};

PyMODINIT_FUNC PyInit__engine(void)
{
    return PyModuleDef_Init(&amdt_module);
}
