/*
 * Receiver (destination host): accept thread -> one receiving thread per data connection
 * ("recv" stage) -> receiver staging buffer -> write pool ("write" stage).
 *
 * Like the sender, no code path holds two engine mutexes at once:
 *   r->mu        the file table, bitmaps and per-file in-flight counts
 *   r->pool.mu   slots and the write queue
 *   r->recv.mu / r->write.mu   thread slots and time accounting
 *   r->events.mu event queue
 *
 * remove_file(): the file leaves the table at once (later frames for it are protocol
 * errors, and writers that pop one of its chunks drop it), then the call waits until the
 * file's in-flight count is zero: a writer raises that count under r->mu before it uses
 * the file's fds and lowers it after its last pwrite/journal write. When remove_file
 * returns, no thread touches the fds again.
 */
#ifndef AMDT_RECEIVER_H
#define AMDT_RECEIVER_H

#include "common.h"
#include "pool.h"
#include "stage.h"
#include "tls.h"
#include "wire.h"

typedef struct amdt_rfile {
    uint32_t id;
    int fd;  /* data fd, owned by Python */
    int jfd; /* journal fd (O_APPEND) or -1, owned by Python */
    uint64_t size;
    uint64_t nchunks;
    uint64_t nwritten;
    uint8_t *done;    /* bit i: chunk i is written (LSB first) */
    uint8_t *claimed; /* bit i: a writer is writing chunk i */
    int inflight;     /* writers using fd/jfd right now */
    int removed;
} amdt_rfile;

typedef struct amdt_receiver_cfg {
    const char *host;
    int port;
    const uint8_t *token;
    uint64_t chunk_size;
    uint64_t memory_bytes;
    int max_threads;
    uint64_t write_thread_bps, write_total_bps;
    amdt_shared_clock *write_shared; /* NULL, or a rate shared with other receivers */
    int rcvbuf;
    int write_threads;      /* started at construction */
    const uint8_t *tls_key; /* AMDT_TLS_KEY_LEN bytes: connections must speak TLS; NULL: plain */
    int tls_per_record;     /* TLS: no read-ahead, one socket call per record (for comparisons) */
} amdt_receiver_cfg;

typedef struct amdt_receiver {
    int stop; /* atomic: amdt_stopping() / amdt_set_stop() */
    int closed;
    uint8_t token[AMDT_TOKEN_LEN];
    amdt_tls *tls; /* NULL: plain connections */
    uint64_t chunk_size;
    int lsock;
    int port;
    pthread_t accept_tid;
    int accept_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_removed; /* a removed file's in-flight count reached zero */
    amdt_map files;

    int write_behind; /* atomic: start the write-back of each chunk once written */
    uint64_t chunks_written, chunks_bad, chunks_duplicate, chunks_orphaned; /* atomics */
    uint64_t connections, connections_total, connections_rejected, protocol_errors;
    uint64_t local_users; /* atomic: local-link deliveries in progress (close waits for 0) */

    amdt_pool pool;
    amdt_stage recv, write;
    amdt_events events;
} amdt_receiver;

typedef struct amdt_receiver_stats {
    uint64_t time_ns;
    amdt_stage_stats recv, write;
    amdt_pool_stats buffer;
    uint64_t chunks_written, chunks_bad, chunks_duplicate, chunks_orphaned;
    uint64_t connections, connections_total, connections_rejected, protocol_errors;
} amdt_receiver_stats;

/* Binds, listens, starts the accept thread and the writers. Call without the GIL. */
amdt_receiver *amdt_receiver_new(const amdt_receiver_cfg *cfg, char *err, size_t errlen);
/* 0 ok; -1 invalid (err); -2 duplicate id; -3 out of memory. */
int amdt_receiver_add_file(amdt_receiver *r, uint32_t id, int fd, int jfd, uint64_t size,
                           const uint8_t *done, size_t done_len, char *err, size_t errlen);
/* 0 ok; -1 unknown id. Waits for in-flight writes of the file: call without the GIL. */
int amdt_receiver_remove_file(amdt_receiver *r, uint32_t id);
/* Chunk indices not yet written, malloc'ed into *out (caller frees). 0 ok; -1 unknown id;
 * -3 out of memory. */
int amdt_receiver_missing(amdt_receiver *r, uint32_t id, uint64_t **out, size_t *n, uint64_t *size);
int amdt_receiver_set_threads(amdt_receiver *r, int nwrite, int *old_write);
/* Write-behind on (1) or off (0): after each chunk's pwrite, start its write-back to the disk
 * (sync_file_range WRITE, not waiting), so a durable point at the end (syncfs) finds little
 * left to write; the page cache then holds less dirty data during the transfer. */
void amdt_receiver_set_write_behind(amdt_receiver *r, int on);
/* Change the staging buffer's cap (bytes, at least one chunk) while the receiver runs; a lower
 * cap frees buffer memory as the writers drain it. Returns the old cap in bytes. */
uint64_t amdt_receiver_set_memory(amdt_receiver *r, uint64_t memory_bytes);
void amdt_receiver_get_stats(amdt_receiver *r, amdt_receiver_stats *out);
void amdt_receiver_close(amdt_receiver *r);

/* ---- the local link (a sender in the same process) ------------------------------------------
 * A local transfer runs both ends in one process. Its sender's network threads then hand each
 * chunk to the receiver through these calls instead of a loopback connection: the frame header
 * is checked exactly as one that came over a connection, the thread waits for a free slot of
 * the receiver's staging buffer (the back-pressure a full socket gives), and the chunk's
 * buffer changes hands: the receiver slot takes the sender's filled buffer and gives its empty
 * one back, so no byte is copied between the sender's read and the receiver's write. The
 * writer verifies the chunk as always (PROTOCOL.md, "The local link"). */

/* One sender network thread starts (+1) or stops (-1) using the link: counted as a connection. */
void amdt_receiver_local_attach(amdt_receiver *r, int delta);
/* Deliver one chunk. *data: a buffer of the receiver's slot size holding h->length payload
 * bytes; on success it is swapped for an empty buffer of the same size. payload_hash: the XXH3
 * of those bytes (the writer compares it with h->hash). w: the calling sender thread, whose
 * state is WAIT while it waits for room. Returns 0; ECANCELED when either side stops (w's
 * stage stop flag or the receiver's); EPROTO when the header is invalid for the file table
 * (a protocol-error event is queued, as for a connection). */
int amdt_receiver_local_deliver(amdt_receiver *r, amdt_worker *w, const amdt_frame_hdr *h,
                                uint8_t **data, uint64_t payload_hash);
void amdt_receiver_free(amdt_receiver *r);

#endif /* AMDT_RECEIVER_H */
