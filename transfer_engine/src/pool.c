/* Staging buffer of chunk slots (see pool.h). */
#include "pool.h"

/* ---- slot memory kept between pools -------------------------------------------------- *
 * A receiving daemon makes one pool per session. Freeing the slot memory at the end of a
 * session and faulting in fresh memory for the next one costs a page fault and a zeroed
 * page per 4 KiB (65536 faults for 256 MiB of staging, CPU time the session pays). Released slot
 * memory therefore goes to this process-wide cache, up to the bytes of the largest pool
 * released (at most AMDT_CACHE_MAX), and new slots of the same size come from it. Memory
 * cached longer than AMDT_CACHE_AGE_NS is freed at the next cache access or by
 * amdt_pool_trim_cache() (the receiving server calls it while idle). The link of a cached
 * buffer lives in its own first bytes. */
#define AMDT_CACHE_MAX (1ULL << 30)
#define AMDT_CACHE_AGE_NS (60ULL * AMDT_NS_PER_S)

typedef struct amdt_cached {
    struct amdt_cached *next;
    size_t bytes;
} amdt_cached;

static pthread_mutex_t amdt_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static amdt_cached *amdt_cache_head;
static size_t amdt_cache_bytes, amdt_cache_cap;
static uint64_t amdt_cache_stamp; /* last time memory went in */

/* Free what the cache holds if it is older than max_age_ns (0: everything). Caller holds the lock. */
static void amdt_cache_trim_locked(uint64_t max_age_ns)
{
    if (amdt_cache_head == NULL || amdt_now_ns() - amdt_cache_stamp < max_age_ns)
        return;
    while (amdt_cache_head != NULL) {
        amdt_cached *c = amdt_cache_head;
        amdt_cache_head = c->next;
        free(c);
    }
    amdt_cache_bytes = 0;
    amdt_cache_cap = 0;
}

void amdt_pool_trim_cache(uint64_t max_age_ns)
{
    pthread_mutex_lock(&amdt_cache_mu);
    amdt_cache_trim_locked(max_age_ns);
    pthread_mutex_unlock(&amdt_cache_mu);
}

size_t amdt_pool_cached_bytes(void)
{
    pthread_mutex_lock(&amdt_cache_mu);
    size_t n = amdt_cache_bytes;
    pthread_mutex_unlock(&amdt_cache_mu);
    return n;
}

static void *amdt_cache_take(size_t bytes)
{
    amdt_cached *c = NULL, **pp;
    pthread_mutex_lock(&amdt_cache_mu);
    amdt_cache_trim_locked(AMDT_CACHE_AGE_NS);
    for (pp = &amdt_cache_head; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->bytes == bytes) {
            c = *pp;
            *pp = c->next;
            amdt_cache_bytes -= bytes;
            break;
        }
    }
    pthread_mutex_unlock(&amdt_cache_mu);
    return c;
}

/* Keep or free a slot's memory; `pool_bytes` is the releasing pool's allocated total. */
static void amdt_cache_put(void *data, size_t bytes, size_t pool_bytes)
{
    pthread_mutex_lock(&amdt_cache_mu);
    amdt_cache_trim_locked(AMDT_CACHE_AGE_NS);
    if (pool_bytes > amdt_cache_cap)
        amdt_cache_cap = pool_bytes < AMDT_CACHE_MAX ? pool_bytes : AMDT_CACHE_MAX;
    if (bytes >= sizeof(amdt_cached) && amdt_cache_bytes + bytes <= amdt_cache_cap) {
        amdt_cached *c = data;
        c->bytes = bytes;
        c->next = amdt_cache_head;
        amdt_cache_head = c;
        amdt_cache_bytes += bytes;
        amdt_cache_stamp = amdt_now_ns();
        data = NULL;
    }
    pthread_mutex_unlock(&amdt_cache_mu);
    free(data);
}

static size_t amdt_slot_bytes(size_t chunk_size)
{
    return (chunk_size + 4095) & ~(size_t)4095;
}

int amdt_pool_init(amdt_pool *p, size_t chunk_size, size_t slots_max, int with_data,
                   const int *stop)
{
    memset(p, 0, sizeof(*p));
    p->chunk_size = chunk_size;
    p->with_data = with_data;
    p->slots_max = slots_max;
    p->stop = stop;
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto error;
    if (amdt_cond_init(&p->cv_free) != 0)
        goto error_mu;
    if (amdt_cond_init(&p->cv_ready) != 0)
        goto error_free;
    return 0;

error_free:
    pthread_cond_destroy(&p->cv_free);
error_mu:
    pthread_mutex_destroy(&p->mu);
error:
    return -1;
}

void amdt_pool_release(amdt_pool *p)
{
    pthread_mutex_lock(&p->mu);
    amdt_slot *s = p->all;
    size_t bytes = amdt_slot_bytes(p->chunk_size);
    while (s != NULL) {
        amdt_slot *next = s->all_next;
        if (s->data != NULL)
            amdt_cache_put(s->data, bytes, p->slots_alloc * bytes);
        free(s);
        s = next;
    }
    p->all = p->free_list = p->ready_head = p->ready_tail = NULL;
    p->slots_alloc = p->slots_used = 0;
    p->fill_bytes = 0;
    p->ready_len = 0;
    pthread_mutex_unlock(&p->mu);
}

void amdt_pool_destroy(amdt_pool *p)
{
    amdt_pool_release(p);
    pthread_cond_destroy(&p->cv_ready);
    pthread_cond_destroy(&p->cv_free);
    pthread_mutex_destroy(&p->mu);
}

/* Allocate one slot; called without the lock (a multi-MiB malloc can take a while). */
static amdt_slot *amdt_slot_new(size_t chunk_size, int with_data)
{
    amdt_slot *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto error;
    s->fd = -1;
    if (!with_data)
        return s;
    size_t bytes = amdt_slot_bytes(chunk_size);
    s->data = amdt_cache_take(bytes);
    if (s->data == NULL && posix_memalign((void **)&s->data, 4096, bytes) != 0)
        goto error;
    return s;

error:
    free(s);
    return NULL;
}

amdt_slot *amdt_pool_get(amdt_pool *p, uint32_t length, unsigned wait_ms)
{
    amdt_slot *s = NULL;
    uint64_t deadline = amdt_now_ns() + (uint64_t)wait_ms * 1000000ULL;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (amdt_stopping(p->stop))
            break;
        if (p->free_list != NULL && p->slots_used < p->slots_max) {
            s = p->free_list;
            p->free_list = s->next;
            break;
        }
        if (p->free_list == NULL && p->slots_alloc < p->slots_max) {
            p->slots_alloc++; /* reserve the allocation, then malloc outside the lock */
            pthread_mutex_unlock(&p->mu);
            s = amdt_slot_new(p->chunk_size, p->with_data);
            pthread_mutex_lock(&p->mu);
            if (s == NULL) {
                p->slots_alloc--;
                amdt_debug("pool: out of memory allocating a %zu-byte slot", p->chunk_size);
                break;
            }
            s->all_next = p->all;
            p->all = s;
            break;
        }
        uint64_t now = amdt_now_ns();
        if (now >= deadline)
            break;
        unsigned ms = (unsigned)((deadline - now + 999999ULL) / 1000000ULL);
        amdt_cond_wait_ms(&p->cv_free, &p->mu, ms);
    }
    if (s != NULL) {
        s->next = NULL;
        s->length = length;
        p->slots_used++;
        p->fill_bytes += length;
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* Unlink a free slot from the list of all slots and free it (its memory leaves the process's
 * count at once: the point of a lowered cap). Called with the lock held. */
static void amdt_slot_drop_locked(amdt_pool *p, amdt_slot *s)
{
    for (amdt_slot **pp = &p->all; *pp != NULL; pp = &(*pp)->all_next) {
        if (*pp == s) {
            *pp = s->all_next;
            break;
        }
    }
    p->slots_alloc--;
    free(s->data);
    free(s);
}

void amdt_pool_put(amdt_pool *p, amdt_slot *s)
{
    pthread_mutex_lock(&p->mu);
    p->slots_used--;
    p->fill_bytes -= s->length;
    s->file = NULL;
    s->fd = -1;
    if (p->slots_alloc > p->slots_max) {
        amdt_slot_drop_locked(p, s); /* the cap was lowered: this slot is over it */
    } else {
        s->next = p->free_list;
        p->free_list = s;
        pthread_cond_signal(&p->cv_free);
    }
    pthread_mutex_unlock(&p->mu);
}

void amdt_pool_set_max(amdt_pool *p, size_t slots_max)
{
    pthread_mutex_lock(&p->mu);
    p->slots_max = slots_max > 0 ? slots_max : 1;
    while (p->slots_alloc > p->slots_max && p->free_list != NULL) {
        amdt_slot *s = p->free_list;
        p->free_list = s->next;
        amdt_slot_drop_locked(p, s);
    }
    pthread_cond_broadcast(&p->cv_free); /* a raised cap lets waiting producers allocate */
    pthread_mutex_unlock(&p->mu);
}

void amdt_pool_push(amdt_pool *p, amdt_slot *s)
{
    pthread_mutex_lock(&p->mu);
    s->next = NULL;
    if (p->ready_tail != NULL)
        p->ready_tail->next = s;
    else
        p->ready_head = s;
    p->ready_tail = s;
    p->ready_len++;
    pthread_cond_signal(&p->cv_ready);
    pthread_mutex_unlock(&p->mu);
}

amdt_slot *amdt_pool_pop(amdt_pool *p, unsigned wait_ms)
{
    amdt_slot *s = NULL;
    uint64_t deadline = amdt_now_ns() + (uint64_t)wait_ms * 1000000ULL;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (amdt_stopping(p->stop))
            break;
        if (p->ready_head != NULL) {
            s = p->ready_head;
            p->ready_head = s->next;
            if (p->ready_head == NULL)
                p->ready_tail = NULL;
            p->ready_len--;
            s->next = NULL;
            break;
        }
        uint64_t now = amdt_now_ns();
        if (now >= deadline)
            break;
        unsigned ms = (unsigned)((deadline - now + 999999ULL) / 1000000ULL);
        amdt_cond_wait_ms(&p->cv_ready, &p->mu, ms);
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

void amdt_pool_wake(amdt_pool *p)
{
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_free);
    pthread_cond_broadcast(&p->cv_ready);
    pthread_mutex_unlock(&p->mu);
}

void amdt_pool_get_stats(amdt_pool *p, amdt_pool_stats *out)
{
    pthread_mutex_lock(&p->mu);
    out->fill_bytes = p->fill_bytes;
    out->capacity_bytes = (uint64_t)p->slots_max * p->chunk_size;
    out->slots_used = p->slots_used;
    out->slots_total = p->slots_max;
    out->slots_allocated = p->slots_alloc;
    out->ready = p->ready_len;
    pthread_mutex_unlock(&p->mu);
}
