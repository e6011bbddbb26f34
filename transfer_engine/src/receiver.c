/* Receiver: accept thread, receiving threads, staging buffer, write pool (see receiver.h). */
#include "receiver.h"

#include "hash.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire.h"

#define AMDT_HELLO_TIMEOUT_MS 5000
/* A payload is received in pieces of this size, each hashed right after its recv while it is
 * still in the CPU cache (the writer then only compares). */
#define AMDT_PIECE (128 * 1024)

typedef struct amdt_conn {
    int fd;
    char peer[80];
} amdt_conn;

static void amdt_conn_body(amdt_worker *w);
static void amdt_writer_body(amdt_worker *w);
static void *amdt_accept_main(void *arg);

static void amdt_format_peer(const struct sockaddr_storage *sa, char *out, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
        snprintf(out, len, "%s:%d", host, port);
    } else if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
        snprintf(out, len, "[%s]:%d", host, port);
    } else {
        snprintf(out, len, "unknown peer");
    }
}

/* ---- construction ------------------------------------------------------------------ */

/* Bind and listen on cfg's host and port (r->lsock, r->port): 0, or -1 with the message in err
 * (r->lsock, if open, is the caller's to close). */
static int amdt_receiver_listen(amdt_receiver *r, const amdt_receiver_cfg *cfg, char *err,
                                size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char portstr[16], ebuf[128];
    int rc = -1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    snprintf(portstr, sizeof(portstr), "%d", cfg->port);
    int gai = getaddrinfo(cfg->host[0] ? cfg->host : NULL, portstr, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "resolve %s: %s", cfg->host, gai_strerror(gai));
        goto out;
    }
    r->lsock = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (r->lsock < 0) {
        snprintf(err, errlen, "socket: %s", amdt_strerror(errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    int one = 1;
    setsockopt(r->lsock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Set on the listening socket so accepted sockets inherit it before the handshake
     * (the TCP window scale is fixed then). */
    if (cfg->rcvbuf > 0)
        setsockopt(r->lsock, SOL_SOCKET, SO_RCVBUF, &cfg->rcvbuf, sizeof(cfg->rcvbuf));
    if (bind(r->lsock, res->ai_addr, res->ai_addrlen) != 0) {
        snprintf(err, errlen, "bind %s:%d: %s", cfg->host, cfg->port,
                 amdt_strerror(errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (listen(r->lsock, 256) != 0) {
        snprintf(err, errlen, "listen: %s", amdt_strerror(errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    getsockname(r->lsock, (struct sockaddr *)&bound, &blen);
    r->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    rc = 0;
out:
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}

amdt_receiver *amdt_receiver_new(const amdt_receiver_cfg *cfg, char *err, size_t errlen)
{
    amdt_receiver *r = NULL;
    char ebuf[128];
    int have_mu = 0, have_cv = 0, have_map = 0, have_pool = 0, have_recv = 0, have_write = 0;
    int have_events = 0;

    if (amdt_check_engine_cfg(cfg->chunk_size, cfg->memory_bytes, cfg->max_threads, err, errlen) !=
        0)
        goto error;

    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        goto error;
    }
    r->lsock = -1;
    memcpy(r->token, cfg->token, AMDT_TOKEN_LEN);
    r->chunk_size = cfg->chunk_size;
    if (cfg->tls_key != NULL &&
        (r->tls = amdt_tls_new(1, cfg->tls_key, !cfg->tls_per_record, err, errlen)) == NULL)
        goto error_free;

    if (amdt_receiver_listen(r, cfg, err, errlen) != 0)
        goto error_free;

    if (pthread_mutex_init(&r->mu, NULL) != 0)
        goto error_sys;
    have_mu = 1;
    if (amdt_cond_init(&r->cv_removed) != 0)
        goto error_sys;
    have_cv = 1;
    if (amdt_map_init(&r->files) != 0)
        goto error_sys;
    have_map = 1;
    if (amdt_events_init(&r->events) != 0)
        goto error_sys;
    have_events = 1;
    size_t slots = (size_t)(cfg->memory_bytes / cfg->chunk_size);
    if (amdt_pool_init(&r->pool, cfg->chunk_size, slots, 1, &r->stop) != 0)
        goto error_sys;
    have_pool = 1;
    /* Receiving threads follow the connections; room for twice max_threads so that
     * connections being replaced (shrink then grow on the sender) do not get refused. */
    int max_conns = cfg->max_threads * 2 < 8 ? 8 : cfg->max_threads * 2;
    if (amdt_stage_init(&r->recv, "recv", max_conns, amdt_conn_body, r, &r->stop) != 0)
        goto error_sys;
    r->recv.target = max_conns; /* never asks a receiving thread to exit */
    r->recv.keep_clock = 1;     /* its limit (the daemon's fair share) changes every second */
    have_recv = 1;
    if (amdt_stage_init(&r->write, "write", cfg->max_threads, amdt_writer_body, r, &r->stop) != 0)
        goto error_sys;
    have_write = 1;
    amdt_stage_set_throttle(&r->write, cfg->write_thread_bps, cfg->write_total_bps);
    r->write.shared = cfg->write_shared;

    int rc = amdt_stage_set_target(&r->write, cfg->write_threads, NULL);
    if (rc != 0) {
        errno = rc;
        goto error_sys;
    }
    rc = pthread_create(&r->accept_tid, NULL, amdt_accept_main, r);
    if (rc != 0) {
        errno = rc;
        goto error_sys;
    }
    r->accept_started = 1;
    amdt_debug("receiver: port %d chunk %llu, %zu slots", r->port,
               (unsigned long long)r->chunk_size, slots);
    return r;

error_sys:
    snprintf(err, errlen, "receiver set-up failed: %s",
             amdt_strerror(errno ? errno : ENOMEM, ebuf, sizeof(ebuf)));
    amdt_set_stop(&r->stop);
    if (have_write) {
        amdt_stage_join_all(&r->write);
        amdt_stage_destroy(&r->write);
    }
    if (have_recv)
        amdt_stage_destroy(&r->recv);
    if (have_pool)
        amdt_pool_destroy(&r->pool);
    if (have_events)
        amdt_events_free(&r->events);
    if (have_map)
        amdt_map_free(&r->files);
    if (have_cv)
        pthread_cond_destroy(&r->cv_removed);
    if (have_mu)
        pthread_mutex_destroy(&r->mu);
error_free:
    if (r->lsock >= 0)
        close(r->lsock);
    amdt_tls_free(r->tls);
    free(r);
error:
    return NULL;
}

/* ---- files ------------------------------------------------------------------------- */

static void amdt_rfile_free(amdt_rfile *f)
{
    if (f == NULL)
        return;
    free(f->done);
    free(f->claimed);
    free(f);
}

static inline int amdt_bit_get(const uint8_t *b, uint64_t i)
{
    return (b[i >> 3] >> (i & 7)) & 1;
}

static inline void amdt_bit_set(uint8_t *b, uint64_t i)
{
    b[i >> 3] |= (uint8_t)(1u << (i & 7));
}

static inline void amdt_bit_clear(uint8_t *b, uint64_t i)
{
    b[i >> 3] &= (uint8_t)~(1u << (i & 7));
}

int amdt_receiver_add_file(amdt_receiver *r, uint32_t id, int fd, int jfd, uint64_t size,
                           const uint8_t *done, size_t done_len, char *err, size_t errlen)
{
    amdt_rfile *f = NULL;
    int rc = -3, complete = 0;

    if (size == 0) {
        snprintf(err, errlen, "file %u has size 0 (empty files are created by the session layer)",
                 id);
        return -1;
    }
    if (fd < 0) {
        snprintf(err, errlen, "fd must be an open file descriptor, got %d", fd);
        return -1;
    }
    uint64_t nchunks = (size + r->chunk_size - 1) / r->chunk_size;
    size_t nbytes = (size_t)((nchunks + 7) / 8);
    if (done != NULL && done_len != nbytes) {
        snprintf(err, errlen, "done_chunks must be %zu bytes for %llu chunks, got %zu", nbytes,
                 (unsigned long long)nchunks, done_len);
        return -1;
    }

    f = calloc(1, sizeof(*f));
    if (f == NULL)
        goto error;
    f->done = calloc(nbytes, 1);
    f->claimed = calloc(nbytes, 1);
    if (f->done == NULL || f->claimed == NULL)
        goto error;
    f->id = id;
    f->fd = fd;
    f->jfd = jfd;
    f->size = size;
    f->nchunks = nchunks;
    if (done != NULL) {
        for (uint64_t i = 0; i < nchunks; i++) {
            if (amdt_bit_get(done, i)) {
                amdt_bit_set(f->done, i);
                f->nwritten++;
            }
        }
    }
    complete = f->nwritten == f->nchunks;

    pthread_mutex_lock(&r->mu);
    if (amdt_map_get(&r->files, id) != NULL) {
        pthread_mutex_unlock(&r->mu);
        snprintf(err, errlen, "file id %u was already added", id);
        rc = -2;
        goto error;
    }
    if (amdt_map_put(&r->files, id, f) != 0) {
        pthread_mutex_unlock(&r->mu);
        goto error;
    }
    pthread_mutex_unlock(&r->mu);
    if (complete)
        amdt_event_push(&r->events, AMDT_EV_FILE_DONE, id, 0, 0, 0, NULL);
    return 0;

error:
    if (rc == -3)
        snprintf(err, errlen, "out of memory");
    amdt_rfile_free(f);
    return rc;
}

int amdt_receiver_remove_file(amdt_receiver *r, uint32_t id)
{
    pthread_mutex_lock(&r->mu);
    amdt_rfile *f = amdt_map_del(&r->files, id);
    if (f == NULL) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    f->removed = 1;
    /* Writers finish their current pwrite/journal write of this file; each one lowers
     * the in-flight count under r->mu and signals when it reaches zero. */
    while (f->inflight > 0)
        amdt_cond_wait_ms(&r->cv_removed, &r->mu, AMDT_WAIT_MS);
    pthread_mutex_unlock(&r->mu);
    amdt_rfile_free(f);
    return 0;
}

int amdt_receiver_missing(amdt_receiver *r, uint32_t id, uint64_t **out, size_t *n, uint64_t *size)
{
    int rc = 0;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&r->mu);
    amdt_rfile *f = amdt_map_get(&r->files, id);
    if (f == NULL) {
        rc = -1;
        goto done;
    }
    *size = f->size;
    size_t count = (size_t)(f->nchunks - f->nwritten);
    if (count == 0)
        goto done;
    *out = malloc(count * sizeof(**out));
    if (*out == NULL) {
        rc = -3;
        goto done;
    }
    for (uint64_t i = 0; i < f->nchunks && *n < count; i++)
        if (!amdt_bit_get(f->done, i))
            (*out)[(*n)++] = i;
done:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* ---- accept thread ----------------------------------------------------------------- */

static void *amdt_accept_main(void *arg)
{
    amdt_receiver *r = arg;
    char ebuf[128];

    while (!amdt_stopping(&r->stop)) {
        struct pollfd pfd = {.fd = r->lsock, .events = POLLIN};
        int pr = poll(&pfd, 1, AMDT_WAIT_MS);
        if (pr <= 0)
            continue;
        struct sockaddr_storage sa;
        socklen_t slen = sizeof(sa);
        int fd = accept4(r->lsock, (struct sockaddr *)&sa, &slen, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                amdt_debug("accept: %s", amdt_strerror(errno, ebuf, sizeof(ebuf)));
                amdt_sleep_until(amdt_now_ns() + AMDT_WAIT_MS * 1000000ULL, &r->stop, NULL, 0);
            }
            continue;
        }
        amdt_conn *c = malloc(sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        amdt_format_peer(&sa, c->peer, sizeof(c->peer));
        int idx = amdt_stage_spawn(&r->recv, c);
        if (idx < 0) {
            int e = idx == -2 ? errno : 0;
            __atomic_fetch_add(&r->connections_rejected, 1, __ATOMIC_RELAXED);
            amdt_event_push(&r->events, AMDT_EV_CONN_REJECTED, 0, 0, 0, e, "%s from %s",
                            idx == -2 ? "cannot start a thread" : "too many connections", c->peer);
            close(fd);
            free(c);
        }
    }
    return NULL;
}

/* ---- receiving threads ------------------------------------------------------------- */

/* Receive exactly len bytes. Returns 0, 1 on EOF before the first byte (when eof_ok),
 * or -1 (error, EOF inside, timeout past deadline_ns, stop) with *err set (0 for EOF).
 * `progress` (may be NULL) gets payload bytes added as they arrive. */
static int amdt_recv_full(amdt_receiver *r, amdt_link *l, uint8_t *buf, size_t len,
                          uint64_t deadline_ns, int eof_ok, amdt_stage *progress, int *err,
                          size_t *got_out)
{
    size_t got = 0;
    int rc = 0;
    *err = 0;
    while (got < len) {
        if (amdt_stopping(&r->stop)) {
            *err = ECANCELED;
            rc = -1;
            break;
        }
        ssize_t n = amdt_link_recv(l, buf + got, len - got);
        if (n > 0) {
            got += (size_t)n;
            if (progress != NULL)
                amdt_stage_add_bytes(progress, (uint64_t)n);
            continue;
        }
        if (n == 0) {
            rc = (got == 0 && eof_ok) ? 1 : -1;
            break;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            /* SO_RCVTIMEO expired: re-check the stop flag and the deadline */
            if (deadline_ns != 0 && amdt_now_ns() >= deadline_ns) {
                *err = ETIMEDOUT;
                rc = -1;
                break;
            }
            continue;
        }
        *err = errno;
        rc = -1;
        break;
    }
    if (got_out != NULL)
        *got_out = got;
    return rc;
}

/* Compare in constant time (no early exit on the first differing byte). */
static int amdt_token_eq(const uint8_t *a, const uint8_t *b, size_t len)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < len; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

/* Check a frame header against the file table. Returns 0 or -1 with msg set. */
static int amdt_validate_frame(amdt_receiver *r, const amdt_frame_hdr *h, char *msg, size_t len)
{
    if (h->magic != AMDT_FRAME_MAGIC) {
        snprintf(msg, len, "bad frame magic 0x%08x", h->magic);
        return -1;
    }
    if (h->flags != 0) {
        snprintf(msg, len, "unsupported frame flags 0x%x", h->flags);
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    amdt_rfile *f = amdt_map_get(&r->files, h->file_id);
    uint64_t size = f != NULL ? f->size : 0;
    pthread_mutex_unlock(&r->mu);
    if (f == NULL) {
        snprintf(msg, len, "unknown file id %u", h->file_id);
        return -1;
    }
    if (h->offset % r->chunk_size != 0 || h->offset >= size) {
        snprintf(msg, len, "bad offset %llu for file %u (size %llu, chunk %llu)",
                 (unsigned long long)h->offset, h->file_id, (unsigned long long)size,
                 (unsigned long long)r->chunk_size);
        return -1;
    }
    uint64_t want = size - h->offset < r->chunk_size ? size - h->offset : r->chunk_size;
    if (h->length == 0 || h->length != want) {
        snprintf(msg, len, "bad length %u at offset %llu of file %u (expected %llu)", h->length,
                 (unsigned long long)h->offset, h->file_id, (unsigned long long)want);
        return -1;
    }
    return 0;
}

/* The start of a data connection: the TLS handshake (an encrypted receiver) and the hello with
 * the session's token, within AMDT_HELLO_TIMEOUT_MS. 0 when the peer may send frames; -1 when it
 * was refused (counted and reported) or the receiver stops. */
static int amdt_conn_hello(amdt_receiver *r, amdt_conn *c, amdt_link *link)
{
    int err = 0;
    char ebuf[128];
    uint8_t hello[AMDT_HELLO_LEN];
    uint64_t deadline = amdt_now_ns() + (uint64_t)AMDT_HELLO_TIMEOUT_MS * 1000000ULL;

    if (r->tls != NULL) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = AMDT_WAIT_MS * 1000};
        setsockopt(link->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* the handshake writes */
        err = amdt_tls_start(r->tls, link, &r->stop, deadline);
        if (err != 0) {
            if (err != ECANCELED) {
                __atomic_fetch_add(&r->connections_rejected, 1, __ATOMIC_RELAXED);
                amdt_event_push(&r->events, AMDT_EV_CONN_REJECTED, 0, 0, 0, err,
                                "TLS handshake with %s failed: %s", c->peer,
                                err == EPROTO ? "wrong key or not TLS"
                                              : amdt_strerror(err, ebuf, sizeof(ebuf)));
            }
            return -1;
        }
    }
    if (amdt_recv_full(r, link, hello, sizeof(hello), deadline, 0, NULL, &err, NULL) != 0) {
        if (err != ECANCELED) {
            __atomic_fetch_add(&r->connections_rejected, 1, __ATOMIC_RELAXED);
            amdt_event_push(&r->events, AMDT_EV_CONN_REJECTED, 0, 0, 0, err, "no hello from %s: %s",
                            c->peer,
                            err ? amdt_strerror(err, ebuf, sizeof(ebuf)) : "connection closed");
        }
        return -1;
    }
    int magic_ok = memcmp(hello, AMDT_HELLO_MAGIC, AMDT_HELLO_MAGIC_LEN) == 0;
    int token_ok = amdt_token_eq(hello + AMDT_HELLO_MAGIC_LEN, r->token, AMDT_TOKEN_LEN);
    if (!magic_ok || !token_ok) {
        __atomic_fetch_add(&r->connections_rejected, 1, __ATOMIC_RELAXED);
        amdt_event_push(&r->events, AMDT_EV_CONN_REJECTED, 0, 0, 0, 0, "%s from %s",
                        magic_ok ? "bad token" : "bad hello magic", c->peer);
        return -1;
    }
    return 0;
}

/* Receive one frame into a slot of the staging buffer and queue it for the writers. 0 for the
 * next frame; 1 at a clean close between frames; -1 when the connection ends or breaks (the
 * partial chunk is dropped; the event says why) or the receiver stops. */
static int amdt_conn_frame(amdt_receiver *r, amdt_worker *w, amdt_conn *c, amdt_link *link)
{
    uint8_t raw[AMDT_FRAME_HDR_LEN];
    amdt_frame_hdr h;
    size_t got = 0;
    int err = 0;
    char ebuf[128], msg[AMDT_EVENT_MSG];

    /* Waiting for the next frame header: the peer decides, so it is idle time. */
    amdt_worker_set_state(w, AMDT_STATE_IDLE);
    int rc = amdt_recv_full(r, link, raw, sizeof(raw), 0, 1, NULL, &err, &got);
    if (rc == 1)
        return 1; /* clean close at a frame boundary */
    if (rc != 0) {
        if (err != ECANCELED)
            amdt_event_push(&r->events, AMDT_EV_CONN_ERROR, 0, 0, 0, err,
                            "connection from %s ended inside a frame header: %s", c->peer,
                            err ? amdt_strerror(err, ebuf, sizeof(ebuf)) : "connection closed");
        return -1;
    }
    amdt_frame_decode(&h, raw);
    if (amdt_validate_frame(r, &h, msg, sizeof(msg)) != 0) {
        __atomic_fetch_add(&r->protocol_errors, 1, __ATOMIC_RELAXED);
        amdt_event_push(&r->events, AMDT_EV_PROTOCOL_ERROR, h.file_id, h.offset, h.length, 0,
                        "%s from %s", msg, c->peer);
        return -1;
    }
    /* Waiting for room in the receiver staging buffer is the recv stage's wait time, and so
     * is a receiving limit's pace (the daemon's fair share: each piece of a chunk is read at
     * the end of its turn on the session's receiving clock, and TCP's flow control slows the
     * sender). */
    amdt_worker_set_state(w, AMDT_STATE_WAIT);
    amdt_slot *slot = NULL;
    while (slot == NULL && !amdt_stopping(&r->stop))
        slot = amdt_pool_get(&r->pool, h.length, AMDT_WAIT_MS);
    if (slot == NULL)
        return -1;

    amdt_worker_set_state(w, AMDT_STATE_BUSY);
    slot->file = NULL;
    slot->file_id = h.file_id;
    slot->offset = h.offset;
    slot->hash = h.hash;
    amdt_hstate hs;
    amdt_hash_reset(&hs);
    got = 0;
    while (got < h.length) {
        size_t want = h.length - got < AMDT_PIECE ? h.length - got : AMDT_PIECE, piece = 0;
        if (amdt_stage_throttled(&r->recv)) { /* each piece waits for its turn */
            amdt_worker_set_state(w, AMDT_STATE_WAIT);
            amdt_throttle_wait(w, amdt_throttle_reserve(w, want));
            amdt_worker_set_state(w, AMDT_STATE_BUSY);
        }
        rc = amdt_recv_full(r, link, slot->data + got, want, 0, 0, &r->recv, &err, &piece);
        if (rc != 0) {
            got += piece;
            break;
        }
        amdt_hash_update(&hs, slot->data + got, want);
        got += want;
    }
    slot->payload_hash = amdt_hash_digest(&hs);
    if (rc != 0) {
        amdt_pool_put(&r->pool, slot); /* the partial chunk is dropped */
        if (err != ECANCELED)
            amdt_event_push(&r->events, AMDT_EV_CONN_ERROR, h.file_id, h.offset, h.length, err,
                            "connection from %s ended inside a frame (%zu of %u bytes): %s",
                            c->peer, got, h.length,
                            err ? amdt_strerror(err, ebuf, sizeof(ebuf)) : "connection closed");
        return -1;
    }
    amdt_pool_push(&r->pool, slot);
    return 0;
}

static void amdt_conn_body(amdt_worker *w)
{
    amdt_receiver *r = w->stage->owner;
    amdt_conn *c = w->ctx;
    int fd = c->fd, authed = 0;
    amdt_link link = {.fd = fd, .ssl = NULL};

    amdt_worker_set_sock(w, fd);
    struct timeval tv = {.tv_sec = 0, .tv_usec = AMDT_WAIT_MS * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    amdt_worker_set_state(w, AMDT_STATE_IDLE);
    if (amdt_conn_hello(r, c, &link) != 0)
        goto out;
    authed = 1;
    __atomic_fetch_add(&r->connections, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&r->connections_total, 1, __ATOMIC_RELAXED);
    amdt_debug("recv[%d]: connection from %s", w->index, c->peer);
    while (amdt_conn_frame(r, w, c, &link) == 0)
        ;

out:
    if (authed)
        __atomic_fetch_sub(&r->connections, 1, __ATOMIC_RELAXED);
    amdt_link_end_tls(&link); /* close_notify; the socket is closed just below */
    fd = amdt_worker_take_sock(w);
    if (fd >= 0)
        close(fd);
    free(c);
}

/* ---- write pool -------------------------------------------------------------------- */

/* Write a slot's chunk at its offset of fd: 0 or an errno. A throttled write (`paced`) reserves
 * the chunk and writes each AMDT_THROTTLE_STEP at the end of its share of the reserved time,
 * counting it once written; an unthrottled one writes the chunk in one go (the caller counts it
 * when done). */
static int amdt_write_chunk(amdt_receiver *r, amdt_worker *w, int fd, const amdt_slot *slot,
                            int paced)
{
    uint64_t off = slot->offset;
    uint32_t len = slot->length;
    size_t done = 0;
    amdt_pace pace = {0, 0, 0};
    if (paced)
        pace = amdt_throttle_reserve(w, len);
    while (done < len) {
        size_t end = len;
        if (paced) {
            end = len - done < AMDT_THROTTLE_STEP ? len : done + AMDT_THROTTLE_STEP;
            amdt_throttle_wait_share(w, pace, end, len);
        }
        size_t from = done;
        while (done < end) {
            ssize_t n = pwrite(fd, slot->data + done, end - done, (off_t)(off + done));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                int err = n < 0 ? errno : EIO;
                if (paced)
                    amdt_stage_add_bytes(&r->write, done - from);
                return err;
            }
            done += (size_t)n;
        }
        if (paced)
            amdt_stage_add_bytes(&r->write, done - from);
    }
    return 0;
}

/* Append the journal record of a written chunk: 0 or an errno (a torn record is EIO; the journal
 * reader skips it by its check). */
static int amdt_journal_append(int jfd, uint32_t len, uint64_t off, uint64_t payload_hash)
{
    uint8_t rec[AMDT_JOURNAL_REC_LEN];
    amdt_journal_encode(rec, len, off, payload_hash);
    ssize_t n;
    do {
        n = write(jfd, rec, sizeof(rec));
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno;
    return n != (ssize_t)sizeof(rec) ? EIO : 0;
}

static void amdt_writer_body(amdt_worker *w)
{
    amdt_receiver *r = w->stage->owner;
    char ebuf[128];

    while (!amdt_stage_should_exit(w)) {
        /* An empty write queue is the write stage's wait time. */
        amdt_worker_set_state(w, AMDT_STATE_WAIT);
        amdt_slot *slot = amdt_pool_pop(&r->pool, AMDT_WAIT_MS);
        if (slot == NULL)
            continue;

        amdt_worker_set_state(w, AMDT_STATE_BUSY);
        uint32_t id = slot->file_id;
        uint64_t off = slot->offset;
        uint32_t len = slot->length;

        uint64_t payload_hash = slot->payload_hash; /* computed as the payload came in */
        if ((payload_hash ^ amdt_frame_mix(id, off)) != slot->hash) {
            __atomic_fetch_add(&r->chunks_bad, 1, __ATOMIC_RELAXED);
            amdt_event_push(&r->events, AMDT_EV_CHUNK_BAD, id, off, len, 0, NULL);
            goto next;
        }

        pthread_mutex_lock(&r->mu);
        amdt_rfile *f = amdt_map_get(&r->files, id);
        if (f == NULL) {
            /* Removed after the frame was accepted. */
            pthread_mutex_unlock(&r->mu);
            __atomic_fetch_add(&r->chunks_orphaned, 1, __ATOMIC_RELAXED);
            goto next;
        }
        uint64_t idx = off / r->chunk_size;
        if (off >= f->size ||
            len != (f->size - off < r->chunk_size ? f->size - off : r->chunk_size)) {
            /* The id was removed and added again with another size since the frame came. */
            pthread_mutex_unlock(&r->mu);
            __atomic_fetch_add(&r->chunks_orphaned, 1, __ATOMIC_RELAXED);
            goto next;
        }
        if (amdt_bit_get(f->done, idx) || amdt_bit_get(f->claimed, idx)) {
            pthread_mutex_unlock(&r->mu);
            __atomic_fetch_add(&r->chunks_duplicate, 1, __ATOMIC_RELAXED);
            goto next;
        }
        amdt_bit_set(f->claimed, idx);
        f->inflight++;
        int fd = f->fd, jfd = f->jfd;
        pthread_mutex_unlock(&r->mu);

        /* No lock held: the in-flight count keeps remove_file() waiting. */
        const char *what = "pwrite";
        int paced = amdt_stage_throttled(&r->write);
        int err = amdt_write_chunk(r, w, fd, slot, paced);
        if (err == 0 && __atomic_load_n(&r->write_behind, __ATOMIC_RELAXED))
            (void)sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE); /* a hint */
        if (err == 0 && jfd >= 0) {
            what = "journal write";
            err = amdt_journal_append(jfd, len, off, payload_hash);
        }

        pthread_mutex_lock(&r->mu);
        amdt_bit_clear(f->claimed, idx);
        int file_done = 0;
        if (err == 0) {
            amdt_bit_set(f->done, idx);
            f->nwritten++;
            file_done = f->nwritten == f->nchunks;
            /* Counted before the in-flight count drops: once remove_file() returns, the
             * statistics hold every chunk of the file they will ever count. */
            __atomic_fetch_add(&r->chunks_written, 1, __ATOMIC_RELAXED);
            if (!paced)
                amdt_stage_add_bytes(&r->write, len);
        }
        f->inflight--;
        if (f->removed && f->inflight == 0)
            pthread_cond_broadcast(&r->cv_removed);
        pthread_mutex_unlock(&r->mu);
        /* f may be freed by remove_file() from here on. */

        if (err != 0) {
            amdt_event_push(&r->events, AMDT_EV_WRITE_ERROR, id, off, len, err, "%s: %s", what,
                            amdt_strerror(err, ebuf, sizeof(ebuf)));
        } else if (file_done) {
            amdt_event_push(&r->events, AMDT_EV_FILE_DONE, id, 0, 0, 0, NULL);
        }
    next:
        amdt_pool_put(&r->pool, slot);
    }
}

/* ---- the local link (see receiver.h) ------------------------------------------------ */

void amdt_receiver_local_attach(amdt_receiver *r, int delta)
{
    if (delta > 0) {
        __atomic_fetch_add(&r->connections, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&r->connections_total, 1, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_sub(&r->connections, 1, __ATOMIC_RELAXED);
    }
}

int amdt_receiver_local_deliver(amdt_receiver *r, amdt_worker *w, const amdt_frame_hdr *h,
                                uint8_t **data, uint64_t payload_hash)
{
    char msg[AMDT_EVENT_MSG];
    int rc = 0;
    amdt_slot *slot = NULL;

    /* Announce the use before looking at the stop flag; close() sets the flag before it waits
     * for the count to drop to zero (both sides fenced), so the pool outlives every use. */
    __atomic_fetch_add(&r->local_users, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (amdt_stopping(&r->stop)) {
        rc = ECANCELED;
        goto out;
    }
    if (amdt_validate_frame(r, h, msg, sizeof(msg)) != 0) {
        __atomic_fetch_add(&r->protocol_errors, 1, __ATOMIC_RELAXED);
        amdt_event_push(&r->events, AMDT_EV_PROTOCOL_ERROR, h->file_id, h->offset, h->length, 0,
                        "%s from the local sender", msg);
        rc = EPROTO;
        goto out;
    }
    /* Waiting for room in the receiver staging buffer: the sender thread is held up downstream,
     * as a connection's thread is when its socket is full. */
    amdt_worker_set_state(w, AMDT_STATE_WAIT);
    while (slot == NULL && !amdt_stopping(&r->stop) && !amdt_stopping(w->stage->stop))
        slot = amdt_pool_get(&r->pool, h->length, AMDT_WAIT_MS);
    amdt_worker_set_state(w, AMDT_STATE_BUSY);
    if (slot == NULL) {
        rc = ECANCELED;
        goto out;
    }
    uint8_t *empty = slot->data;
    slot->data = *data;
    *data = empty;
    slot->file = NULL;
    slot->file_id = h->file_id;
    slot->offset = h->offset;
    slot->hash = h->hash;
    slot->payload_hash = payload_hash;
    amdt_stage_add_bytes(&r->recv, h->length);
    amdt_pool_push(&r->pool, slot);
out:
    __atomic_fetch_sub(&r->local_users, 1, __ATOMIC_SEQ_CST);
    return rc;
}

/* ---- control ----------------------------------------------------------------------- */

int amdt_receiver_set_threads(amdt_receiver *r, int nwrite, int *old_write)
{
    int rc = amdt_stage_set_target(&r->write, nwrite, old_write);
    amdt_pool_wake(&r->pool);
    return rc;
}

void amdt_receiver_set_write_behind(amdt_receiver *r, int on)
{
    __atomic_store_n(&r->write_behind, on ? 1 : 0, __ATOMIC_RELAXED);
}

uint64_t amdt_receiver_set_memory(amdt_receiver *r, uint64_t memory_bytes)
{
    pthread_mutex_lock(&r->pool.mu);
    uint64_t old = (uint64_t)r->pool.slots_max * r->pool.chunk_size;
    pthread_mutex_unlock(&r->pool.mu);
    amdt_pool_set_max(&r->pool, (size_t)(memory_bytes / r->pool.chunk_size));
    return old;
}

void amdt_receiver_get_stats(amdt_receiver *r, amdt_receiver_stats *out)
{
    out->time_ns = amdt_now_ns();
    amdt_stage_get_stats(&r->recv, &out->recv);
    out->recv.target = out->recv.live; /* receiving threads follow the connections */
    amdt_stage_get_stats(&r->write, &out->write);
    amdt_pool_get_stats(&r->pool, &out->buffer);
    out->chunks_written = __atomic_load_n(&r->chunks_written, __ATOMIC_RELAXED);
    out->chunks_bad = __atomic_load_n(&r->chunks_bad, __ATOMIC_RELAXED);
    out->chunks_duplicate = __atomic_load_n(&r->chunks_duplicate, __ATOMIC_RELAXED);
    out->chunks_orphaned = __atomic_load_n(&r->chunks_orphaned, __ATOMIC_RELAXED);
    out->connections = __atomic_load_n(&r->connections, __ATOMIC_RELAXED);
    out->connections_total = __atomic_load_n(&r->connections_total, __ATOMIC_RELAXED);
    out->connections_rejected = __atomic_load_n(&r->connections_rejected, __ATOMIC_RELAXED);
    out->protocol_errors = __atomic_load_n(&r->protocol_errors, __ATOMIC_RELAXED);
}

void amdt_receiver_close(amdt_receiver *r)
{
    if (r->closed)
        return;
    r->closed = 1;
    amdt_set_stop(&r->stop);
    /* Wake the accept thread's poll() now instead of at its next timeout (AMDT_WAIT_MS): on
     * Linux, shutdown() of a listening socket makes a waiting poll() return and accept() fail. */
    if (r->lsock >= 0)
        shutdown(r->lsock, SHUT_RDWR);
    /* The accept thread first, so no receiving thread starts after the join below. */
    if (r->accept_started) {
        pthread_join(r->accept_tid, NULL);
        r->accept_started = 0;
    }
    if (r->lsock >= 0) {
        close(r->lsock);
        r->lsock = -1;
    }
    amdt_pool_wake(&r->pool);
    amdt_stage_shutdown_socks(&r->recv);
    amdt_stage_join_all(&r->recv);
    amdt_stage_join_all(&r->write);
    pthread_mutex_lock(&r->mu);
    pthread_cond_broadcast(&r->cv_removed);
    pthread_mutex_unlock(&r->mu);
    /* A local sender's thread may be handing over a chunk: it sees the stop flag within one
     * pool wait (AMDT_WAIT_MS) and gives up; its slot memory must stay until then. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    while (__atomic_load_n(&r->local_users, __ATOMIC_SEQ_CST) > 0) {
        amdt_pool_wake(&r->pool);
        amdt_sleep_until(amdt_now_ns() + 1000000ULL, NULL, NULL, 0);
    }
    amdt_pool_release(&r->pool);
    amdt_debug("receiver: closed");
}

void amdt_receiver_free(amdt_receiver *r)
{
    if (r == NULL)
        return;
    amdt_receiver_close(r);
    for (size_t i = 0; i < r->files.cap; i++)
        if (amdt_map_live(&r->files, i))
            amdt_rfile_free(r->files.vals[i]);
    amdt_map_free(&r->files);
    amdt_stage_destroy(&r->write);
    amdt_stage_destroy(&r->recv);
    amdt_pool_destroy(&r->pool);
    amdt_events_free(&r->events);
    pthread_cond_destroy(&r->cv_removed);
    pthread_mutex_destroy(&r->mu);
    amdt_tls_free(r->tls);
    free(r);
}
