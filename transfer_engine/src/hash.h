/*
 * Chunk hashing: XXH3_64bits (seed 0) of the system xxHash (libxxhash-dev).
 *
 * Debian's libxxhash is built for baseline x86-64 (SSE2, ~7 GB/s here). On CPUs with AVX2
 * the engine uses the same XXH3 code from the system header, compiled inline for AVX2
 * (XXH_INLINE_ALL, ~30 GB/s), chosen once at module load. Both give identical results;
 * amdt_hash_impl names the one in use.
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

#endif /* AMDT_HASH_H */
