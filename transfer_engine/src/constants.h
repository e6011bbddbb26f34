/*
 * Limits and layouts the engine shares with Python, in one place.
 *
 * module.c exports each of them as a constant of automdt.transfer_engine._engine (the name
 * without the AMDT_ prefix, as listed in its table), and the Python side reads those instead of
 * repeating the numbers: transfer_engine/engine.py (argument checks), automdt/cli.py and the
 * receiver (session limits), automdt/journal.py (journal records). Change a value here and
 * rebuild: both sides move together. PROTOCOL.md describes the formats for humans; wire.h has
 * the frame encoder and decoder.
 *
 * Only macros: included by common.h, so every source file sees them.
 */
#ifndef AMDT_CONSTANTS_H
#define AMDT_CONSTANTS_H

/* ---- engine limits (Sender/Receiver constructor arguments) ---------------------------- */

#define AMDT_CHUNK_SIZE_MIN 1
#define AMDT_CHUNK_SIZE_MAX (1 << 30)
#define AMDT_MAX_THREADS 4096     /* threads of one stage */
#define AMDT_FILES_AT_ONCE_MAX 64 /* files a sender reads at the same time, at most */

/* ---- session limits: what automdt's CLI and control protocol accept ------------------- */

/* A subset of the engine's range: small enough chunks that a 256 MiB buffer holds many,
 * large enough that per-chunk costs (a frame header, a journal record) stay negligible. */
#define AMDT_SESSION_CHUNK_SIZE_MIN (4 << 10)
#define AMDT_SESSION_CHUNK_SIZE_MAX (64 << 20)

/* ---- waits and the event queue -------------------------------------------------------- */

#define AMDT_WAIT_MS 100      /* every wait is timed and re-checks the stop flag */
#define AMDT_EVENTS_MAX 65536 /* beyond this, connection events are only counted */

/* ---- data connections: hello and frame header (wire.h) -------------------------------- */

#define AMDT_HELLO_MAGIC "AMDTDATA"
#define AMDT_HELLO_MAGIC_LEN 8
#define AMDT_TOKEN_LEN 32
#define AMDT_HELLO_LEN (AMDT_HELLO_MAGIC_LEN + AMDT_TOKEN_LEN)
#define AMDT_TLS_KEY_LEN 32 /* the data connections' TLS 1.3 pre-shared key */

#define AMDT_FRAME_MAGIC 0x43444D41u /* "AMDC" in memory order */
#define AMDT_FRAME_HDR_LEN 32
/* The header in Python's struct notation: magic, file_id, offset, length, flags, hash. */
#define AMDT_FRAME_HDR_FORMAT "<IIQIIQ"

/* ---- journal records (receiver side, one per written chunk, appended with one write()) - */

#define AMDT_JOURNAL_MAGIC "AMJR"
#define AMDT_JOURNAL_MAGIC_LEN 4
#define AMDT_JOURNAL_REC_LEN 32
/* Byte offsets of the fields after the magic, all little-endian: */
#define AMDT_JOURNAL_REC_LENGTH 4 /* uint32: the chunk's length */
#define AMDT_JOURNAL_REC_OFFSET 8 /* uint64: the chunk's offset in the file */
#define AMDT_JOURNAL_REC_HASH 16  /* uint64: XXH3_64bits of the chunk, seed 0 */
#define AMDT_JOURNAL_REC_CHECK 24 /* uint64: XXH3_64bits of the record's bytes before it */
/* The record in Python's struct notation: magic, length, offset, hash, check. */
#define AMDT_JOURNAL_REC_FORMAT "<4sIQQQ"

#endif /* AMDT_CONSTANTS_H */
