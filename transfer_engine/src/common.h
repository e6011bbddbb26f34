/*
 * Shared helpers of the AutoMDT transfer engine: debug logging, clocks, timed waits,
 * little-endian encoding, a u32 -> pointer map and the event queue.
 *
 * Nothing here (or anywhere under src/ except module.c and py_*.c) includes Python.h: worker threads
 * never touch Python objects.
 *
 * Locking rule of the whole engine: no function ever holds two engine mutexes at once,
 * and no mutex is held across a blocking system call (open, pread, pwrite, send, recv,
 * connect, accept, sleeps). Python-facing calls therefore only wait a few microseconds
 * for a lock, which is why most of them keep the GIL (see py_common.h).
 */
#ifndef AMDT_COMMON_H
#define AMDT_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "constants.h"

/* ---- debug ------------------------------------------------------------------------- */

extern int amdt_debug_enabled;

void amdt_debug_init(void);
void amdt_debug_impl(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The check avoids evaluating the arguments when debug mode (env AUTOMDT_DEBUG, set_debug())
 * is off. */
#define amdt_debug(...)                                       \
    do {                                                      \
        if (amdt_debug_enabled)                               \
            amdt_debug_impl(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* ---- time -------------------------------------------------------------------------- */

#define AMDT_NS_PER_S 1000000000ULL

uint64_t amdt_now_ns(void); /* CLOCK_MONOTONIC */

/* The stop flag of an engine: set once by close(), read by every thread without a lock. */
static inline int amdt_stopping(const int *flag)
{
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

static inline void amdt_set_stop(int *flag)
{
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
}

/* Condition variables use CLOCK_MONOTONIC so a wall-clock jump cannot stretch a wait. */
int amdt_cond_init(pthread_cond_t *cv);
/* Wait at most `ms` milliseconds; returns 0 or ETIMEDOUT. The caller re-checks its predicate. */
int amdt_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, unsigned ms);

/* Sleep until the monotonic time `deadline_ns`, in slices of at most AMDT_WAIT_MS, returning
 * early when *stop becomes non-zero or *gen differs from `gen0` (gen may be NULL). */
void amdt_sleep_until(uint64_t deadline_ns, const int *stop, const unsigned *gen, unsigned gen0);

/* ---- byte order -------------------------------------------------------------------- */

static inline void amdt_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void amdt_put_le64(uint8_t *p, uint64_t v)
{
    amdt_put_le32(p, (uint32_t)v);
    amdt_put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint32_t amdt_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t amdt_get_le64(const uint8_t *p)
{
    return (uint64_t)amdt_get_le32(p) | ((uint64_t)amdt_get_le32(p + 4) << 32);
}

/* ---- u32 -> pointer map (open addressing, linear probing, tombstones) ----------------- */

typedef struct amdt_map {
    uint32_t *keys;
    void **vals;   /* NULL = empty, AMDT_MAP_TOMB = deleted */
    size_t cap;    /* power of two */
    size_t used;   /* live entries */
    size_t filled; /* live entries + tombstones */
} amdt_map;

int amdt_map_init(amdt_map *m);
void amdt_map_free(amdt_map *m);
void *amdt_map_get(const amdt_map *m, uint32_t key);
int amdt_map_put(amdt_map *m, uint32_t key, void *val); /* 0 ok, -1 ENOMEM */
void *amdt_map_del(amdt_map *m, uint32_t key);          /* returns the removed value */
/* Iterate: for (size_t i = 0; i < m->cap; i++) if (amdt_map_live(m, i)) ... */
int amdt_map_live(const amdt_map *m, size_t i);

/* ---- events ------------------------------------------------------------------------ */

typedef enum amdt_event_kind {
    AMDT_EV_FILE_ERROR = 1, /* file_id, err, msg */
    AMDT_EV_CONN_ERROR,     /* err, msg */
    AMDT_EV_CONN_REJECTED,  /* msg */
    AMDT_EV_PROTOCOL_ERROR, /* msg */
    AMDT_EV_CHUNK_BAD,      /* file_id, offset, length */
    AMDT_EV_FILE_DONE,      /* file_id */
    AMDT_EV_WRITE_ERROR,    /* file_id, err, msg */
    AMDT_EV_DROPPED,        /* offset = number of events dropped because the queue was full */
} amdt_event_kind;

#define AMDT_EVENT_MSG 200

typedef struct amdt_event {
    int kind;
    int err;
    uint32_t file_id;
    uint32_t length;
    uint64_t offset;
    char msg[AMDT_EVENT_MSG];
} amdt_event;

typedef struct amdt_events {
    pthread_mutex_t mu;
    amdt_event *buf; /* ring */
    size_t cap, head, count;
    uint64_t dropped;
} amdt_events;

int amdt_events_init(amdt_events *q);
void amdt_events_free(amdt_events *q);
void amdt_event_push(amdt_events *q, int kind, uint32_t file_id, uint64_t offset, uint32_t length,
                     int err, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* Move every queued event to a new malloc'ed array (caller frees); *n gets the count
 * (NULL with *n == 0: no events; NULL with *n == (size_t)-1: out of memory, queue kept).
 * A pending dropped count is reported as a final AMDT_EV_DROPPED event. */
amdt_event *amdt_events_drain(amdt_events *q, size_t *n);

/* The limits both engines' configurations share (chunk size, a buffer of at least one chunk,
 * max_threads): 0, or -1 with the message in err. */
int amdt_check_engine_cfg(uint64_t chunk_size, uint64_t memory_bytes, int max_threads, char *err,
                          size_t errlen);

/* strerror_r into a caller buffer (GNU/XSI agnostic). */
const char *amdt_strerror(int err, char *buf, size_t len);

#endif /* AMDT_COMMON_H */
