/* Chunk hashing with a one-time choice between libxxhash and an AVX2 build (see hash.h). */
#include "hash.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t's size, for amdt_hstate */
#include <xxhash.h>

_Static_assert(sizeof(XXH3_state_t) <= AMDT_HSTATE_SIZE, "amdt_hstate too small for XXH3_state_t");

uint64_t amdt_hash64_lib(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

static void amdt_lib_reset(amdt_hstate *st)
{
    /* the seed-0 reset does not require it; a stack state is then defined */
    memset(st, 0, sizeof(*st));
    XXH3_64bits_reset((XXH3_state_t *)st->opaque);
}

static void amdt_lib_update(amdt_hstate *st, const void *data, size_t len)
{
    XXH3_64bits_update((XXH3_state_t *)st->opaque, data, len);
}

static uint64_t amdt_lib_digest(const amdt_hstate *st)
{
    return XXH3_64bits_digest((const XXH3_state_t *)st->opaque);
}

const amdt_hstream_ops amdt_hstream_lib = {amdt_lib_reset, amdt_lib_update, amdt_lib_digest};

amdt_hash_fn amdt_hash64 = amdt_hash64_lib;
const amdt_hstream_ops *amdt_hstream = &amdt_hstream_lib;
const char *amdt_hash_impl = "libxxhash";

void amdt_hash_init(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (amdt_hash64_avx2 != NULL && amdt_hstream_avx2 != NULL && __builtin_cpu_supports("avx2")) {
        amdt_hash64 = amdt_hash64_avx2;
        amdt_hstream = amdt_hstream_avx2;
        amdt_hash_impl = "xxh3-avx2";
    }
#endif
}
