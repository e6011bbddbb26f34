/*
 * Chunk hashing: XXH3_64bits (seed 0) of the system xxHash (libxxhash-dev).
 *
 * Debian's libxxhash is built for baseline x86-64 (SSE2). On CPUs with AVX2 the engine uses
 * the same XXH3 code from the system header, compiled inline for AVX2 (XXH_INLINE_ALL, several
 * times faster), chosen once at module load. Both give identical results;
 * amdt_hash_impl names the one in use.
 *
 * The streaming form (amdt_hstate) hashes a chunk piece by piece while each piece is still
 * in the CPU cache after the copy that brought it in (pread on the sender, recv on the
 * receiver): XXH3's streaming result equals the one-shot XXH3_64bits of the whole chunk.
 */
#ifndef AMDT_HASH_H
#define AMDT_HASH_H

#include "common.h"

typedef uint64_t (*amdt_hash_fn)(const void *data, size_t len);

extern amdt_hash_fn amdt_hash64;
extern const char *amdt_hash_impl;

void amdt_hash_init(void);
uint64_t amdt_hash64_lib(const void *data, size_t len);
/* NULL when not compiled for this architecture. */
extern const amdt_hash_fn amdt_hash64_avx2;

/* Room for an XXH3_state_t (checked at compile time in hash.c), 64-byte aligned. */
#define AMDT_HSTATE_SIZE 640
typedef struct amdt_hstate {
    _Alignas(64) unsigned char opaque[AMDT_HSTATE_SIZE];
} amdt_hstate;

typedef struct amdt_hstream_ops {
    void (*reset)(amdt_hstate *st);
    void (*update)(amdt_hstate *st, const void *data, size_t len);
    uint64_t (*digest)(const amdt_hstate *st);
} amdt_hstream_ops;

extern const amdt_hstream_ops *amdt_hstream; /* the one in use (amdt_hash_init) */
extern const amdt_hstream_ops amdt_hstream_lib;
extern const amdt_hstream_ops *const amdt_hstream_avx2; /* NULL when not compiled */

static inline void amdt_hash_reset(amdt_hstate *st)
{
    amdt_hstream->reset(st);
}
static inline void amdt_hash_update(amdt_hstate *st, const void *data, size_t len)
{
    amdt_hstream->update(st, data, len);
}
static inline uint64_t amdt_hash_digest(const amdt_hstate *st)
{
    return amdt_hstream->digest(st);
}

#endif /* AMDT_HASH_H */
