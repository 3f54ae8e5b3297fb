/*
 * fpk_pool.c — fixed pthread pool. One run at a time: the caller publishes a job, bumps a
 * generation counter and wakes the workers; every thread takes pieces from an atomic counter;
 * the caller waits until every worker has left the job. Chosen over OpenMP so the pool belongs
 * to the backend instance (its thread count is the backend's), and so libgomp's spinning
 * threads do not compete with OpenBLAS's own pthreads between ops.
 */
#include "fpk_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct fpk_pool {
    int threads;
    pthread_t *tids;
    pthread_mutex_t mu;   /* protects gen, stop, busy, active */
    pthread_cond_t wake;  /* workers wait for a new generation */
    pthread_cond_t done;  /* the caller waits for active == 0 */
    uint64_t gen;
    int stop;
    int active;           /* workers still inside the current job */
    pthread_mutex_t run_mu; /* one run at a time */

    /* the current job */
    fpk_pool_fn fn;
    void *arg;
    int64_t n, piece;
    atomic_llong next;
};

static _Thread_local int tls_in_pool;

static void work(fpk_pool *p, int thread) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->piece);
        if (b >= p->n) break;
        int64_t e = b + p->piece < p->n ? b + p->piece : p->n;
        p->fn(p->arg, b, e, thread);
    }
}

typedef struct {
    fpk_pool *pool;
    int thread;
} worker_arg;

static void *worker_main(void *v) {
    worker_arg *wa = v;
    fpk_pool *p = wa->pool;
    int thread = wa->thread;
    free(wa);
    tls_in_pool = 1;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        work(p, thread);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

fpk_pool *fpk_pool_new(int threads) {
    if (threads < 1) threads = 1;
    fpk_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->threads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->tids = calloc((size_t)threads, sizeof *p->tids);
    if (!p->tids) {
        fpk_pool_free(p);
        return NULL;
    }
    for (int i = 1; i < threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            p->threads = i;
            break;
        }
        wa->pool = p;
        wa->thread = i;
        if (pthread_create(&p->tids[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->threads = i;
            break;
        }
    }
    return p;
}

void fpk_pool_free(fpk_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->threads && p->tids; i++) pthread_join(p->tids[i], NULL);
    free(p->tids);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int fpk_pool_threads(const fpk_pool *p) { return p ? p->threads : 1; }

void fpk_pool_run(fpk_pool *p, int64_t n, int64_t grain, fpk_pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int serial = !p || p->threads == 1 || tls_in_pool || n <= grain;
    if (!serial && pthread_mutex_trylock(&p->run_mu) != 0) serial = 1;
    if (serial) {
        fn(arg, 0, n, 0);
        return;
    }
    /* about 4 pieces per thread for balance, never below grain */
    int64_t piece = n / ((int64_t)p->threads * 4);
    if (piece < grain) piece = grain;
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->piece = piece;
    atomic_store(&p->next, 0);
    pthread_mutex_lock(&p->mu);
    p->active = p->threads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    tls_in_pool = 1;
    work(p, 0);
    tls_in_pool = 0;
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
