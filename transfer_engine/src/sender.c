/* Sender: read pool, sender staging buffer and network pool (see sender.h). */
#include "sender.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "hash.h"
#include "tcpinfo.h"
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "wire.h"

#define AMDT_CONNECT_TIMEOUT_MS 5000
#define AMDT_BACKOFF_MIN_MS 100
#define AMDT_BACKOFF_MAX_MS 2000
/* Chunks are read and hashed in pieces of this size, so each piece is hashed while it is still
 * in the CPU cache; in zero-copy mode a piece buffer of this size is all the memory a reader
 * uses. */
#define AMDT_PIECE (128 * 1024)

typedef struct amdt_ticket {
    amdt_sfile *f;
    uint64_t offset;
    uint32_t length;
} amdt_ticket;

static void amdt_reader_body(amdt_worker *w);
static void amdt_net_body(amdt_worker *w);

/* ---- construction ------------------------------------------------------------------ */

/* The configuration's limits: 0, or -1 with the message in err. */
static int amdt_sender_check(const amdt_sender_cfg *cfg, char *err, size_t errlen)
{
    if (amdt_check_engine_cfg(cfg->chunk_size, cfg->memory_bytes, cfg->max_threads, err, errlen) !=
        0)
        return -1;
    if (cfg->local != NULL && cfg->tls_key != NULL) {
        snprintf(err, errlen, "the local link carries no TLS (both ends are in this process)");
        return -1;
    }
    if (cfg->local != NULL && cfg->local->chunk_size != cfg->chunk_size) {
        snprintf(err, errlen, "chunk_size %llu differs from the local receiver's %llu",
                 (unsigned long long)cfg->chunk_size, (unsigned long long)cfg->local->chunk_size);
        return -1;
    }
    if (strlen(cfg->host) >= sizeof(((amdt_sender *)NULL)->host)) {
        snprintf(err, errlen, "host name too long");
        return -1;
    }
    return 0;
}

/* The receiver's address (s->addr; none on the local link): 0, or -1 with the message in err. */
static int amdt_sender_resolve(amdt_sender *s, const amdt_sender_cfg *cfg, char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char portstr[16];

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(portstr, sizeof(portstr), "%d", cfg->port);
    int gai = s->local != NULL ? 0 : getaddrinfo(cfg->host, portstr, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "resolve %s: %s", cfg->host, gai_strerror(gai));
        return -1;
    }
    if (res != NULL) {
        memcpy(&s->addr, res->ai_addr, res->ai_addrlen);
        s->addrlen = res->ai_addrlen;
        freeaddrinfo(res);
    }
    return 0;
}

amdt_sender *amdt_sender_new(const amdt_sender_cfg *cfg, char *err, size_t errlen)
{
    amdt_sender *s = NULL;
    int have_mu = 0, have_cv = 0, have_map = 0, have_pool = 0, have_read = 0, have_net = 0;
    int have_events = 0;

    if (amdt_sender_check(cfg, err, errlen) != 0)
        goto error;

    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        goto error;
    }
    snprintf(s->host, sizeof(s->host), "%s", cfg->host);
    s->port = cfg->port;
    memcpy(s->token, cfg->token, AMDT_TOKEN_LEN);
    s->chunk_size = cfg->chunk_size;
    s->sndbuf = cfg->sndbuf;
    s->fault_corrupt = cfg->fault_corrupt;
    s->files_at_once = cfg->files_at_once > 0 ? cfg->files_at_once : 0; /* 0: the thread counts */
    if (cfg->tls_key != NULL &&
        (s->tls = amdt_tls_new(0, cfg->tls_key, !cfg->tls_per_record, err, errlen)) == NULL)
        goto error;
    s->zerocopy = cfg->zerocopy;
    /* The local link hands the receiver the buffer a reader filled: chunks are staged as bytes. */
    s->local = cfg->local;
    if (s->local != NULL)
        s->zerocopy = 0;

    if (amdt_sender_resolve(s, cfg, err, errlen) != 0)
        goto error;

    if (pthread_mutex_init(&s->mu, NULL) != 0)
        goto error_sys;
    have_mu = 1;
    if (amdt_cond_init(&s->cv_work) != 0)
        goto error_sys;
    have_cv = 1;
    if (amdt_map_init(&s->files) != 0)
        goto error_sys;
    have_map = 1;
    if (amdt_events_init(&s->events) != 0)
        goto error_sys;
    have_events = 1;
    size_t slots = (size_t)(cfg->memory_bytes / cfg->chunk_size);
    if (amdt_pool_init(&s->pool, cfg->chunk_size, slots, !s->zerocopy, &s->stop) != 0)
        goto error_sys;
    have_pool = 1;
    if (amdt_stage_init(&s->read, "read", cfg->max_threads, amdt_reader_body, s, &s->stop) != 0)
        goto error_sys;
    have_read = 1;
    if (amdt_stage_init(&s->net, "net", cfg->max_threads, amdt_net_body, s, &s->stop) != 0)
        goto error_sys;
    have_net = 1;
    amdt_stage_set_throttle(&s->read, cfg->read_thread_bps, cfg->read_total_bps);
    amdt_stage_set_throttle(&s->net, cfg->net_thread_bps, cfg->net_total_bps);

    int rc = amdt_sender_set_threads(s, cfg->read_threads, cfg->net_threads, NULL, NULL);
    if (rc != 0) {
        errno = rc;
        goto error_sys;
    }
    amdt_debug("sender: %s:%d chunk %llu, %zu slots, %s", s->host, s->port,
               (unsigned long long)s->chunk_size, slots,
               s->local != NULL ? "local link"
               : !s->zerocopy   ? "copy"
               : s->tls != NULL ? "re-read + TLS"
                                : "sendfile");
    return s;

error_sys:
    snprintf(err, errlen, "sender set-up failed: %s", strerror(errno ? errno : ENOMEM));
    if (have_read || have_net) {
        amdt_set_stop(&s->stop);
        amdt_stage_join_all(&s->read);
        amdt_stage_join_all(&s->net);
    }
    if (have_net)
        amdt_stage_destroy(&s->net);
    if (have_read)
        amdt_stage_destroy(&s->read);
    if (have_pool)
        amdt_pool_destroy(&s->pool);
    if (have_events)
        amdt_events_free(&s->events);
    if (have_map)
        amdt_map_free(&s->files);
    if (have_cv)
        pthread_cond_destroy(&s->cv_work);
    if (have_mu)
        pthread_mutex_destroy(&s->mu);
error:
    if (s != NULL)
        amdt_tls_free(s->tls);
    free(s);
    return NULL;
}

/* ---- files and the read queue --------------------------------------------------------- */

static int amdt_check_chunk(const amdt_sender *s, uint64_t size, uint64_t offset, uint64_t length,
                            char *err, size_t errlen)
{
    if (offset % s->chunk_size != 0) {
        snprintf(err, errlen, "offset %llu is not a multiple of chunk_size %llu",
                 (unsigned long long)offset, (unsigned long long)s->chunk_size);
        return -1;
    }
    if (length == 0 || offset >= size || length > size - offset) {
        snprintf(err, errlen, "range (%llu, %llu) is empty or beyond the file size %llu",
                 (unsigned long long)offset, (unsigned long long)length, (unsigned long long)size);
        return -1;
    }
    if (length % s->chunk_size != 0 && offset + length != size) {
        snprintf(
            err, errlen,
            "range (%llu, %llu): length must be whole chunks unless it ends at the file size %llu",
            (unsigned long long)offset, (unsigned long long)length, (unsigned long long)size);
        return -1;
    }
    return 0;
}

static uint64_t amdt_nchunks(uint64_t length, uint64_t chunk)
{
    return (length + chunk - 1) / chunk;
}

int amdt_sender_add_file(amdt_sender *s, uint32_t id, const char *path, uint64_t size,
                         int64_t mtime_ns, const amdt_range *ranges, size_t nranges, char *err,
                         size_t errlen)
{
    amdt_sfile *f = NULL;
    uint64_t chunks = 0;
    int rc = -3;

    if (size == 0) {
        snprintf(err, errlen, "file %u has size 0 (empty files are created by the session layer)",
                 id);
        return -1;
    }
    for (size_t i = 0; i < nranges; i++) {
        if (amdt_check_chunk(s, size, ranges[i].offset, ranges[i].length, err, errlen) != 0)
            return -1;
        chunks += amdt_nchunks(ranges[i].length, s->chunk_size);
    }

    f = calloc(1, sizeof(*f));
    if (f == NULL)
        goto error;
    f->path = strdup(path);
    if (f->path == NULL)
        goto error;
    f->ranges = malloc((nranges ? nranges : 1) * sizeof(*f->ranges));
    if (f->ranges == NULL)
        goto error;
    if (nranges == 0) {
        /* No ranges given: the whole file. */
        f->ranges[0].offset = 0;
        f->ranges[0].length = size;
        nranges = 1;
        chunks = amdt_nchunks(size, s->chunk_size);
    } else {
        memcpy(f->ranges, ranges, nranges * sizeof(*ranges));
    }
    f->id = id;
    f->size = size;
    f->mtime_ns = mtime_ns;
    f->nranges = nranges;
    f->cursor_left = chunks;
    f->fd = -1;

    pthread_mutex_lock(&s->mu);
    if (amdt_map_get(&s->files, id) != NULL) {
        pthread_mutex_unlock(&s->mu);
        snprintf(err, errlen, "file id %u was already added", id);
        rc = -2;
        goto error;
    }
    if (amdt_map_put(&s->files, id, f) != 0) {
        pthread_mutex_unlock(&s->mu);
        goto error;
    }
    if (f->cursor_left > 0) {
        if (s->q_tail != NULL)
            s->q_tail->next = f;
        else
            s->q_head = f;
        s->q_tail = f;
        s->pending += f->cursor_left;
        pthread_cond_broadcast(&s->cv_work);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;

error:
    if (rc == -3)
        snprintf(err, errlen, "out of memory");
    if (f != NULL) {
        free(f->ranges);
        free(f->path);
        free(f);
    }
    return rc;
}

/* Queue a requeue entry. Caller holds s->mu. front=1 for chunks that were already taken. */
static int amdt_requeue_push_locked(amdt_sender *s, amdt_sfile *f, uint64_t offset, uint32_t length,
                                    int front)
{
    amdt_requeue *r = malloc(sizeof(*r));
    if (r == NULL)
        return -1;
    r->f = f;
    r->offset = offset;
    r->length = length;
    r->next = NULL;
    if (front) {
        r->next = s->rq_head;
        s->rq_head = r;
        if (s->rq_tail == NULL)
            s->rq_tail = r;
    } else {
        if (s->rq_tail != NULL)
            s->rq_tail->next = r;
        else
            s->rq_head = r;
        s->rq_tail = r;
    }
    f->requeued++;
    pthread_cond_signal(&s->cv_work);
    return 0;
}

int amdt_sender_requeue(amdt_sender *s, uint32_t id, uint64_t offset, uint64_t length, char *err,
                        size_t errlen)
{
    int rc;
    pthread_mutex_lock(&s->mu);
    amdt_sfile *f = amdt_map_get(&s->files, id);
    if (f == NULL) {
        snprintf(err, errlen, "unknown file id %u", id);
        rc = -1;
        goto done;
    }
    if (amdt_check_chunk(s, f->size, offset, length, err, errlen) != 0) {
        rc = -2;
        goto done;
    }
    if (length != (f->size - offset < s->chunk_size ? f->size - offset : s->chunk_size)) {
        snprintf(err, errlen, "(%llu, %llu) is not one chunk of file %u (size %llu)",
                 (unsigned long long)offset, (unsigned long long)length, id,
                 (unsigned long long)f->size);
        rc = -2;
        goto done;
    }
    if (f->failed) {
        rc = 0;
        goto done;
    }
    if (amdt_requeue_push_locked(s, f, offset, (uint32_t)length, 0) != 0) {
        snprintf(err, errlen, "out of memory");
        rc = -3;
        goto done;
    }
    s->pending++;
    __atomic_fetch_add(&s->chunks_requeued, 1, __ATOMIC_RELAXED);
    rc = 1;
done:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* The file to read the next chunk from: round robin over the first files of the queue (in
 * add order) that have chunks left, as many as the wider of the read and network stages has
 * threads, at most AMDT_FILES_AT_ONCE_MAX (amdt_sender_cfg.files_at_once=N: N), so that the chunks in
 * flight belong to several files and the receiver's write threads work on different files:
 * buffered writes to one file serialise on its inode lock, where a waiting writer spins and
 * burns the receiver's CPU. One thread per
 * stage keeps add order. Drops failed and exhausted files from the queue on the way. Caller
 * holds s->mu. */
static amdt_sfile *amdt_pick_file_locked(amdt_sender *s)
{
    amdt_sfile *prev = NULL, *f = s->q_head, *pick = NULL;
    int n = 0; /* live files seen */
    int width = s->files_at_once;
    if (width <= 0) {
        int nr = __atomic_load_n(&s->read.target, __ATOMIC_RELAXED);
        int nn = __atomic_load_n(&s->net.target, __ATOMIC_RELAXED);
        width = nr > nn ? nr : nn;
    }
    if (width > AMDT_FILES_AT_ONCE_MAX)
        width = AMDT_FILES_AT_ONCE_MAX; /* bounds the walk below (one per chunk, under s->mu) */
    while (f != NULL && (n < width || n == 0)) {
        amdt_sfile *next = f->next;
        if (f->failed || f->cursor_left == 0) {
            if (prev != NULL)
                prev->next = next;
            else
                s->q_head = next;
            if (s->q_tail == f)
                s->q_tail = prev;
            f->next = NULL;
        } else {
            if (pick == NULL || f->last_pick < pick->last_pick)
                pick = f; /* the least recently read (a new file: in add order) */
            n++;
            prev = f;
        }
        f = next;
    }
    if (pick != NULL)
        pick->last_pick = ++s->q_turn;
    return pick;
}

/* Next chunk to read: requeued chunks first, then the files being read (see
 * amdt_pick_file_locked). Caller holds s->mu. */
static int amdt_take_locked(amdt_sender *s, amdt_ticket *t)
{
    while (s->rq_head != NULL) {
        amdt_requeue *r = s->rq_head;
        s->rq_head = r->next;
        if (s->rq_head == NULL)
            s->rq_tail = NULL;
        amdt_sfile *f = r->f;
        f->requeued--;
        t->f = f;
        t->offset = r->offset;
        t->length = r->length;
        free(r);
        if (f->failed)
            continue; /* its pending count was dropped when it failed */
        f->readers++;
        return 1;
    }
    amdt_sfile *f = amdt_pick_file_locked(s);
    if (f != NULL) {
        amdt_range *r = &f->ranges[f->range_idx];
        uint64_t off = r->offset + f->range_pos;
        uint64_t end = r->offset + r->length;
        uint64_t len = end - off < s->chunk_size ? end - off : s->chunk_size;
        f->range_pos += len;
        if (f->range_pos >= r->length) {
            f->range_idx++;
            f->range_pos = 0;
        }
        f->cursor_left--; /* an exhausted file leaves the queue at the next pick */
        f->readers++;
        t->f = f;
        t->offset = off;
        t->length = (uint32_t)len;
        return 1;
    }
    return 0;
}

/* Mark a file failed and drop its queued chunks. Caller holds s->mu. Returns 1 if it was
 * not failed before (the caller then reports the event). */
static int amdt_fail_file_locked(amdt_sender *s, amdt_sfile *f)
{
    if (f->failed)
        return 0;
    __atomic_store_n(&f->failed, 1, __ATOMIC_RELAXED);
    s->pending -= f->cursor_left + f->requeued;
    f->cursor_left = 0;
    s->files_failed++;
    return 1;
}

int amdt_sender_cancel_file(amdt_sender *s, uint32_t id)
{
    int fd = -1;
    pthread_mutex_lock(&s->mu);
    amdt_sfile *f = amdt_map_get(&s->files, id);
    if (f == NULL) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (amdt_fail_file_locked(s, f))
        s->files_failed--; /* cancelled on request: not a failure of this engine */
    if (f->readers == 0 && f->senders == 0 && f->fd >= 0) {
        fd = f->fd;
        f->fd = -1;
    }
    pthread_mutex_unlock(&s->mu);
    if (fd >= 0)
        close(fd);
    return 0;
}

/* The file's fd, if nothing needs it any more (no reader holds a chunk, no staged slot will
 * sendfile() from it, nothing left to read). Caller holds s->mu. Returns the fd to close
 * (outside the lock) or -1. */
static int amdt_fd_unused_locked(amdt_sfile *f)
{
    if (f->readers == 0 && f->senders == 0 && f->fd >= 0 &&
        (f->failed || (f->cursor_left == 0 && f->requeued == 0))) {
        int fd = f->fd;
        f->fd = -1;
        return fd;
    }
    return -1;
}

/* A reader is done with its ticket. Caller holds s->mu; returns an fd to close or -1. */
static int amdt_release_ticket_locked(amdt_sfile *f)
{
    f->readers--;
    return amdt_fd_unused_locked(f);
}

/* A network thread is done with a zero-copy slot of f. Caller holds s->mu; returns an fd to
 * close or -1. */
static int amdt_release_sender_locked(amdt_sfile *f)
{
    f->senders--;
    return amdt_fd_unused_locked(f);
}

/* ---- read pool --------------------------------------------------------------------- */

/* Read and hash one chunk piece by piece, each piece hashed right after its pread while it is
 * still in the CPU cache: into `dst` (advance = 1: the slot, copy mode) or through one
 * AMDT_PIECE buffer (advance = 0: zero-copy mode, the bytes stay in the page cache for
 * sendfile). `paced` (a throttled read stage's worker, else NULL): the chunk is reserved on the
 * throttle's clocks and each AMDT_THROTTLE_STEP is read once its share of the reserved window
 * has passed, and counted once read. Returns the bytes read (short at end of file), or -1 with
 * errno. */
static ssize_t amdt_read_hash(amdt_worker *paced, int fd, uint8_t *dst, int advance,
                              uint64_t offset, uint32_t length, uint64_t *hash)
{
    amdt_hstate hs;
    size_t got = 0, step_end = 0, counted = 0;
    amdt_pace pace = {0, 0, 0};
    if (paced != NULL)
        pace = amdt_throttle_reserve(paced, length);
    amdt_hash_reset(&hs);
    while (got < length) {
        if (paced != NULL && got == step_end) {
            size_t step = length - got < AMDT_THROTTLE_STEP ? length - got : AMDT_THROTTLE_STEP;
            step_end = got + step;
            amdt_throttle_wait_share(paced, pace, step_end, length);
        }
        size_t want = length - got < AMDT_PIECE ? length - got : AMDT_PIECE;
        if (paced != NULL && want > step_end - got)
            want = step_end - got;
        uint8_t *p = advance ? dst + got : dst;
        size_t have = 0;
        while (have < want) {
            ssize_t n = pread(fd, p + have, want - have, (off_t)(offset + got + have));
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                return -1;
            }
            if (n == 0)
                break;
            have += (size_t)n;
        }
        amdt_hash_update(&hs, p, have);
        got += have;
        if (paced != NULL && (got == step_end || have < want)) {
            amdt_stage_add_bytes(paced->stage, got - counted);
            counted = got;
        }
        if (have < want)
            break; /* end of file: a short read */
    }
    *hash = amdt_hash_digest(&hs);
    return (ssize_t)got;
}

/* Read, check and hash one chunk (see amdt_read_hash). On failure the file is marked failed
 * (with an event) and 0 is returned. Runs without any lock. */
static int amdt_read_chunk(amdt_sender *s, const amdt_ticket *t, amdt_slot *slot, uint8_t *piece,
                           amdt_worker *paced)
{
    amdt_sfile *f = t->f;
    char ebuf[128], msg[AMDT_EVENT_MSG];
    int err = 0;
    size_t got = 0;
    struct stat st;

    pthread_mutex_lock(&s->mu);
    int fd = f->fd;
    pthread_mutex_unlock(&s->mu);
    if (fd < 0) {
        int nfd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0) {
            err = errno;
            snprintf(msg, sizeof(msg), "open: %s", amdt_strerror(err, ebuf, sizeof(ebuf)));
            goto fail;
        }
        if (f->size > 8 * AMDT_PIECE)
            posix_fadvise(nfd, 0, 0, POSIX_FADV_SEQUENTIAL); /* a larger read-ahead on disks */
        pthread_mutex_lock(&s->mu);
        if (f->fd < 0) {
            f->fd = nfd;
            nfd = -1;
        }
        fd = f->fd;
        pthread_mutex_unlock(&s->mu);
        if (nfd >= 0)
            close(nfd); /* another reader opened it first */
    }

    uint64_t hash = 0;
    ssize_t nread = s->zerocopy
                        ? amdt_read_hash(paced, fd, piece, 0, t->offset, t->length, &hash)
                        : amdt_read_hash(paced, fd, slot->data, 1, t->offset, t->length, &hash);
    if (nread < 0) {
        err = errno;
        snprintf(msg, sizeof(msg), "read: %s", amdt_strerror(err, ebuf, sizeof(ebuf)));
        goto fail;
    }
    got = (size_t)nread;
    if (fstat(fd, &st) != 0) {
        err = errno;
        snprintf(msg, sizeof(msg), "fstat: %s", amdt_strerror(err, ebuf, sizeof(ebuf)));
        goto fail;
    }
    int64_t mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    if ((uint64_t)st.st_size != f->size) {
        snprintf(msg, sizeof(msg), "changed during read: size %llu -> %lld",
                 (unsigned long long)f->size, (long long)st.st_size);
        goto fail;
    }
    if (mtime_ns != f->mtime_ns) {
        snprintf(msg, sizeof(msg), "changed during read: mtime_ns %lld -> %lld",
                 (long long)f->mtime_ns, (long long)mtime_ns);
        goto fail;
    }
    /* The path must still name the inode being read (a file renamed over the source while it
     * is read is a change too), and every open must find the inode of the first one. */
    struct stat pst;
    if (stat(f->path, &pst) != 0 || pst.st_ino != st.st_ino || pst.st_dev != st.st_dev) {
        snprintf(msg, sizeof(msg), "changed during read: replaced or removed");
        goto fail;
    }
    pthread_mutex_lock(&s->mu);
    int same = 1;
    if (!f->have_ino) {
        f->have_ino = 1;
        f->dev = st.st_dev;
        f->ino = st.st_ino;
    } else {
        same = f->dev == st.st_dev && f->ino == st.st_ino;
    }
    pthread_mutex_unlock(&s->mu);
    if (!same) {
        snprintf(msg, sizeof(msg), "changed during read: replaced by another file");
        goto fail;
    }
    if (got < t->length) {
        snprintf(msg, sizeof(msg), "short read at offset %llu: %zu of %u bytes",
                 (unsigned long long)t->offset, got, t->length);
        goto fail;
    }

    slot->file = f;
    slot->fd = s->zerocopy ? fd : -1; /* kept open by f->senders (amdt_reader_body) */
    slot->file_id = f->id;
    slot->offset = t->offset;
    slot->length = t->length;
    slot->hash = hash;
    return 1;

fail:
    pthread_mutex_lock(&s->mu);
    int first = amdt_fail_file_locked(s, f);
    pthread_mutex_unlock(&s->mu);
    if (first)
        amdt_event_push(&s->events, AMDT_EV_FILE_ERROR, f->id, t->offset, t->length, err, "%s",
                        msg);
    return 0;
}

static void amdt_reader_body(amdt_worker *w)
{
    amdt_sender *s = w->stage->owner;
    uint8_t *piece = NULL;

    if (s->zerocopy && posix_memalign((void **)&piece, 4096, AMDT_PIECE) != 0) {
        amdt_event_push(&s->events, AMDT_EV_CONN_ERROR, 0, 0, 0, ENOMEM,
                        "read thread: out of memory for its buffer");
        return;
    }
    while (!amdt_stage_should_exit(w)) {
        amdt_ticket t;
        amdt_slot *slot = NULL;

        amdt_worker_set_state(w, AMDT_STATE_IDLE);
        pthread_mutex_lock(&s->mu);
        if (!amdt_take_locked(s, &t)) {
            amdt_cond_wait_ms(&s->cv_work, &s->mu, AMDT_WAIT_MS);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);

        /* Waiting for room in the staging buffer is the read stage's wait time. */
        amdt_worker_set_state(w, AMDT_STATE_WAIT);
        while (slot == NULL) {
            slot = amdt_pool_get(&s->pool, t.length, AMDT_WAIT_MS);
            if (slot == NULL && amdt_stage_should_exit(w))
                break;
        }
        if (slot == NULL) {
            /* Asked to exit while holding a chunk: hand it back, first in line. */
            pthread_mutex_lock(&s->mu);
            int fd = amdt_release_ticket_locked(t.f);
            if (t.f->failed) {
                s->pending--;
            } else if (amdt_requeue_push_locked(s, t.f, t.offset, t.length, 1) != 0) {
                s->pending--; /* out of memory: the session's missing() check finds it */
                amdt_debug("read: lost chunk %u@%llu (out of memory)", t.f->id,
                           (unsigned long long)t.offset);
            }
            pthread_mutex_unlock(&s->mu);
            if (fd >= 0)
                close(fd);
            break;
        }

        amdt_worker_set_state(w, AMDT_STATE_BUSY);
        /* A throttled read reserves the chunk and reads each step at the end of its share of
         * the reserved time (the emulated device delivers it then, so bytes are counted at the
         * throttled rate from the first one), counting it once read; an unthrottled one counts
         * the chunk once it is read and checked. */
        amdt_worker *paced = amdt_stage_throttled(&s->read) ? w : NULL;
        int ok = amdt_read_chunk(s, &t, slot, piece, paced);
        if (ok && paced == NULL)
            amdt_stage_add_bytes(&s->read, t.length);

        pthread_mutex_lock(&s->mu);
        if (t.f->failed)
            ok = 0;
        if (ok && s->zerocopy)
            t.f->senders++; /* the staged slot keeps the fd open until it is sent */
        int fd = amdt_release_ticket_locked(t.f);
        if (!ok)
            s->pending--;
        pthread_mutex_unlock(&s->mu);
        if (fd >= 0)
            close(fd);
        if (ok)
            amdt_pool_push(&s->pool, slot);
        else
            amdt_pool_put(&s->pool, slot);
    }
    free(piece);
}

/* ---- network pool ------------------------------------------------------------------ */

/* Sleep for the reconnect back-off, waking early when the thread should exit. */
static void amdt_backoff(amdt_worker *w, int fails)
{
    unsigned ms = AMDT_BACKOFF_MIN_MS << (fails < 5 ? fails : 5);
    if (ms > AMDT_BACKOFF_MAX_MS)
        ms = AMDT_BACKOFF_MAX_MS;
    uint64_t until = amdt_now_ns() + (uint64_t)ms * 1000000ULL;
    while (amdt_now_ns() < until && !amdt_stage_should_exit(w)) {
        uint64_t next = amdt_now_ns() + (uint64_t)AMDT_WAIT_MS * 1000000ULL;
        amdt_sleep_until(next < until ? next : until, w->stage->stop, NULL, 0);
    }
}

static int amdt_send_buf(amdt_sender *s, amdt_link *l, const uint8_t *buf, size_t len, int more,
                         int progress);

/* Connect, set options, start TLS when configured, send the hello. Returns 0 with l set
 * up, or an errno. */
static int amdt_connect(amdt_sender *s, amdt_worker *w, amdt_link *l)
{
    int err = 0;
    int fd = socket(s->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return errno;
    if (s->sndbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &s->sndbuf, sizeof(s->sndbuf));
    if (connect(fd, (struct sockaddr *)&s->addr, s->addrlen) != 0) {
        if (errno != EINPROGRESS) {
            err = errno;
            goto error;
        }
        uint64_t until = amdt_now_ns() + (uint64_t)AMDT_CONNECT_TIMEOUT_MS * 1000000ULL;
        for (;;) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int pr = poll(&pfd, 1, AMDT_WAIT_MS);
            if (pr > 0)
                break;
            if (pr < 0 && errno != EINTR) {
                err = errno;
                goto error;
            }
            if (amdt_stage_should_exit(w)) {
                err = ECANCELED;
                goto error;
            }
            if (amdt_now_ns() >= until) {
                err = ETIMEDOUT;
                goto error;
            }
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr != 0) {
            err = soerr;
            goto error;
        }
    }
    /* Back to blocking, with a send timeout so a stalled peer cannot hide the stop flag. */
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    struct timeval tv = {.tv_sec = 0, .tv_usec = AMDT_WAIT_MS * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    l->fd = fd;
    l->ssl = NULL;
    if (s->tls != NULL) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* the handshake reads */
        uint64_t until = amdt_now_ns() + (uint64_t)AMDT_CONNECT_TIMEOUT_MS * 1000000ULL;
        err = amdt_tls_start(s->tls, l, &s->stop, until);
        if (err != 0)
            goto error;
    }

    uint8_t hello[AMDT_HELLO_LEN];
    memcpy(hello, AMDT_HELLO_MAGIC, AMDT_HELLO_MAGIC_LEN);
    memcpy(hello + AMDT_HELLO_MAGIC_LEN, s->token, AMDT_TOKEN_LEN);
    err = amdt_send_buf(s, l, hello, sizeof(hello), 0, 0);
    if (err != 0)
        goto error;
    return 0;

error:
    amdt_link_end_tls(l);
    close(fd);
    l->fd = -1;
    return err;
}

/* The end of the payload step that begins at byte `done` of a `length`-byte chunk, once that
 * step's share of the chunk's reserved window (`pace`) has passed: a throttled network stage
 * sends, and counts, its bytes in AMDT_THROTTLE_STEP steps across the window, as a link delivers
 * bytes as it goes (see AMDT_THROTTLE_STEP). Unthrottled (no window): the whole rest at once. */
static size_t amdt_net_step(amdt_worker *w, amdt_pace pace, size_t done, size_t length)
{
    if (pace.until_ns == 0)
        return length;
    size_t end = length - done < AMDT_THROTTLE_STEP ? length : done + AMDT_THROTTLE_STEP;
    amdt_throttle_wait_share(w, pace, end, length);
    return end;
}

/* Send one frame from a slot holding the bytes: header + payload with sendmsg (copy mode),
 * counting payload bytes as they leave, in steps paced by `pace` (amdt_net_step). Returns 0 or
 * an errno. */
static int amdt_send_frame(amdt_sender *s, amdt_worker *w, amdt_pace pace, amdt_link *l,
                           const uint8_t *hdr, amdt_slot *slot)
{
    size_t hdr_left = AMDT_FRAME_HDR_LEN, pay_done = 0, step_end = 0;
    while (hdr_left > 0 || pay_done < slot->length) {
        if (amdt_stopping(&s->stop))
            return ECANCELED;
        if (pay_done == step_end && pay_done < slot->length)
            step_end = amdt_net_step(w, pace, pay_done, slot->length);
        ssize_t n = amdt_link_send2(l, hdr + AMDT_FRAME_HDR_LEN - hdr_left, hdr_left,
                                    slot->data + pay_done, step_end - pay_done);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return errno;
        }
        size_t left = (size_t)n;
        if (hdr_left > 0) {
            size_t h = left < hdr_left ? left : hdr_left;
            hdr_left -= h;
            left -= h;
        }
        pay_done += left;
        if (left > 0)
            amdt_stage_add_bytes(&s->net, left);
    }
    return 0;
}

/* Send all of buf: send() on a plain connection (more = 1 adds MSG_MORE: more of the frame
 * follows), SSL_write() records on an encrypted one. progress = 1: the bytes are payload
 * (counted as they leave). Returns 0 or an errno. */
static int amdt_send_buf(amdt_sender *s, amdt_link *l, const uint8_t *buf, size_t len, int more,
                         int progress)
{
    while (len > 0) {
        if (amdt_stopping(&s->stop))
            return ECANCELED;
        ssize_t n = l->ssl != NULL ? amdt_link_send(l, buf, len)
                                   : send(l->fd, buf, len, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue; /* SO_SNDTIMEO expired: re-check the stop flag */
            return errno;
        }
        buf += n;
        len -= (size_t)n;
        if (progress)
            amdt_stage_add_bytes(&s->net, (uint64_t)n);
    }
    return 0;
}

/* The rest of a zero-copy slot's payload, from `pos` on, read from the file into `buf`
 * (AMDT_PIECE bytes) and sent in steps paced by `pace`: the path of encrypted connections (TLS
 * encrypts in user space), of files sendfile() does not work on, and of the fault hook
 * (corrupt: flip the payload byte at length / 2, after hashing). A file that became shorter
 * than the chunk gives ENODATA. Returns 0 or an errno. */
static int amdt_send_file_copy(amdt_sender *s, amdt_worker *w, amdt_pace pace, amdt_link *l,
                               const amdt_slot *slot, size_t pos, uint8_t *buf, int corrupt)
{
    size_t step_end = pos;
    while (pos < slot->length) {
        if (pos == step_end)
            step_end = amdt_net_step(w, pace, pos, slot->length);
        size_t want = step_end - pos < AMDT_PIECE ? step_end - pos : AMDT_PIECE;
        ssize_t n = pread(slot->fd, buf, want, (off_t)(slot->offset + pos));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        if (n == 0)
            return ENODATA;
        size_t mid = slot->length / 2;
        if (corrupt && mid >= pos && mid < pos + (size_t)n)
            buf[mid - pos] ^= 0xFF;
        pos += (size_t)n;
        int err = amdt_send_buf(s, l, buf, (size_t)n, pos < slot->length, 1);
        if (err != 0)
            return err;
    }
    return 0;
}

/* Send one frame of a zero-copy slot: the header with MSG_MORE, then the payload straight
 * from the page cache with sendfile() (plain connections), counting payload bytes as they
 * leave, in steps paced by `pace` (amdt_net_step). *buf is the thread's piece buffer, allocated
 * on first need (TLS, fallback or fault hook). Returns 0 or an errno; ENODATA: the source file
 * is shorter than when the chunk was read. */
static int amdt_send_frame_file(amdt_sender *s, amdt_worker *w, amdt_pace pace, amdt_link *l,
                                const uint8_t *hdr, const amdt_slot *slot, uint8_t **buf,
                                int corrupt)
{
    int err = amdt_send_buf(s, l, hdr, AMDT_FRAME_HDR_LEN, 1, 0);
    if (err != 0)
        return err;
    off_t off = (off_t)slot->offset;
    size_t done = 0, step_end = 0;
    while (!corrupt && l->ssl == NULL && done < slot->length) {
        if (amdt_stopping(&s->stop))
            return ECANCELED;
        if (done == step_end)
            step_end = amdt_net_step(w, pace, done, slot->length);
        ssize_t n = sendfile(l->fd, slot->fd, &off, step_end - done);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue; /* SO_SNDTIMEO expired: re-check the stop flag */
            if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)
                break; /* this file system cannot splice: send the rest from a buffer */
            return errno;
        }
        if (n == 0)
            return ENODATA;
        done += (size_t)n;
        amdt_stage_add_bytes(&s->net, (uint64_t)n);
    }
    if (done == slot->length)
        return 0;
    if (*buf == NULL && posix_memalign((void **)buf, 4096, AMDT_PIECE) != 0) {
        *buf = NULL;
        return ENOMEM;
    }
    return amdt_send_file_copy(s, w, pace, l, slot, done, *buf, corrupt);
}

/* Take one unit from the fault-injection counter, if any is left. */
static int amdt_take_fault(amdt_sender *s)
{
    int n = __atomic_load_n(&s->fault_corrupt, __ATOMIC_RELAXED);
    while (n > 0) {
        if (__atomic_compare_exchange_n(&s->fault_corrupt, &n, n - 1, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

/* Unpublish the thread's socket, adding its TCP counters to the closed connections' totals in
 * the same critical section, so that the stats never see a connection twice or not at all. */
static int amdt_take_conn(amdt_sender *s, amdt_worker *w)
{
    pthread_mutex_lock(&s->net.mu);
    int fd = w->sock;
    w->sock = -1;
    if (fd >= 0)
        amdt_tcp_counters(fd, &s->tcp_segs_closed, &s->tcp_retrans_closed);
    pthread_mutex_unlock(&s->net.mu);
    return fd;
}

static void amdt_close_conn(amdt_sender *s, amdt_worker *w, amdt_link *l)
{
    int fd = amdt_take_conn(s, w);
    if (fd >= 0) {
        amdt_link_end_tls(l);  /* close_notify after the last complete frame */
        shutdown(fd, SHUT_WR); /* FIN */
        close(fd);
    }
    l->fd = -1;
    l->ssl = NULL;
}

/* The network thread is done with a slot: the chunk counts as sent (or dropped with its failed
 * file), or with requeue = 1 goes back to the readers first in line (its bytes may be bad). */
static void amdt_net_done(amdt_sender *s, amdt_slot *slot, int requeue)
{
    amdt_sfile *f = slot->file;
    int fd = -1;
    pthread_mutex_lock(&s->mu);
    if (!requeue || f->failed || amdt_requeue_push_locked(s, f, slot->offset, slot->length, 1) != 0)
        s->pending--;
    if (s->zerocopy)
        fd = amdt_release_sender_locked(f);
    pthread_mutex_unlock(&s->mu);
    if (fd >= 0)
        close(fd);
    amdt_pool_put(&s->pool, slot);
}

/* The next staged chunk to send, with its frame header in *h and its reservation on the stage's
 * throttle in *pace (sent in steps: amdt_net_step); NULL when none came within one wait (a chunk
 * of a failed file is dropped on the way). */
static amdt_slot *amdt_net_next(amdt_sender *s, amdt_worker *w, amdt_frame_hdr *h, amdt_pace *pace)
{
    amdt_worker_set_state(w, AMDT_STATE_WAIT);
    amdt_slot *slot = amdt_pool_pop(&s->pool, AMDT_WAIT_MS);
    if (slot == NULL)
        return NULL;
    amdt_sfile *f = slot->file;
    if (__atomic_load_n(&f->failed, __ATOMIC_RELAXED)) {
        amdt_net_done(s, slot, 0);
        return NULL;
    }
    amdt_worker_set_state(w, AMDT_STATE_BUSY);
    *pace = amdt_throttle_reserve(w, slot->length);
    *h = (amdt_frame_hdr){.magic = AMDT_FRAME_MAGIC,
                          .file_id = slot->file_id,
                          .offset = slot->offset,
                          .length = slot->length,
                          .flags = 0,
                          .hash = slot->hash ^ amdt_frame_mix(slot->file_id, slot->offset)};
    return slot;
}

/* The network thread of a local transfer (see receiver.h, "the local link"): each staged chunk
 * goes to the receiver in this process by handing over its buffer. The payload hash the
 * receiver's writer compares is the one the reader computed over this very buffer, piece by
 * piece right after each pread; the fault hook flips a byte after that and hashes the result,
 * as a receiver would hash a corrupted frame. */
static void amdt_net_body_local(amdt_worker *w)
{
    amdt_sender *s = w->stage->owner;
    amdt_receiver *r = s->local;
    int fails = 0;

    amdt_receiver_local_attach(r, 1);
    while (!amdt_stage_should_exit(w)) {
        amdt_frame_hdr h;
        amdt_pace pace;
        amdt_slot *slot = amdt_net_next(s, w, &h, &pace);
        if (slot == NULL)
            continue;
        /* A throttled link delivers the chunk in steps, counted as they pass; the buffer is
         * handed over once the last one has. */
        size_t paced = 0;
        while (pace.until_ns != 0 && paced < slot->length && !amdt_stopping(&s->stop)) {
            size_t end = amdt_net_step(w, pace, paced, slot->length);
            amdt_stage_add_bytes(&s->net, end - paced);
            paced = end;
        }
        uint64_t payload_hash = slot->hash;
        if (amdt_take_fault(s)) {
            __atomic_fetch_add(&s->frames_corrupted, 1, __ATOMIC_RELAXED);
            slot->data[slot->length / 2] ^= 0xFF;
            payload_hash = amdt_hash64(slot->data, slot->length);
        }
        int err = amdt_receiver_local_deliver(r, w, &h, &slot->data, payload_hash);
        if (err != 0) {
            amdt_net_done(s, slot, 1); /* back to the readers, first in line */
            if (amdt_stopping(&s->stop))
                break;
            /* The receiver closed, or refused the frame: back off as after a failed connection
             * rather than spin on the same chunk. */
            if (err == ECANCELED)
                amdt_event_push(&s->events, AMDT_EV_CONN_ERROR, 0, 0, 0, ECONNREFUSED,
                                "the local receiver is closed");
            amdt_worker_set_state(w, AMDT_STATE_IDLE);
            amdt_backoff(w, fails++);
            continue;
        }
        fails = 0;
        if (paced == 0)
            amdt_stage_add_bytes(&s->net, h.length);
        __atomic_fetch_add(&s->chunks_sent, 1, __ATOMIC_RELAXED);
        amdt_net_done(s, slot, 0);
    }
    amdt_receiver_local_attach(r, -1);
}

static void amdt_net_body(amdt_worker *w)
{
    amdt_sender *s = w->stage->owner;
    char ebuf[128];
    int fails = 0;
    uint8_t *buf = NULL; /* zero-copy fallback / fault hook buffer, allocated on first need */
    amdt_link link = {.fd = -1, .ssl = NULL}; /* this thread's connection (the socket is also
                                                 published in w->sock for close) */

    if (s->local != NULL) {
        amdt_net_body_local(w);
        return;
    }

    while (!amdt_stage_should_exit(w)) {
        if (link.fd < 0) {
            amdt_worker_set_state(w, AMDT_STATE_IDLE);
            int err = amdt_connect(s, w, &link);
            if (err != 0) {
                if (err != ECANCELED) {
                    amdt_event_push(&s->events, AMDT_EV_CONN_ERROR, 0, 0, 0, err,
                                    "connect %s:%d: %s", s->host, s->port,
                                    amdt_strerror(err, ebuf, sizeof(ebuf)));
                    amdt_backoff(w, fails++);
                }
                continue;
            }
            amdt_worker_set_sock(w, link.fd);
        }

        amdt_frame_hdr h;
        amdt_pace pace;
        amdt_slot *slot = amdt_net_next(s, w, &h, &pace);
        if (slot == NULL)
            continue;
        uint8_t hdr[AMDT_FRAME_HDR_LEN];
        amdt_frame_encode(hdr, &h);
        int corrupt = amdt_take_fault(s);
        if (corrupt)
            __atomic_fetch_add(&s->frames_corrupted, 1, __ATOMIC_RELAXED);
        int err;
        if (s->zerocopy) {
            err = amdt_send_frame_file(s, w, pace, &link, hdr, slot, &buf, corrupt);
        } else {
            if (corrupt)
                slot->data[slot->length / 2] ^= 0xFF; /* after hashing: corruption on the wire */
            err = amdt_send_frame(s, w, pace, &link, hdr, slot);
        }
        if (err != 0) {
            /* The chunk goes back to the readers: re-read, because the slot may be corrupted,
             * or the source changed under sendfile (ENODATA) and the re-read finds out. */
            amdt_net_done(s, slot, 1);
            amdt_close_conn(s, w, &link);
            if (err != ECANCELED && err != ENODATA) {
                amdt_event_push(&s->events, AMDT_EV_CONN_ERROR, 0, 0, 0, err, "send to %s:%d: %s",
                                s->host, s->port, amdt_strerror(err, ebuf, sizeof(ebuf)));
                amdt_worker_set_state(w, AMDT_STATE_IDLE);
                amdt_backoff(w, fails++);
            }
            continue;
        }
        fails = 0;
        __atomic_fetch_add(&s->chunks_sent, 1, __ATOMIC_RELAXED);
        amdt_net_done(s, slot, 0);
    }
    amdt_close_conn(s, w, &link);
    free(buf);
}

/* ---- control ----------------------------------------------------------------------- */

int amdt_sender_set_threads(amdt_sender *s, int nread, int nnet, int *old_read, int *old_net)
{
    int rc = 0, rc2 = 0;
    if (nread >= 0)
        rc = amdt_stage_set_target(&s->read, nread, old_read);
    if (nnet >= 0)
        rc2 = amdt_stage_set_target(&s->net, nnet, old_net);
    /* Wake waiting threads so the ones above the new target exit promptly. */
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    amdt_pool_wake(&s->pool);
    return rc ? rc : rc2;
}

void amdt_sender_set_fault_corrupt(amdt_sender *s, int n)
{
    __atomic_store_n(&s->fault_corrupt, n, __ATOMIC_RELAXED);
}

void amdt_sender_get_stats(amdt_sender *s, amdt_sender_stats *out)
{
    out->time_ns = amdt_now_ns();
    amdt_stage_get_stats(&s->read, &out->read);
    amdt_stage_get_stats(&s->net, &out->net);
    amdt_pool_get_stats(&s->pool, &out->buffer);
    out->chunks_sent = __atomic_load_n(&s->chunks_sent, __ATOMIC_RELAXED);
    out->chunks_requeued = __atomic_load_n(&s->chunks_requeued, __ATOMIC_RELAXED);
    out->frames_corrupted = __atomic_load_n(&s->frames_corrupted, __ATOMIC_RELAXED);
    pthread_mutex_lock(&s->mu);
    out->chunks_pending = s->pending;
    out->files_failed = s->files_failed;
    pthread_mutex_unlock(&s->mu);
    /* TCP_INFO is a non-blocking getsockopt: fine under the stage lock (see amdt_take_conn). */
    pthread_mutex_lock(&s->net.mu);
    out->tcp_segs_out = s->tcp_segs_closed;
    out->tcp_retrans = s->tcp_retrans_closed;
    for (int i = 0; i < s->net.max_threads; i++)
        if (s->net.workers[i].sock >= 0)
            amdt_tcp_counters(s->net.workers[i].sock, &out->tcp_segs_out, &out->tcp_retrans);
    pthread_mutex_unlock(&s->net.mu);
}

void amdt_sender_close(amdt_sender *s)
{
    if (s->closed)
        return;
    s->closed = 1;
    amdt_set_stop(&s->stop);
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    amdt_pool_wake(&s->pool);
    amdt_stage_shutdown_socks(&s->net);
    amdt_stage_join_all(&s->read);
    amdt_stage_join_all(&s->net);

    /* Every thread is gone: close the file descriptors, free the staged memory. */
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->files.cap; i++) {
        if (!amdt_map_live(&s->files, i))
            continue;
        amdt_sfile *f = s->files.vals[i];
        if (f->fd >= 0) {
            close(f->fd);
            f->fd = -1;
        }
    }
    pthread_mutex_unlock(&s->mu);
    amdt_pool_release(&s->pool);
    amdt_debug("sender: closed");
}

void amdt_sender_free(amdt_sender *s)
{
    if (s == NULL)
        return;
    amdt_sender_close(s);
    for (size_t i = 0; i < s->files.cap; i++) {
        if (!amdt_map_live(&s->files, i))
            continue;
        amdt_sfile *f = s->files.vals[i];
        free(f->ranges);
        free(f->path);
        free(f);
    }
    amdt_map_free(&s->files);
    while (s->rq_head != NULL) {
        amdt_requeue *r = s->rq_head;
        s->rq_head = r->next;
        free(r);
    }
    amdt_stage_destroy(&s->net);
    amdt_stage_destroy(&s->read);
    amdt_pool_destroy(&s->pool);
    amdt_events_free(&s->events);
    amdt_tls_free(s->tls);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
