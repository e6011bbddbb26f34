/*
 * XXH3_64bits compiled for AVX2 from the system xxhash.h (XXH_INLINE_ALL: the functions are
 * static, renamed, and do not clash with the linked libxxhash). Only called when the CPU
 * reports AVX2 (hash.c).
 */
#include "hash.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2")
#define XXH_INLINE_ALL
#define XXH_VECTOR 2 /* XXH_AVX2 */
#include <xxhash.h>

static uint64_t amdt_hash64_avx2_impl(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

const amdt_hash_fn amdt_hash64_avx2 = amdt_hash64_avx2_impl;
#else
const amdt_hash_fn amdt_hash64_avx2 = NULL;
#endif
