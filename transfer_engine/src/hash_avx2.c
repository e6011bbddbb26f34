/*
 * XXH3_64bits compiled for AVX2 from the system xxhash.h (XXH_INLINE_ALL: the functions are
 * static, renamed, and do not clash with the linked libxxhash). Only called when the CPU
 * reports AVX2 (hash.c). The streaming functions work on the same XXH3_state_t layout.
 */
#include "hash.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2")
#define XXH_INLINE_ALL
#define XXH_VECTOR 2 /* XXH_AVX2 */
#include <xxhash.h>

_Static_assert(sizeof(XXH3_state_t) <= AMDT_HSTATE_SIZE, "amdt_hstate too small for XXH3_state_t");

static uint64_t amdt_hash64_avx2_impl(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

static void amdt_avx2_reset(amdt_hstate *st)
{
    /* the seed-0 reset does not require it; a stack state is then defined */
    memset(st, 0, sizeof(*st));
    XXH3_64bits_reset((XXH3_state_t *)st->opaque);
}

static void amdt_avx2_update(amdt_hstate *st, const void *data, size_t len)
{
    XXH3_64bits_update((XXH3_state_t *)st->opaque, data, len);
}

static uint64_t amdt_avx2_digest(const amdt_hstate *st)
{
    return XXH3_64bits_digest((const XXH3_state_t *)st->opaque);
}

static const amdt_hstream_ops amdt_avx2_ops = {amdt_avx2_reset, amdt_avx2_update, amdt_avx2_digest};

const amdt_hash_fn amdt_hash64_avx2 = amdt_hash64_avx2_impl;
const amdt_hstream_ops *const amdt_hstream_avx2 = &amdt_avx2_ops;
#else
const amdt_hash_fn amdt_hash64_avx2 = NULL;
const amdt_hstream_ops *const amdt_hstream_avx2 = NULL;
#endif
