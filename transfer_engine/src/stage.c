/* Resizable worker pools, per-thread accounting and throttles (see stage.h). */
#include "stage.h"

#include <signal.h>
#include <sys/socket.h>

#define AMDT_THREAD_STACK (512 * 1024)

int amdt_stage_init(amdt_stage *st, const char *name, int max_threads, amdt_worker_fn body,
                    void *owner, const int *stop)
{
    memset(st, 0, sizeof(*st));
    st->name = name;
    st->max_threads = max_threads;
    st->body = body;
    st->owner = owner;
    st->stop = stop;
    st->workers = calloc((size_t)max_threads, sizeof(*st->workers));
    if (st->workers == NULL)
        goto error;
    for (int i = 0; i < max_threads; i++) {
        st->workers[i].stage = st;
        st->workers[i].index = i;
        st->workers[i].sock = -1;
    }
    if (pthread_mutex_init(&st->mu, NULL) != 0)
        goto error_workers;
    if (pthread_mutex_init(&st->thr_mu, NULL) != 0)
        goto error_mu;
    return 0;

error_mu:
    pthread_mutex_destroy(&st->mu);
error_workers:
    free(st->workers);
    st->workers = NULL;
error:
    return -1;
}

void amdt_stage_destroy(amdt_stage *st)
{
    if (st->workers == NULL)
        return;
    pthread_mutex_destroy(&st->thr_mu);
    pthread_mutex_destroy(&st->mu);
    free(st->workers);
    st->workers = NULL;
}

/* Add the time spent in the current state to its bucket. Caller holds st->mu. */
static void amdt_worker_account_locked(amdt_worker *w, uint64_t now)
{
    if (now > w->since_ns)
        w->acc_ns[w->state] += now - w->since_ns;
    w->since_ns = now;
}

void amdt_worker_set_state(amdt_worker *w, int state)
{
    amdt_stage *st = w->stage;
    pthread_mutex_lock(&st->mu);
    if (w->state != state) {
        uint64_t now = amdt_now_ns();
        if (w->state != AMDT_STATE_BUSY && now > w->since_ns)
            __atomic_fetch_add(&w->thr_wait_ns, now - w->since_ns, __ATOMIC_RELAXED);
        amdt_worker_account_locked(w, now);
        w->state = state;
    }
    pthread_mutex_unlock(&st->mu);
}

static void *amdt_worker_main(void *arg)
{
    amdt_worker *w = arg;
    amdt_stage *st = w->stage;

    amdt_debug("%s[%d]: start", st->name, w->index);
    st->body(w);
    amdt_debug("%s[%d]: exit", st->name, w->index);

    pthread_mutex_lock(&st->mu);
    amdt_worker_account_locked(w, amdt_now_ns());
    w->state = AMDT_STATE_OFF;
    w->exited = 1;
    w->ctx = NULL;
    st->live--;
    pthread_mutex_unlock(&st->mu);
    /* From here on the thread touches no engine memory, so joining it cannot block. */
    return NULL;
}

/* Join an exited thread. Caller holds st->mu (safe: the thread no longer takes it). */
static void amdt_worker_reap_locked(amdt_worker *w)
{
    if (w->has_thread && w->exited) {
        pthread_join(w->tid, NULL);
        w->has_thread = 0;
        w->exited = 0;
    }
}

/* Start a thread on an empty slot. Caller holds st->mu. Returns 0 or an errno. */
static int amdt_worker_start_locked(amdt_worker *w)
{
    amdt_stage *st = w->stage;
    pthread_attr_t attr;
    sigset_t all, old;
    int rc;

    rc = pthread_attr_init(&attr);
    if (rc != 0)
        return rc;
    pthread_attr_setstacksize(&attr, AMDT_THREAD_STACK);

    w->has_thread = 1;
    w->exited = 0;
    amdt_worker_account_locked(w, amdt_now_ns()); /* OFF time is not counted anywhere */
    w->acc_ns[AMDT_STATE_OFF] = 0;
    w->state = AMDT_STATE_IDLE;
    st->live++;

    /* Workers block every signal: signals go to the Python main thread, and blocking
     * calls in workers are never interrupted by EINTR from them. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = pthread_create(&w->tid, &attr, amdt_worker_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);

    if (rc != 0) {
        w->has_thread = 0;
        w->state = AMDT_STATE_OFF;
        w->ctx = NULL;
        st->live--;
        amdt_debug("%s[%d]: pthread_create failed: %d", st->name, w->index, rc);
    }
    return rc;
}

int amdt_stage_set_target(amdt_stage *st, int n, int *old)
{
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    if (old != NULL)
        *old = st->target;
    st->target = n;
    for (int i = 0; i < st->max_threads; i++) {
        amdt_worker *w = &st->workers[i];
        amdt_worker_reap_locked(w);
        if (i < n && !w->has_thread && !amdt_stopping(st->stop)) {
            rc = amdt_worker_start_locked(w);
            if (rc != 0) {
                st->target = i;
                break;
            }
        }
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int amdt_stage_spawn(amdt_stage *st, void *ctx)
{
    int idx = -1;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < st->max_threads; i++) {
        amdt_worker *w = &st->workers[i];
        amdt_worker_reap_locked(w);
        if (idx < 0 && !w->has_thread)
            idx = i;
    }
    if (idx >= 0) {
        amdt_worker *w = &st->workers[idx];
        w->ctx = ctx;
        int rc = amdt_worker_start_locked(w);
        if (rc != 0) {
            errno = rc;
            idx = -2;
        }
    }
    pthread_mutex_unlock(&st->mu);
    return idx;
}

int amdt_stage_should_exit(amdt_worker *w)
{
    amdt_stage *st = w->stage;
    if (amdt_stopping(st->stop))
        return 1;
    pthread_mutex_lock(&st->mu);
    int r = w->index >= st->target;
    pthread_mutex_unlock(&st->mu);
    return r;
}

void amdt_worker_set_sock(amdt_worker *w, int fd)
{
    pthread_mutex_lock(&w->stage->mu);
    w->sock = fd;
    pthread_mutex_unlock(&w->stage->mu);
    /* Close the race with amdt_stage_shutdown_socks() running just before the store. */
    if (amdt_stopping(w->stage->stop))
        shutdown(fd, SHUT_RDWR);
}

int amdt_worker_take_sock(amdt_worker *w)
{
    pthread_mutex_lock(&w->stage->mu);
    int fd = w->sock;
    w->sock = -1;
    pthread_mutex_unlock(&w->stage->mu);
    return fd;
}

void amdt_stage_shutdown_socks(amdt_stage *st)
{
    /* Under st->mu: a worker clears w->sock under the same lock before closing the fd,
     * so the descriptor cannot have been reused for something else. */
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < st->max_threads; i++)
        if (st->workers[i].sock >= 0)
            shutdown(st->workers[i].sock, SHUT_RDWR);
    pthread_mutex_unlock(&st->mu);
}

void amdt_stage_join_all(amdt_stage *st)
{
    if (st->workers == NULL)
        return;
    for (int i = 0; i < st->max_threads; i++) {
        amdt_worker *w = &st->workers[i];
        pthread_mutex_lock(&st->mu);
        int has = w->has_thread;
        pthread_t tid = w->tid;
        pthread_mutex_unlock(&st->mu);
        if (!has)
            continue;
        /* Not under st->mu: a running thread takes it on its way out. */
        pthread_join(tid, NULL);
        pthread_mutex_lock(&st->mu);
        w->has_thread = 0;
        w->exited = 0;
        pthread_mutex_unlock(&st->mu);
    }
}

void amdt_stage_get_stats(amdt_stage *st, amdt_stage_stats *out)
{
    uint64_t acc[AMDT_NSTATES] = {0};
    pthread_mutex_lock(&st->mu);
    uint64_t now = amdt_now_ns();
    for (int i = 0; i < st->max_threads; i++) {
        amdt_worker *w = &st->workers[i];
        for (int k = 0; k < AMDT_NSTATES; k++)
            acc[k] += w->acc_ns[k];
        if (w->state != AMDT_STATE_OFF && now > w->since_ns)
            acc[w->state] += now - w->since_ns;
    }
    out->target = st->target;
    out->live = st->live;
    pthread_mutex_unlock(&st->mu);
    out->bytes = __atomic_load_n(&st->bytes, __ATOMIC_RELAXED);
    out->busy_ns = acc[AMDT_STATE_BUSY];
    out->wait_ns = acc[AMDT_STATE_WAIT];
    out->idle_ns = acc[AMDT_STATE_IDLE];
}

/* ---- throttles --------------------------------------------------------------------- */

#define AMDT_THROTTLE_SLACK_NS (50ULL * 1000000ULL)

void amdt_stage_set_throttle(amdt_stage *st, uint64_t thread_bps, uint64_t total_bps)
{
    pthread_mutex_lock(&st->thr_mu);
    st->thread_bps = thread_bps;
    st->total_bps = total_bps;
    if (st->keep_clock && (thread_bps != 0 || total_bps != 0)) {
        pthread_mutex_unlock(&st->thr_mu);
        return;
    }
    st->total_next_ns = 0;
    for (int i = 0; i < st->max_threads; i++)
        st->workers[i].thr_next_ns = 0;
    __atomic_fetch_add(&st->thr_gen, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&st->thr_mu);
}

static inline uint64_t amdt_pace_ns(uint64_t bytes, uint64_t bps)
{
    return (uint64_t)((double)bytes * 1e9 / (double)bps);
}

/* Reserve `bytes` on a total clock (a stage's, or a device's shared by several): the chunk's turn
 * begins when the clock's previous reservation ends, and the pace covers it: no byte before the
 * turn, the last at its end. */
static void amdt_clock_take(uint64_t *next_ns, uint64_t bps, uint64_t bytes, amdt_pace *p)
{
    uint64_t now = amdt_now_ns();
    uint64_t start = *next_ns > now ? *next_ns : now;
    *next_ns = start + amdt_pace_ns(bytes, bps);
    if (*next_ns > p->until_ns)
        p->until_ns = *next_ns;
    if (start > p->from_ns)
        p->from_ns = start;
}

amdt_pace amdt_throttle_reserve(amdt_worker *w, uint64_t bytes)
{
    amdt_stage *st = w->stage;
    amdt_pace p = {0, 0, 0};
    pthread_mutex_lock(&st->thr_mu);
    p.gen = st->thr_gen;
    if (st->thread_bps == 0 && st->total_bps == 0 && st->shared == NULL)
        goto done;
    uint64_t now = amdt_now_ns();
    /* Callers wait *before* the work, so the work itself (a pread, a send, a pwrite) runs between
     * two reservations. A clock that fell behind by less than AMDT_THROTTLE_SLACK_NS keeps its
     * schedule for the time the worker spent working since (the thread catches up), not for the
     * time it spent waiting for work or room: each chunk's work would otherwise come on top of
     * its paced time (throttled threads together would fall short of their rates), and
     * a stage starved for a while does not burst. The slack bounds any catch-up to slack * rate
     * bytes. Every loop turn of a worker passes through a waiting state, so the time is
     * counted, not flagged. Only the thread's own clock catches up: the stage's clock falls
     * behind when no thread reserves, and crediting it with each thread's working time would let
     * a stage's total run over its limit. */
    uint64_t waited = __atomic_exchange_n(&w->thr_wait_ns, 0, __ATOMIC_RELAXED);
    if (w->thr_next_ns < now && now - w->thr_next_ns < AMDT_THROTTLE_SLACK_NS &&
        w->thr_next_ns + waited < now)
        now = w->thr_next_ns + waited; /* behind: catch up the time spent working, not waiting */
    p.from_ns = now;
    if (st->thread_bps != 0) {
        uint64_t start = w->thr_next_ns > now ? w->thr_next_ns : now;
        w->thr_next_ns = start + amdt_pace_ns(bytes, st->thread_bps);
        p.until_ns = w->thr_next_ns;
        p.from_ns = start;
    }
    if (st->total_bps != 0)
        amdt_clock_take(&st->total_next_ns, st->total_bps, bytes, &p);
    if (st->shared != NULL) { /* the device's clock, taken in turn with the other engines' */
        pthread_mutex_lock(&st->shared->mu);
        amdt_clock_take(&st->shared->next_ns, st->shared->total_bps, bytes, &p);
        pthread_mutex_unlock(&st->shared->mu);
    }
done:
    pthread_mutex_unlock(&st->thr_mu);
    return p;
}

void amdt_throttle_wait_share(amdt_worker *w, amdt_pace pace, uint64_t done, uint64_t length)
{
    if (pace.until_ns == 0 || length == 0)
        return;
    uint64_t from = pace.from_ns < pace.until_ns ? pace.from_ns : pace.until_ns;
    pace.until_ns =
        from + (uint64_t)((double)(pace.until_ns - from) * (double)done / (double)length);
    amdt_throttle_wait(w, pace);
}

void amdt_throttle_wait(amdt_worker *w, amdt_pace pace)
{
    if (pace.until_ns == 0)
        return;
    amdt_sleep_until(pace.until_ns, w->stage->stop, &w->stage->thr_gen, pace.gen);
}
