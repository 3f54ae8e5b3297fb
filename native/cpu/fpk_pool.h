/* fpk_pool.h — a small fixed pthread pool for the cpu backend's own loops. */
#ifndef FPK_POOL_H
#define FPK_POOL_H

#include <stdint.h>

typedef struct fpk_pool fpk_pool;

/* Runs fn over [begin, end) pieces of [0, n); thread is in [0, threads). */
typedef void (*fpk_pool_fn)(void *arg, int64_t begin, int64_t end, int thread);

/* Creates a pool of `threads` threads in all (the caller counts as one). NULL on failure. */
fpk_pool *fpk_pool_new(int threads);
void fpk_pool_free(fpk_pool *pool);
int fpk_pool_threads(const fpk_pool *pool);

/* Splits [0, n) into pieces of at least grain items and runs fn on them from every thread;
 * returns when all are done. Calls from inside a task, or while another run is active, run
 * serially on the calling thread. */
void fpk_pool_run(fpk_pool *pool, int64_t n, int64_t grain, fpk_pool_fn fn, void *arg);

#endif /* FPK_POOL_H */
