/*
 * The Python face of the engine, shared by its two types (py_sender.c: Sender,
 * py_receiver.c: Receiver) and the module (module.c). These files are the only ones under src/
 * that include Python.h; they parse arguments, call the engine and convert its results (stats,
 * events) to tuples. transfer_engine/engine.py wraps those in typed classes and validates
 * arguments first, so the checks here are the last line, not the user-facing one.
 *
 * Both types have one instance layout, amdt_py_engine: the engine pointer and a table of the
 * few engine calls the shared methods need (close, free, events, stages by name). close(),
 * events(), set_throttle(), the `closed` attribute and deallocation are written once here.
 *
 * GIL policy: worker threads never touch Python objects. The GIL is released around calls
 * that block: construction (name resolution, bind, thread start), close() and dealloc
 * (joining threads), and Receiver.remove_file() (waits for in-flight writes). The other calls
 * keep it: they only take engine mutexes that workers hold for a few instructions and never
 * across a system call, and workers never wait for the GIL, so no deadlock is possible.
 */
#ifndef AMDT_PY_COMMON_H
#define AMDT_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"
#include "pool.h"
#include "stage.h"

#define AMDT_ERRLEN 256 /* the engine's error messages (err, errlen arguments) */

/* What the shared methods need to know about one kind of engine. */
typedef struct amdt_py_kind {
    const char *name;        /* "sender" / "receiver", for messages */
    const char *stage_names; /* for set_throttle's message: "'read' or 'net'" */
    PyObject **new_error;    /* the exception of a failed construction */
    /* amdt_sender_new / amdt_receiver_new: resolve or bind, start threads (without the GIL). */
    void *(*new)(const void *cfg, char *err, size_t errlen);
    void (*close)(void *engine);          /* stop and join: called without the GIL */
    void (*free)(void *engine);           /* close (if needed) and free: without the GIL */
    amdt_events *(*events)(void *engine); /* the engine's event queue */
    amdt_stage *(*stage)(void *engine, const char *name); /* NULL: not a throttled stage */
} amdt_py_kind;

/* The instance layout of Sender and Receiver. */
typedef struct amdt_py_engine {
    PyObject_HEAD
    void *engine;             /* amdt_sender * / amdt_receiver *; NULL until __init__ */
    const amdt_py_kind *kind; /* set by tp_new (amdt_py_new) */
    int closing;              /* close() started; relies on the GIL (no Py_mod_gil slot) */
    PyObject *peer; /* what the engine's threads use besides the engine, kept alive until they
                     * are joined (released after the engine): a Sender on the local link, the
                     * Receiver it hands chunks to; a Receiver, its SharedLimit */
} amdt_py_engine;

/* The engine types' specs (py_sender.c, py_receiver.c), instantiated by module.c. */
extern PyType_Spec amdt_py_sender_spec;
extern PyType_Spec amdt_py_receiver_spec;
/* SharedLimit (py_shared.c): a write rate several receivers share. */
extern PyType_Spec amdt_py_shared_spec;
/* The clock of a SharedLimit object, or NULL with TypeError / RuntimeError. */
amdt_shared_clock *amdt_py_shared_clock(PyObject *obj);

/* ---- life cycle (tp_new, tp_dealloc, close(), closed) ---------------------------------- */

PyObject *amdt_py_new(PyTypeObject *type, const amdt_py_kind *kind);
void amdt_py_dealloc(PyObject *self);
PyObject *amdt_py_close(PyObject *self, PyObject *unused);
PyObject *amdt_py_get_closed(PyObject *self, void *closure);
/* 0 before the first __init__; -1 with RuntimeError when called twice. */
int amdt_py_init_once(amdt_py_engine *self);
/* The end of __init__: start the engine from cfg without the GIL; 0, or -1 with kind->new_error
 * set to the engine's message. */
int amdt_py_start(amdt_py_engine *self, const void *cfg);
/* The engine of a Receiver object of this module (for the sender's local link), or NULL with
 * TypeError / RuntimeError (closed). */
void *amdt_py_receiver_engine(PyObject *obj);
/* The engine for a call that changes it; NULL with RuntimeError once closed. */
void *amdt_py_usable(amdt_py_engine *self);
/* The engine for a call that only reads it (stats, events: allowed after close()). */
void *amdt_py_readable(amdt_py_engine *self);

/* ---- shared methods --------------------------------------------------------------------- */

/* The entries of both types' method and attribute tables that the shared code serves. */
#define AMDT_PY_ENGINE_METHODS                                                       \
    {"events", amdt_py_events, METH_NOARGS, "events() -> list of tuples (drained)"}, \
        {"close", amdt_py_close, METH_NOARGS, "close(): stop and join every thread"}
#define AMDT_PY_ENGINE_GETSET {"closed", amdt_py_get_closed, NULL, "True after close()", NULL}

PyObject *amdt_py_events(PyObject *self, PyObject *unused);     /* events() -> list of tuples */
PyObject *amdt_py_set_throttle(PyObject *self, PyObject *args); /* (stage, thread_bps, total_bps) */

/* ---- arguments: 0 ok, -1 with ValueError set ------------------------------------------- */

int amdt_py_check_u32(long long v, const char *name);
int amdt_py_check_nonneg(long long v, const char *name);
int amdt_py_check_range(long long v, long long lo, long long hi, const char *name);
/* The arguments both constructors share: the session token (AMDT_TOKEN_LEN bytes), chunk
 * size, buffer bytes, and tls_key (None, or AMDT_TLS_KEY_LEN bytes copied into key_buf;
 * *key = key_buf or NULL for plain connections). */
int amdt_py_check_engine_args(Py_buffer *token, long long chunk_size, long long memory_bytes,
                              PyObject *tls_key, uint8_t *key_buf, const uint8_t **key);
/* Parse a lone file id argument ("L", 0..2**32-1). */
int amdt_py_parse_file_id(PyObject *args, uint32_t *id);

/* ---- results and errors ----------------------------------------------------------------- */

PyObject *amdt_py_stage_tuple(const amdt_stage_stats *st);
PyObject *amdt_py_buffer_tuple(const amdt_pool_stats *b);
/* An engine call's failure: MemoryError for rc -3 (out of memory), else exc(err). */
PyObject *amdt_py_engine_error(int rc, PyObject *exc, const char *err);
/* KeyError("unknown file id N"). */
PyObject *amdt_py_unknown_file(uint32_t id);
/* OSError from an errno returned by a thread-count change (pthread_create). */
PyObject *amdt_py_thread_error(int rc);

#endif /* AMDT_PY_COMMON_H */
