/* Chunk hashing with a one-time choice between libxxhash and an AVX2 build (see hash.h). */
#include "hash.h"

#include <xxhash.h>

uint64_t amdt_hash64_lib(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

amdt_hash_fn amdt_hash64 = amdt_hash64_lib;
const char *amdt_hash_impl = "libxxhash";

void amdt_hash_init(void)
{
    const char *force = getenv("AUTOMDT_HASH");
    if (force != NULL && strcmp(force, "libxxhash") == 0)
        return;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (amdt_hash64_avx2 != NULL && __builtin_cpu_supports("avx2")) {
        amdt_hash64 = amdt_hash64_avx2;
        amdt_hash_impl = "xxh3-avx2";
    }
#endif
}
