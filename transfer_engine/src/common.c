/* Shared helpers: debug logging, clocks, timed waits, the id map and the event queue. */
#include "common.h"

int amdt_debug_enabled = 0;

void amdt_debug_init(void)
{
    /* AUTOMDT_DEBUG mirrors the CLI's --debug (which calls set_debug()) for any user of the
     * module: set and not "0" turns the engine's debug lines on. */
    const char *v = getenv("AUTOMDT_DEBUG");
    amdt_debug_enabled = (v != NULL && v[0] != '\0' && strcmp(v, "0") != 0);
}

void amdt_debug_impl(const char *file, int line, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    /* One fprintf call per line so lines from several threads do not interleave. */
    fprintf(stderr, "automdt-engine %s:%d: %s\n", file, line, buf);
}

/* ---- time -------------------------------------------------------------------------- */

uint64_t amdt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * AMDT_NS_PER_S + (uint64_t)ts.tv_nsec;
}

int amdt_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc != 0)
        return rc;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    rc = pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
}

int amdt_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, unsigned ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ULL;
    ts.tv_sec += (time_t)(ns / AMDT_NS_PER_S);
    ts.tv_nsec = (long)(ns % AMDT_NS_PER_S);
    return pthread_cond_timedwait(cv, mu, &ts);
}

void amdt_sleep_until(uint64_t deadline_ns, const int *stop, const unsigned *gen, unsigned gen0)
{
    for (;;) {
        if (stop != NULL && amdt_stopping(stop))
            return;
        if (gen != NULL && __atomic_load_n(gen, __ATOMIC_RELAXED) != gen0)
            return;
        uint64_t now = amdt_now_ns();
        if (now >= deadline_ns)
            return;
        uint64_t until = deadline_ns;
        if (until - now > (uint64_t)AMDT_WAIT_MS * 1000000ULL)
            until = now + (uint64_t)AMDT_WAIT_MS * 1000000ULL;
        struct timespec ts = {.tv_sec = (time_t)(until / AMDT_NS_PER_S),
                              .tv_nsec = (long)(until % AMDT_NS_PER_S)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
}

/* ---- id map ------------------------------------------------------------------------ */

static char amdt_map_tomb_;
#define AMDT_MAP_TOMB ((void *)&amdt_map_tomb_)

static inline size_t amdt_map_hash(uint32_t key)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 17);
}

int amdt_map_init(amdt_map *m)
{
    m->cap = 64;
    m->used = m->filled = 0;
    m->keys = calloc(m->cap, sizeof(*m->keys));
    m->vals = calloc(m->cap, sizeof(*m->vals));
    if (m->keys == NULL || m->vals == NULL) {
        free(m->keys);
        free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return -1;
    }
    return 0;
}

void amdt_map_free(amdt_map *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->used = m->filled = 0;
}

int amdt_map_live(const amdt_map *m, size_t i)
{
    return m->vals[i] != NULL && m->vals[i] != AMDT_MAP_TOMB;
}

void *amdt_map_get(const amdt_map *m, uint32_t key)
{
    size_t mask = m->cap - 1;
    for (size_t i = amdt_map_hash(key) & mask;; i = (i + 1) & mask) {
        void *v = m->vals[i];
        if (v == NULL)
            return NULL;
        if (v != AMDT_MAP_TOMB && m->keys[i] == key)
            return v;
    }
}

static int amdt_map_grow(amdt_map *m, size_t new_cap)
{
    uint32_t *keys = calloc(new_cap, sizeof(*keys));
    void **vals = calloc(new_cap, sizeof(*vals));
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return -1;
    }
    size_t mask = new_cap - 1;
    for (size_t j = 0; j < m->cap; j++) {
        if (!amdt_map_live(m, j))
            continue;
        size_t i = amdt_map_hash(m->keys[j]) & mask;
        while (vals[i] != NULL)
            i = (i + 1) & mask;
        keys[i] = m->keys[j];
        vals[i] = m->vals[j];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = new_cap;
    m->filled = m->used;
    return 0;
}

int amdt_map_put(amdt_map *m, uint32_t key, void *val)
{
    if ((m->filled + 1) * 4 >= m->cap * 3) {
        size_t new_cap = (m->used + 1) * 4 >= m->cap * 2 ? m->cap * 2 : m->cap;
        if (amdt_map_grow(m, new_cap) != 0)
            return -1;
    }
    size_t mask = m->cap - 1;
    size_t tomb = (size_t)-1;
    for (size_t i = amdt_map_hash(key) & mask;; i = (i + 1) & mask) {
        void *v = m->vals[i];
        if (v == NULL) {
            if (tomb != (size_t)-1)
                i = tomb;
            else
                m->filled++;
            m->keys[i] = key;
            m->vals[i] = val;
            m->used++;
            return 0;
        }
        if (v == AMDT_MAP_TOMB) {
            if (tomb == (size_t)-1)
                tomb = i;
        } else if (m->keys[i] == key) {
            m->vals[i] = val;
            return 0;
        }
    }
}

void *amdt_map_del(amdt_map *m, uint32_t key)
{
    size_t mask = m->cap - 1;
    for (size_t i = amdt_map_hash(key) & mask;; i = (i + 1) & mask) {
        void *v = m->vals[i];
        if (v == NULL)
            return NULL;
        if (v != AMDT_MAP_TOMB && m->keys[i] == key) {
            m->vals[i] = AMDT_MAP_TOMB;
            m->used--;
            return v;
        }
    }
}

/* ---- events ------------------------------------------------------------------------ */

int amdt_events_init(amdt_events *q)
{
    memset(q, 0, sizeof(*q));
    return pthread_mutex_init(&q->mu, NULL);
}

void amdt_events_free(amdt_events *q)
{
    free(q->buf);
    q->buf = NULL;
    q->cap = q->head = q->count = 0;
    pthread_mutex_destroy(&q->mu);
}

void amdt_event_push(amdt_events *q, int kind, uint32_t file_id, uint64_t offset, uint32_t length,
                     int err, const char *fmt, ...)
{
    amdt_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = kind;
    ev.err = err;
    ev.file_id = file_id;
    ev.offset = offset;
    ev.length = length;
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ev.msg, sizeof(ev.msg), fmt, ap);
        va_end(ap);
    }
    amdt_debug("event %d file %u: %s", kind, file_id, ev.msg);

    pthread_mutex_lock(&q->mu);
    /* Connection-level events can come in storms (a peer refusing connections for hours):
     * past AMDT_EVENTS_MAX undrained events they are only counted. Events about a file or
     * a chunk carry state the session needs, and are bounded by the data: always kept. */
    int droppable = kind == AMDT_EV_CONN_ERROR || kind == AMDT_EV_CONN_REJECTED ||
                    kind == AMDT_EV_PROTOCOL_ERROR;
    if (droppable && q->count >= AMDT_EVENTS_MAX) {
        q->dropped++;
        goto done;
    }
    if (q->count == q->cap) {
        size_t new_cap = q->cap ? q->cap * 2 : 64;
        amdt_event *nb = malloc(new_cap * sizeof(*nb));
        if (nb == NULL) {
            q->dropped++;
            goto done;
        }
        for (size_t i = 0; i < q->count; i++)
            nb[i] = q->buf[(q->head + i) % q->cap];
        free(q->buf);
        q->buf = nb;
        q->cap = new_cap;
        q->head = 0;
    }
    q->buf[(q->head + q->count) % q->cap] = ev;
    q->count++;
done:
    pthread_mutex_unlock(&q->mu);
}

amdt_event *amdt_events_drain(amdt_events *q, size_t *n)
{
    amdt_event *out = NULL;
    pthread_mutex_lock(&q->mu);
    size_t total = q->count + (q->dropped ? 1 : 0);
    *n = 0;
    if (total == 0)
        goto done;
    out = malloc(total * sizeof(*out));
    if (out == NULL) {
        *n = (size_t)-1; /* leave the queue as it is; the caller reports MemoryError */
        goto done;
    }
    for (size_t i = 0; i < q->count; i++)
        out[i] = q->buf[(q->head + i) % q->cap];
    if (q->dropped) {
        memset(&out[q->count], 0, sizeof(*out));
        out[q->count].kind = AMDT_EV_DROPPED;
        out[q->count].offset = q->dropped;
        q->dropped = 0;
    }
    *n = total;
    q->head = q->count = 0;
    /* Give back a queue that grew large during an error storm. */
    if (q->cap > 1024) {
        free(q->buf);
        q->buf = NULL;
        q->cap = 0;
    }
done:
    pthread_mutex_unlock(&q->mu);
    return out;
}

int amdt_check_engine_cfg(uint64_t chunk_size, uint64_t memory_bytes, int max_threads, char *err,
                          size_t errlen)
{
    if (chunk_size < AMDT_CHUNK_SIZE_MIN || chunk_size > AMDT_CHUNK_SIZE_MAX) {
        snprintf(err, errlen, "chunk_size must be in %d..%d, got %llu", AMDT_CHUNK_SIZE_MIN,
                 AMDT_CHUNK_SIZE_MAX, (unsigned long long)chunk_size);
        return -1;
    }
    if (memory_bytes < chunk_size) {
        snprintf(err, errlen, "memory_bytes (%llu) must hold at least one chunk (%llu)",
                 (unsigned long long)memory_bytes, (unsigned long long)chunk_size);
        return -1;
    }
    if (max_threads < 1 || max_threads > AMDT_MAX_THREADS) {
        snprintf(err, errlen, "max_threads must be in 1..%d, got %d", AMDT_MAX_THREADS,
                 max_threads);
        return -1;
    }
    return 0;
}

const char *amdt_strerror(int err, char *buf, size_t len)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(err, buf, len);
#else
    if (strerror_r(err, buf, len) != 0)
        snprintf(buf, len, "error %d", err);
    return buf;
#endif
}
