/*
 * automdt.transfer_engine._engine: the module entry. It creates the types (py_sender.c,
 * py_receiver.c, py_shared.c; what they share, and the GIL policy, in py_common.h), exports the limits and
 * layouts of constants.h, and has the module-level functions.
 */
#include "hash.h"
#include "py_common.h"

typedef struct {
    PyObject *sender_type;
    PyObject *receiver_type;
    PyObject *shared_type;
} amdt_modstate;

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

static PyObject *amdt_py_set_debug(PyObject *mod, PyObject *args)
{
    int on;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
    int was = amdt_debug_enabled;
    amdt_debug_enabled = on;
    return PyBool_FromLong(was);
}

static PyMethodDef amdt_module_methods[] = {
    {"set_debug", amdt_py_set_debug, METH_VARARGS,
     "set_debug(on) -> the previous setting: the engine's debug lines on stderr (the CLI's "
     "--debug; at import: environment variable AUTOMDT_DEBUG set and not '0')"},
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

/* constants.h as module constants, for engine.py, automdt's CLI, receiver and journal, and
 * the tests. Names are the macros' without AMDT_, with HDR and REC spelled out. */
static const struct {
    const char *name;
    long value;
} amdt_int_constants[] = {
    {"CHUNK_SIZE_MIN", AMDT_CHUNK_SIZE_MIN},
    {"FILES_AT_ONCE_MAX", AMDT_FILES_AT_ONCE_MAX},
    {"CHUNK_SIZE_MAX", AMDT_CHUNK_SIZE_MAX},
    {"MAX_THREADS", AMDT_MAX_THREADS},
    {"SESSION_CHUNK_SIZE_MIN", AMDT_SESSION_CHUNK_SIZE_MIN},
    {"SESSION_CHUNK_SIZE_MAX", AMDT_SESSION_CHUNK_SIZE_MAX},
    {"WAIT_MS", AMDT_WAIT_MS},
    {"EVENTS_MAX", AMDT_EVENTS_MAX},
    {"TOKEN_LEN", AMDT_TOKEN_LEN},
    {"TLS_KEY_LEN", AMDT_TLS_KEY_LEN},
    {"HELLO_LEN", AMDT_HELLO_LEN},
    {"FRAME_MAGIC", AMDT_FRAME_MAGIC},
    {"FRAME_HEADER_LEN", AMDT_FRAME_HDR_LEN},
    {"JOURNAL_RECORD_LEN", AMDT_JOURNAL_REC_LEN},
    {"JOURNAL_RECORD_LENGTH", AMDT_JOURNAL_REC_LENGTH},
    {"JOURNAL_RECORD_OFFSET", AMDT_JOURNAL_REC_OFFSET},
    {"JOURNAL_RECORD_HASH", AMDT_JOURNAL_REC_HASH},
    {"JOURNAL_RECORD_CHECK", AMDT_JOURNAL_REC_CHECK},
};

static const struct {
    const char *name;
    const char *value;
    int is_bytes; /* bytes (magics) or str (struct formats) */
} amdt_text_constants[] = {
    {"HELLO_MAGIC", AMDT_HELLO_MAGIC, 1},
    {"FRAME_HEADER_FORMAT", AMDT_FRAME_HDR_FORMAT, 0},
    {"JOURNAL_MAGIC", AMDT_JOURNAL_MAGIC, 1},
    {"JOURNAL_RECORD_FORMAT", AMDT_JOURNAL_REC_FORMAT, 0},
};

static int amdt_add_constants(PyObject *m)
{
    for (size_t i = 0; i < sizeof(amdt_int_constants) / sizeof(amdt_int_constants[0]); i++)
        if (PyModule_AddIntConstant(m, amdt_int_constants[i].name, amdt_int_constants[i].value) < 0)
            return -1;
    for (size_t i = 0; i < sizeof(amdt_text_constants) / sizeof(amdt_text_constants[0]); i++) {
        const char *v = amdt_text_constants[i].value;
        PyObject *o =
            amdt_text_constants[i].is_bytes ? PyBytes_FromString(v) : PyUnicode_FromString(v);
        int rc = o == NULL ? -1 : PyModule_AddObjectRef(m, amdt_text_constants[i].name, o);
        Py_XDECREF(o);
        if (rc < 0)
            return -1;
    }
    /* Of this build and process: */
    if (PyModule_AddStringConstant(m, "HASH_IMPL", amdt_hash_impl) < 0)
        return -1;
    return 0;
}

static int amdt_exec(PyObject *m)
{
    amdt_modstate *st = PyModule_GetState(m);
    amdt_debug_init();
    amdt_hash_init();

    st->sender_type = PyType_FromModuleAndSpec(m, &amdt_py_sender_spec, NULL);
    if (st->sender_type == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "Sender", st->sender_type) < 0)
        return -1;
    st->receiver_type = PyType_FromModuleAndSpec(m, &amdt_py_receiver_spec, NULL);
    if (st->receiver_type == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "Receiver", st->receiver_type) < 0)
        return -1;
    st->shared_type = PyType_FromModuleAndSpec(m, &amdt_py_shared_spec, NULL);
    if (st->shared_type == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "SharedLimit", st->shared_type) < 0)
        return -1;
    return amdt_add_constants(m);
}

static int amdt_traverse(PyObject *m, visitproc visit, void *arg)
{
    amdt_modstate *st = PyModule_GetState(m);
    Py_VISIT(st->sender_type);
    Py_VISIT(st->receiver_type);
    Py_VISIT(st->shared_type);
    return 0;
}

static int amdt_clear(PyObject *m)
{
    amdt_modstate *st = PyModule_GetState(m);
    Py_CLEAR(st->sender_type);
    Py_CLEAR(st->receiver_type);
    Py_CLEAR(st->shared_type);
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
