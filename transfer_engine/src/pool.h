/*
 * Staging buffer: a bounded set of chunk slots plus a FIFO of filled slots.
 *
 * The byte cap becomes a slot cap (memory_bytes / chunk_size tokens, as in rclone's
 * buffer pool). Slots are malloc'ed lazily, the first time no free slot is left and the
 * cap allows one more, then reused through a free list and only freed by amdt_pool_free()
 * at close: no per-chunk allocation on the data path.
 *
 * A pool made without data (with_data = 0) holds only the slot records: the sender's
 * zero-copy mode stages (file, offset, length, hash) and leaves the bytes in the page cache,
 * so the byte cap then bounds what was read ahead and not yet sent, without a copy of it.
 * (Slots do not ask for transparent huge pages: a huge page of memory the host took back costs
 * more to fault in than 512 small ones from the free lists.)
 *
 * Producers (sender readers, receiver connections) take a free slot with amdt_pool_get(),
 * fill it and queue it with amdt_pool_push(); consumers (sender network threads, receiver
 * writers) take it with amdt_pool_pop() and give it back with amdt_pool_put(). Both waits
 * are timed and return NULL on timeout or when the stop flag is set, so a caller can
 * re-check whether it should exit.
 */
#ifndef AMDT_POOL_H
#define AMDT_POOL_H

#include "common.h"

typedef struct amdt_slot {
    struct amdt_slot *next;     /* free list or ready queue */
    struct amdt_slot *all_next; /* every allocated slot, for amdt_pool_free() */
    uint8_t *data;              /* chunk_size bytes, page aligned; NULL in a pool without data */
    void *file;                 /* sender: the amdt_sfile the chunk belongs to */
    int fd;                     /* sender, zero-copy: the source fd to sendfile() from */
    uint32_t file_id;
    uint32_t length; /* payload bytes */
    uint64_t offset;
    uint64_t hash;         /* sender: XXH3_64bits of the payload; receiver: the frame's hash */
    uint64_t payload_hash; /* receiver: XXH3_64bits of the payload as received */
} amdt_slot;

typedef struct amdt_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv_free;  /* a slot came back */
    pthread_cond_t cv_ready; /* a filled slot was queued */
    size_t chunk_size;
    int with_data;
    size_t slots_max;    /* cap in slots */
    size_t slots_alloc;  /* allocated so far (counting allocations in progress) */
    size_t slots_used;   /* handed out: being filled, queued, or being drained */
    uint64_t fill_bytes; /* payload bytes held by used slots */
    size_t ready_len;
    amdt_slot *free_list;
    amdt_slot *ready_head, *ready_tail;
    amdt_slot *all;
    const int *stop;
} amdt_pool;

typedef struct amdt_pool_stats {
    uint64_t fill_bytes;
    uint64_t capacity_bytes;
    uint64_t slots_used;
    uint64_t slots_total;
    uint64_t slots_allocated;
    uint64_t ready; /* filled slots waiting for a consumer */
} amdt_pool_stats;

int amdt_pool_init(amdt_pool *p, size_t chunk_size, size_t slots_max, int with_data,
                   const int *stop);
/* Free every slot's memory (at close). No thread may use the pool any more; the
 * counters stay readable. */
void amdt_pool_release(amdt_pool *p);
/* amdt_pool_release() plus the mutex and condition variables. */
void amdt_pool_destroy(amdt_pool *p);

/* A free slot for `length` payload bytes, or NULL after wait_ms / on stop / out of memory. */
amdt_slot *amdt_pool_get(amdt_pool *p, uint32_t length, unsigned wait_ms);
/* Give a slot back to the free list (its bytes leave the fill count). */
void amdt_pool_put(amdt_pool *p, amdt_slot *s);
/* Change the cap while the pool is in use: a lowered cap frees free slots above it now and
 * the others as they are given back; no slot is handed out while the used ones reach it. */
void amdt_pool_set_max(amdt_pool *p, size_t slots_max);
/* Queue a filled slot for the consumers. */
void amdt_pool_push(amdt_pool *p, amdt_slot *s);
/* The oldest filled slot, or NULL after wait_ms / on stop. */
amdt_slot *amdt_pool_pop(amdt_pool *p, unsigned wait_ms);
/* Wake every waiter (stop, thread-count changes). */
void amdt_pool_wake(amdt_pool *p);
void amdt_pool_get_stats(amdt_pool *p, amdt_pool_stats *out);
/* Free the slot memory kept between pools (see pool.c) if it was kept max_age_ns or longer
 * (0: now). */
void amdt_pool_trim_cache(uint64_t max_age_ns);
size_t amdt_pool_cached_bytes(void);

#endif /* AMDT_POOL_H */
