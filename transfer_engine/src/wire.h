/*
 * Wire format of the data connections (documented for humans in transfer_engine/PROTOCOL.md).
 *
 * A data connection goes one way, sender -> receiver, and carries:
 *   hello : 8 bytes "AMDTDATA" + 32 bytes session token                       (40 bytes)
 *   frame*: 32-byte header, all little-endian, then `length` payload bytes
 *             uint32 magic   = 0x43444D41 ("AMDC" in memory order)
 *             uint32 file_id
 *             uint64 offset   (a multiple of the session chunk size)
 *             uint32 length   (min(chunk_size, file_size - offset), > 0)
 *             uint32 flags    (0; receivers reject anything else)
 *             uint64 hash     (XXH3_64bits of the payload, seed 0, XOR amdt_frame_mix(file_id,
 *                              offset): the hash binds the chunk to its place, so a header
 *                              corrupted into another valid (file, offset) fails the check)
 * The sender closes a connection only at a frame boundary; EOF inside a frame means the
 * partial chunk is dropped. The receiver never writes to a data connection.
 *
 * Journal record (receiver side, one per written chunk, appended with one write()):
 *   char magic[4] = "AMJR", uint32 length, uint64 offset, uint64 hash (of the payload alone),
 *   uint64 check = XXH3_64bits(first 24 bytes of the record)                  (32 bytes)
 *
 * The magics, sizes and field offsets are in constants.h (exported to Python: automdt/journal.py
 * reads the records with the same layout).
 */
#ifndef AMDT_WIRE_H
#define AMDT_WIRE_H

#include "common.h"
#include "hash.h"

/* splitmix64 finaliser of (file_id, offset): XORed into the frame's payload hash. */
static inline uint64_t amdt_frame_mix(uint32_t file_id, uint64_t offset)
{
    uint64_t z = offset ^ ((uint64_t)file_id * 0x9E3779B97F4A7C15ULL) ^ 0xA0761D6478BD642FULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

typedef struct amdt_frame_hdr {
    uint32_t magic;
    uint32_t file_id;
    uint64_t offset;
    uint32_t length;
    uint32_t flags;
    uint64_t hash;
} amdt_frame_hdr;

static inline void amdt_frame_encode(uint8_t out[AMDT_FRAME_HDR_LEN], const amdt_frame_hdr *h)
{
    amdt_put_le32(out + 0, h->magic);
    amdt_put_le32(out + 4, h->file_id);
    amdt_put_le64(out + 8, h->offset);
    amdt_put_le32(out + 16, h->length);
    amdt_put_le32(out + 20, h->flags);
    amdt_put_le64(out + 24, h->hash);
}

static inline void amdt_frame_decode(amdt_frame_hdr *h, const uint8_t in[AMDT_FRAME_HDR_LEN])
{
    h->magic = amdt_get_le32(in + 0);
    h->file_id = amdt_get_le32(in + 4);
    h->offset = amdt_get_le64(in + 8);
    h->length = amdt_get_le32(in + 16);
    h->flags = amdt_get_le32(in + 20);
    h->hash = amdt_get_le64(in + 24);
}

_Static_assert(sizeof(AMDT_HELLO_MAGIC) - 1 == AMDT_HELLO_MAGIC_LEN, "hello magic length");
_Static_assert(sizeof(AMDT_JOURNAL_MAGIC) - 1 == AMDT_JOURNAL_MAGIC_LEN, "journal magic length");
_Static_assert(AMDT_JOURNAL_REC_CHECK + 8 == AMDT_JOURNAL_REC_LEN, "journal record size");

/* One journal record of a written chunk (see above). */
static inline void amdt_journal_encode(uint8_t out[AMDT_JOURNAL_REC_LEN], uint32_t length,
                                       uint64_t offset, uint64_t payload_hash)
{
    memcpy(out, AMDT_JOURNAL_MAGIC, AMDT_JOURNAL_MAGIC_LEN);
    amdt_put_le32(out + AMDT_JOURNAL_REC_LENGTH, length);
    amdt_put_le64(out + AMDT_JOURNAL_REC_OFFSET, offset);
    amdt_put_le64(out + AMDT_JOURNAL_REC_HASH, payload_hash);
    amdt_put_le64(out + AMDT_JOURNAL_REC_CHECK, amdt_hash64(out, AMDT_JOURNAL_REC_CHECK));
}

#endif /* AMDT_WIRE_H */
