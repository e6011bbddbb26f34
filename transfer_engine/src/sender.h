/*
 * Sender (source host): read pool -> sender staging buffer -> network pool.
 *
 * Lock order: there is none, because no code path holds two of these at once:
 *   s->mu          files, read queue, requeue list, pending count
 *   s->pool.mu     slots and the send queue
 *   s->read.mu / s->net.mu   thread targets and time accounting
 *   s->events.mu   event queue
 */
#ifndef AMDT_SENDER_H
#define AMDT_SENDER_H

#include <sys/socket.h>

#include "common.h"

#include "pool.h"
#include "receiver.h"
#include "stage.h"
#include "tls.h"
#include <sys/types.h>

typedef struct amdt_range {
    uint64_t offset;
    uint64_t length;
} amdt_range;

typedef struct amdt_sfile {
    struct amdt_sfile *next; /* read queue (add order) */
    uint32_t id;
    char *path;
    uint64_t size;
    int64_t mtime_ns;
    amdt_range *ranges;
    size_t nranges;
    size_t range_idx; /* read cursor: ranges[range_idx].offset + range_pos */
    uint64_t range_pos;
    uint64_t cursor_left; /* chunks left under the cursor */
    uint64_t last_pick;   /* s->q_turn when a chunk was last taken from the cursor (0: never) */
    uint64_t requeued;    /* requeue entries that point at this file */
    int readers;          /* reader threads holding a chunk of this file */
    int senders;          /* zero-copy: staged or in-flight slots that will sendfile() from fd */
    int fd;               /* -1 when closed; opened lazily, closed when nothing is left to read
                           * and no staged slot refers to it */
    int failed;           /* read under s->mu, or atomically by network threads */
    int have_ino;         /* dev/ino of the first open, under s->mu: a re-open of a replaced */
    dev_t dev;            /* path (new inode) fails the file instead of splicing content */
    ino_t ino;
} amdt_sfile;

typedef struct amdt_requeue {
    struct amdt_requeue *next;
    amdt_sfile *f;
    uint64_t offset;
    uint32_t length;
} amdt_requeue;

typedef struct amdt_sender_cfg {
    const char *host;
    int port;
    const uint8_t *token; /* AMDT_TOKEN_LEN bytes */
    uint64_t chunk_size;
    uint64_t memory_bytes;
    int max_threads;
    uint64_t read_thread_bps, read_total_bps;
    uint64_t net_thread_bps, net_total_bps;
    int sndbuf;
    int fault_corrupt;
    int read_threads, net_threads; /* started at construction */
    const uint8_t *tls_key; /* AMDT_TLS_KEY_LEN bytes: TLS on every data connection; NULL: plain */
    int zerocopy;         /* stage references, not bytes: sendfile() from the page cache (plain), or
                   * re-read in pieces for TLS */
    amdt_receiver *local; /* a receiver in this process: the local link instead of connections
                           * to host:port (plain only; chunks are staged as bytes, not
                           * references: their buffers go to the receiver). It must outlive
                           * the sender's threads (amdt_sender_close). */
    int files_at_once;    /* files read at the same time (amdt_pick_file_locked); 0: follow the
                           * thread counts */
    int tls_per_record;   /* TLS: one socket call per record instead of batched records (for
                           * comparisons); 0: batched */
} amdt_sender_cfg;

typedef struct amdt_sender {
    int stop; /* atomic: amdt_stopping() / amdt_set_stop() */
    int closed;
    char host[256];
    int port;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    uint8_t token[AMDT_TOKEN_LEN];
    uint64_t chunk_size;
    int sndbuf;
    amdt_tls *tls; /* NULL: plain connections */
    int zerocopy;  /* readers hash the chunk (pread into a small buffer) and stage a reference;
                    * network threads send the payload with sendfile() (plain) or read it again
                    * in pieces and SSL_write() them (TLS). Off: the bytes are copied into slots. */
    amdt_receiver *local; /* the local link (see amdt_sender_cfg); NULL: TCP connections */

    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* a file or a requeued chunk was added */
    amdt_map files;
    amdt_sfile *q_head, *q_tail;
    int files_at_once; /* files read at the same time, round robin (amdt_pick_file_locked); 0:
                        * as many as the wider of the read and network stages has threads */
    uint64_t q_turn;   /* chunks taken from the queue (amdt_sfile.last_pick stamps) */
    amdt_requeue *rq_head, *rq_tail;
    uint64_t pending; /* queued to read + staged + in flight */
    uint64_t files_failed;

    uint64_t chunks_sent, chunks_requeued, frames_corrupted; /* atomics */
    uint64_t tcp_segs_closed, tcp_retrans_closed; /* of closed connections, under net.mu */
    int fault_corrupt;                            /* atomic */

    amdt_pool pool;
    amdt_stage read, net;
    amdt_events events;
} amdt_sender;

typedef struct amdt_sender_stats {
    uint64_t time_ns;
    amdt_stage_stats read, net;
    amdt_pool_stats buffer;
    uint64_t chunks_sent, chunks_requeued, frames_corrupted, chunks_pending, files_failed;
    uint64_t tcp_segs_out, tcp_retrans; /* TCP segments sent / retransmitted, all connections */
} amdt_sender_stats;

/* Blocking (name resolution, thread start): call without the GIL. NULL + err on failure. */
amdt_sender *amdt_sender_new(const amdt_sender_cfg *cfg, char *err, size_t errlen);
/* 0 ok; -1 invalid argument (err says why); -2 duplicate id; -3 out of memory. */
int amdt_sender_add_file(amdt_sender *s, uint32_t id, const char *path, uint64_t size,
                         int64_t mtime_ns, const amdt_range *ranges, size_t nranges, char *err,
                         size_t errlen);
/* 1 queued; 0 ignored (the file failed); -1 unknown id; -2 invalid range (err); -3 ENOMEM. */
int amdt_sender_requeue(amdt_sender *s, uint32_t id, uint64_t offset, uint64_t length, char *err,
                        size_t errlen);
/* Drop every chunk of the file not yet sent (queued, requeued or staged); frames being
 * sent finish. No event. 0 ok; -1 unknown id. */
int amdt_sender_cancel_file(amdt_sender *s, uint32_t id);
/* Returns 0 or an errno from pthread_create. */
int amdt_sender_set_threads(amdt_sender *s, int nread, int nnet, int *old_read, int *old_net);
void amdt_sender_set_fault_corrupt(amdt_sender *s, int n);
void amdt_sender_get_stats(amdt_sender *s, amdt_sender_stats *out);
/* Stop, wake, join every thread, free the slots. Idempotent. Call without the GIL. */
void amdt_sender_close(amdt_sender *s);
/* Close (if needed) and free everything. */
void amdt_sender_free(amdt_sender *s);

#endif /* AMDT_SENDER_H */
