/*
 * Stage: a resizable pool of worker threads with per-thread time accounting and throttles.
 *
 * Worker slots are pre-allocated (max_threads per stage). Thread i runs while i < target;
 * it checks amdt_stage_should_exit() between chunks, so shrinking lets it finish its current
 * chunk first. A slot whose thread has exited but was not joined yet is a "zombie"; it is
 * joined (immediately: the thread no longer takes any lock) before the slot gets a new thread,
 * so one slot never has two threads. Growing back before an exiting thread noticed the
 * shrink simply keeps that thread.
 *
 * Each worker keeps `state` + `since_ns`; a state change adds the elapsed time to the
 * old state's bucket. amdt_stage_get_stats() adds the in-progress part of every live
 * thread's current state, so a thread blocked for seconds is counted continuously.
 *
 * Throttles (emulated slow devices/links): a per-thread virtual clock and a per-stage
 * shared virtual clock. next = max(now, next) + bytes / rate; callers reserve and sleep
 * *before* the work, so an emulated device delivers a chunk at the end of its reserved time.
 * A clock less than 50 ms behind `now` keeps its schedule (the thread catches up on the time
 * the work itself or a late wake-up took); the sleep counts as busy time.
 */
#ifndef AMDT_STAGE_H
#define AMDT_STAGE_H

#include "common.h"

enum amdt_state {
    AMDT_STATE_OFF = 0,
    AMDT_STATE_IDLE,
    AMDT_STATE_BUSY,
    AMDT_STATE_WAIT,
    AMDT_NSTATES
};

typedef struct amdt_stage amdt_stage;

/* A total rate that stages of several engines share: one emulated device (a destination disk)
 * that every session of a receiver writes to. A clock like a stage's total one, with its own
 * lock, taken after the stage's throttle lock. Its rate is fixed when it is made. */
typedef struct amdt_shared_clock {
    pthread_mutex_t mu;
    uint64_t total_bps; /* > 0 */
    uint64_t next_ns;
} amdt_shared_clock;

typedef struct amdt_worker {
    amdt_stage *stage;
    int index;
    int has_thread; /* a pthread exists for this slot and was not joined yet (stage->mu) */
    int exited;     /* its body returned; join before reusing the slot (stage->mu) */
    pthread_t tid;
    int state; /* stage->mu */
    uint64_t since_ns;
    uint64_t acc_ns[AMDT_NSTATES];
    uint64_t thr_next_ns; /* per-thread throttle clock (stage->thr_mu) */
    uint64_t thr_wait_ns; /* time spent waiting or idle since the last reservation (atomic): the
                           * throttle clock catches up only the rest, time spent working */
    int sock;             /* socket owned by this thread, -1 if none (stage->mu) */
    void *ctx;            /* per-thread data given to amdt_stage_spawn() */
} amdt_worker;

typedef void (*amdt_worker_fn)(amdt_worker *w);

struct amdt_stage {
    pthread_mutex_t mu;
    const char *name;
    int max_threads;
    int target;
    int live;
    amdt_worker *workers;
    amdt_worker_fn body;
    void *owner;
    const int *stop;
    uint64_t bytes; /* payload bytes moved, atomic */

    pthread_mutex_t thr_mu;
    uint64_t thread_bps, total_bps; /* bytes per second, 0 = unlimited */
    uint64_t total_next_ns;
    unsigned thr_gen;          /* bumped by set_throttle (atomic): sleepers re-plan */
    int keep_clock;            /* a new limit keeps the clocks and the turns already taken */
    amdt_shared_clock *shared; /* NULL, or a device clock also paced (set before threads start;
                                * it outlives the stage) */
};

typedef struct amdt_stage_stats {
    uint64_t bytes;
    uint64_t busy_ns, wait_ns, idle_ns;
    int target, live;
} amdt_stage_stats;

int amdt_stage_init(amdt_stage *st, const char *name, int max_threads, amdt_worker_fn body,
                    void *owner, const int *stop);
/* All threads must have been joined (amdt_stage_join_all). */
void amdt_stage_destroy(amdt_stage *st);

/* Set the target thread count, starting threads for empty slots below it and joining
 * exited ones. Returns 0, or an errno from pthread_create (target then equals the number
 * of threads that run). *old gets the previous target. */
int amdt_stage_set_target(amdt_stage *st, int n, int *old);
/* Start one thread on a free slot with w->ctx = ctx (receiver connections). Returns the slot
 * index, -1 if every slot is busy, or -2 if pthread_create failed (errno set). */
int amdt_stage_spawn(amdt_stage *st, void *ctx);
/* True when the stop flag is set or this worker's slot is above the target. */
int amdt_stage_should_exit(amdt_worker *w);
/* shutdown(SHUT_RDWR) every worker socket, so blocked send/recv calls return. */
void amdt_stage_shutdown_socks(amdt_stage *st);
/* Join every thread (the stop flag must be set). Call without the GIL. */
void amdt_stage_join_all(amdt_stage *st);

void amdt_worker_set_state(amdt_worker *w, int state);
void amdt_worker_set_sock(amdt_worker *w, int fd);
/* Detach the worker's socket and return it (-1 if none); the caller closes it. */
int amdt_worker_take_sock(amdt_worker *w);

static inline void amdt_stage_add_bytes(amdt_stage *st, uint64_t n)
{
    __atomic_fetch_add(&st->bytes, n, __ATOMIC_RELAXED);
}

void amdt_stage_get_stats(amdt_stage *st, amdt_stage_stats *out);

/* Throttles. A new limit resets the clocks and wakes the threads waiting for their turn, which
 * then go on at once (a throttle schedule's next step, perhaps much faster, applies now). A stage
 * with keep_clock set (the receiver's connections, whose limit the daemon's fair share changes
 * every second) keeps its clocks and the turns already taken, so a change does not let every
 * waiting thread through at once; only lifting the limit (0, 0) wakes them. */
void amdt_stage_set_throttle(amdt_stage *st, uint64_t thread_bps, uint64_t total_bps);
typedef struct amdt_pace {
    uint64_t until_ns; /* 0: no sleep */
    uint64_t from_ns;  /* when the reserved window begins (until_ns: when it ends) */
    unsigned gen;
} amdt_pace;
/* Reserve `bytes` on the thread's and the stage's clocks. */
amdt_pace amdt_throttle_reserve(amdt_worker *w, uint64_t bytes);
/* Sleep until the reservation is due (wakes early on stop or a rate change). */
void amdt_throttle_wait(amdt_worker *w, amdt_pace pace);

/* A throttled stage's read, network and write threads release a chunk's bytes in steps of this
 * many across the chunk's reserved window, and count each step once done, rather than all at the
 * window's end: a throttle plays a device or a link that delivers bytes as it goes. Counted per chunk,
 * readers that started together would deliver in lumps (an interval over the stage's total
 * limit, the next under it), and a thread added to a stage would show nothing for a whole
 * chunk's window (0.42 s for 4 MiB at 10 MB/s). The reservation stays one per chunk, so chunks
 * still take a stage's total rate in turn. Unthrottled stages keep one step per chunk. */
#define AMDT_THROTTLE_STEP (1024 * 1024)

/* Whether the stage has a rate limit now (read without its lock: a limit set in the middle of
 * a chunk applies from the next one). */
static inline int amdt_stage_throttled(amdt_stage *st)
{
    return st->shared != NULL || __atomic_load_n(&st->thread_bps, __ATOMIC_RELAXED) != 0 ||
           __atomic_load_n(&st->total_bps, __ATOMIC_RELAXED) != 0;
}

/* Sleep until the share done / length of the reserved window has passed (the step that ends at
 * byte `done` of a chunk of `length` bytes is due). */
void amdt_throttle_wait_share(amdt_worker *w, amdt_pace pace, uint64_t done, uint64_t length);

#endif /* AMDT_STAGE_H */
