/* kiln's thread pool: the parallel loops of generated kernels and of the engines run on it, not on an
   OpenMP runtime (whose default active spin-wait makes a model 13x slower when another process shares
   a core). One pool per process: every library carries this code, and the first one the process loads
   lends its pool to every other (kiln_pool_share / kiln_pool_adopt, called by the loader), so three
   loaded models start the workers of one pool, not three. A library's `threads` bound its loops'
   participants (the calling thread and up to threads - 1 workers, started on first use); the pool
   keeps as many workers as the largest bound asked of it.
   - A loop is cut into chunks claimed from an atomic ticket, so a participant slowed by another
     process on its core takes fewer chunks instead of holding the others at a barrier, and the
     caller waits for the chunks to be done, never for a worker that has none to acknowledge.
   - Waiting threads spin for `spin` iterations (the next kernel usually follows within
     microseconds), then sleep on a condition variable: a busy machine gets its cores back.
   - A request arriving while the pool runs another request's loop runs its loops on its own thread
     (concurrent requests share the cores, never oversubscribe them); a loop inside a pool job (a
     product inside attention's per-head loop) runs on the thread that reached it.
   - Workers never read a job they did not claim: the job's description lives in one of two slots by
     the parity of its generation, and a chunk is claimed by a compare-and-swap that names the
     generation, so a worker that wakes late finds its job gone and claims nothing. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

typedef void (*kiln_body)(void *ctx, int64_t begin, int64_t end, int worker);
#ifndef KILN_ENGINE
#define KILN_ENGINE static /* (hidden across translation units: gemm_api.h) */
#endif

#define KILN_MAX_THREADS 256
#define KILN_GEN_SHIFT 40 /* ticket = generation << 40 | next index (loops up to 2^40 iterations) */

typedef struct {
  kiln_body body;
  void *ctx;
  int64_t begin, end, grain;
  int participants;
  atomic_int_fast64_t done; /* iterations finished */
} kiln_job;

static struct {
  pthread_mutex_t busy, sleep_lock;
  pthread_cond_t wake, finished;
  int started, threads, forked_handler;
  atomic_long spin;
  atomic_uint_fast64_t generation, ticket;
  atomic_int sleepers, caller_waiting;
  kiln_job jobs[2];
  pthread_t handles[KILN_MAX_THREADS];
} kiln_pool = {.busy = PTHREAD_MUTEX_INITIALIZER,
               .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
               .wake = PTHREAD_COND_INITIALIZER,
               .finished = PTHREAD_COND_INITIALIZER,
               .spin = 2000}; /* about 0.1 ms of pause instructions: gaps between kernels are shorter */

static _Thread_local int kiln_worker = -1; /* this thread's participant number inside a pool loop */

static inline void kiln_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int kiln_default_threads(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
  return 1;
}

/* run chunks of the job of generation `gen` while there are any; returns when none is left */
static void kiln_pool_chunks(uint64_t gen, int worker) {
  kiln_job *job = &kiln_pool.jobs[gen & 1];
  const kiln_body body = job->body;
  void *const ctx = job->ctx;
  const int64_t begin = job->begin, end = job->end, grain = job->grain;
  if (worker >= job->participants) return;
  for (;;) {
    uint64_t old = atomic_load(&kiln_pool.ticket), start;
    do {
      start = old & ((1ULL << KILN_GEN_SHIFT) - 1);
      if ((old >> KILN_GEN_SHIFT) != (gen & ((1ULL << (64 - KILN_GEN_SHIFT)) - 1)) || (int64_t)start >= end - begin) return;
    } while (!atomic_compare_exchange_weak(&kiln_pool.ticket, &old, old + (uint64_t)grain));
    const int64_t lo = begin + (int64_t)start, hi = lo + grain < end ? lo + grain : end;
    body(ctx, lo, hi, worker);
    if (atomic_fetch_add(&job->done, hi - lo) + (hi - lo) == end - begin && atomic_load(&kiln_pool.caller_waiting)) {
      pthread_mutex_lock(&kiln_pool.sleep_lock);
      pthread_cond_broadcast(&kiln_pool.finished);
      pthread_mutex_unlock(&kiln_pool.sleep_lock);
    }
  }
}

static void *kiln_pool_worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  kiln_worker = id;
#if defined(__GLIBC__)
  pthread_setname_np(pthread_self(), "kiln-pool"); /* how tools (and kiln's tests) tell its workers */
#endif
  uint64_t seen = atomic_load(&kiln_pool.generation);
  for (;;) {
    long spins = 0;
    uint64_t now;
    while ((now = atomic_load(&kiln_pool.generation)) == seen) {
      if (spins++ < atomic_load_explicit(&kiln_pool.spin, memory_order_relaxed)) {
        kiln_relax();
        continue;
      }
      pthread_mutex_lock(&kiln_pool.sleep_lock);
      atomic_fetch_add(&kiln_pool.sleepers, 1);
      while ((now = atomic_load(&kiln_pool.generation)) == seen) pthread_cond_wait(&kiln_pool.wake, &kiln_pool.sleep_lock);
      atomic_fetch_sub(&kiln_pool.sleepers, 1);
      pthread_mutex_unlock(&kiln_pool.sleep_lock);
    }
    seen = now;
    kiln_pool_chunks(now, id);
  }
  return NULL;
}

static void kiln_pool_after_fork(void) { /* the child has none of the parent's workers */
  kiln_pool.started = 0;
  pthread_mutex_init(&kiln_pool.busy, NULL);
  pthread_mutex_init(&kiln_pool.sleep_lock, NULL);
  pthread_cond_init(&kiln_pool.wake, NULL);
  pthread_cond_init(&kiln_pool.finished, NULL);
  atomic_store(&kiln_pool.sleepers, 0);
}

/* workers the pool may keep: the largest bound a library asked for (0 before any: the CPUs this
   process may use) */
static void kiln_pool_reserve(int threads) {
  if (threads <= 0) threads = kiln_default_threads();
  if (threads > KILN_MAX_THREADS) threads = KILN_MAX_THREADS;
  pthread_mutex_lock(&kiln_pool.sleep_lock);
  if (threads > kiln_pool.threads) kiln_pool.threads = threads;
  pthread_mutex_unlock(&kiln_pool.sleep_lock);
}

static void kiln_pool_set_spin(long spins) { atomic_store(&kiln_pool.spin, spins < 0 ? 0 : spins); }

static int kiln_pool_in(void) { return kiln_worker >= 0; }

/* body(ctx, lo, hi, worker) over [begin, end) in chunks of `grain` iterations (0: about four chunks
   per participant), by at most `max_workers` participants (0: the pool's workers and the caller); `worker` numbers
   the participant (below max_workers: per-thread scratch is indexed by it) */
static void kiln_pool_for(int64_t begin, int64_t end, int64_t grain, int max_workers, kiln_body body, void *ctx) {
  if (end <= begin) return;
  if (kiln_pool.threads <= 0) kiln_pool_reserve(0);
  int participants = kiln_pool.threads;
  if (max_workers > 0 && max_workers < participants) participants = max_workers;
  if (participants > end - begin) participants = (int)(end - begin);
  if (participants <= 1 || kiln_worker >= 0 || pthread_mutex_trylock(&kiln_pool.busy) != 0) {
    body(ctx, begin, end, kiln_worker >= 0 ? kiln_worker : 0); /* alone: one participant, or nested, or the pool is busy */
    return;
  }
  while (kiln_pool.started < participants - 1) {
    if (!kiln_pool.forked_handler) kiln_pool.forked_handler = pthread_atfork(NULL, NULL, kiln_pool_after_fork) == 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&kiln_pool.handles[kiln_pool.started], &attr, kiln_pool_worker,
                                (void *)(intptr_t)(kiln_pool.started + 1));
    pthread_attr_destroy(&attr);
    if (failed) {
      participants = kiln_pool.started + 1; /* fewer threads than asked: run with those there are */
      break;
    }
#if defined(__GLIBC__)
    /* named here too, so it has its name once this returns (its own call may not have run yet) */
    pthread_setname_np(kiln_pool.handles[kiln_pool.started], "kiln-pool");
#endif
    ++kiln_pool.started;
  }
  const uint64_t gen = atomic_load(&kiln_pool.generation) + 1;
  kiln_job *job = &kiln_pool.jobs[gen & 1];
  job->body = body;
  job->ctx = ctx;
  job->begin = begin;
  job->end = end;
  job->grain = grain > 0 ? grain : ((end - begin) / (4 * participants) > 0 ? (end - begin) / (4 * participants) : 1);
  job->participants = participants;
  atomic_store(&job->done, 0);
  atomic_store(&kiln_pool.ticket, (gen & ((1ULL << (64 - KILN_GEN_SHIFT)) - 1)) << KILN_GEN_SHIFT);
  atomic_store(&kiln_pool.generation, gen);
  if (atomic_load(&kiln_pool.sleepers) > 0) {
    pthread_mutex_lock(&kiln_pool.sleep_lock);
    pthread_cond_broadcast(&kiln_pool.wake);
    pthread_mutex_unlock(&kiln_pool.sleep_lock);
  }
  kiln_worker = 0;
  kiln_pool_chunks(gen, 0);
  kiln_worker = -1;
  long spins = 0;
  while (atomic_load(&job->done) < end - begin) { /* chunks other participants claimed */
    if (spins++ < atomic_load_explicit(&kiln_pool.spin, memory_order_relaxed)) {
      kiln_relax();
      continue;
    }
    pthread_mutex_lock(&kiln_pool.sleep_lock);
    atomic_store(&kiln_pool.caller_waiting, 1);
    while (atomic_load(&job->done) < end - begin) pthread_cond_wait(&kiln_pool.finished, &kiln_pool.sleep_lock);
    atomic_store(&kiln_pool.caller_waiting, 0);
    pthread_mutex_unlock(&kiln_pool.sleep_lock);
  }
  pthread_mutex_unlock(&kiln_pool.busy);
}

/* What a pool offers the libraries that use it. The loader takes the first library's (share) and
   hands it to every later one (adopt): their loops then run on the first one's workers. */
typedef struct {
  int version;
  void (*parallel_for)(int64_t, int64_t, int64_t, int, kiln_body, void *);
  int (*in_pool)(void);
  void (*reserve)(int);
  void (*set_spin)(long);
} kiln_pool_api;

#define KILN_POOL_API 1
static const kiln_pool_api kiln_own_pool = {KILN_POOL_API, kiln_pool_for, kiln_pool_in, kiln_pool_reserve,
                                             kiln_pool_set_spin};
static const kiln_pool_api *kiln_pool_used = &kiln_own_pool;
static int kiln_library_threads; /* this library's bound on a loop's participants (0: not set yet) */

const void *kiln_pool_share(void) { return &kiln_own_pool; }

/* run this library's loops on another library's pool (NULL: its own); refused (returns 0) for a pool
   of another interface version */
int kiln_pool_adopt(const void *api) {
  const kiln_pool_api *pool = api ? (const kiln_pool_api *)api : &kiln_own_pool;
  if (pool->version != KILN_POOL_API) return 0;
  kiln_pool_used = pool;
  if (kiln_library_threads > 0) pool->reserve(kiln_library_threads);
  return 1;
}

/* participants in this library's loops (set from Python: the model's `threads`); 0 = the CPUs this
   process may use */
int kiln_set_threads(int threads) {
  if (threads <= 0) threads = kiln_default_threads();
  kiln_library_threads = threads > KILN_MAX_THREADS ? KILN_MAX_THREADS : threads;
  kiln_pool_used->reserve(kiln_library_threads);
  return kiln_library_threads;
}

/* iterations a waiting thread of the pool spins before it sleeps (0: sleep at once); the pool is
   the process's, so the last model loaded sets it for all */
void kiln_set_spin(long spins) { kiln_pool_used->set_spin(spins); }

/* a run's own bound on its loops' participants, on the thread that runs it (kiln_context_run: its
   context's threads, so two models sharing one library keep their own); 0: the library's */
static _Thread_local int kiln_call_threads;

/* the calling thread's runs bounded to `threads` participants (0: the library's); the previous */
int kiln_pool_call_threads(int threads) {
  const int previous = kiln_call_threads;
  kiln_call_threads = threads < 0 ? 0 : threads > KILN_MAX_THREADS ? KILN_MAX_THREADS : threads;
  return previous;
}

/* workers enough for runs of `threads` participants (0 or less: the CPUs this process may use);
   the count */
int kiln_pool_reserve_threads(int threads) {
  if (threads <= 0) threads = kiln_default_threads();
  threads = threads > KILN_MAX_THREADS ? KILN_MAX_THREADS : threads;
  kiln_pool_used->reserve(threads);
  return threads;
}

static int kiln_pool_threads(void) {
  if (kiln_call_threads > 0) return kiln_call_threads;
  if (kiln_library_threads <= 0) kiln_set_threads(0);
  return kiln_library_threads;
}

static int kiln_in_pool(void) { return kiln_pool_used->in_pool(); }

static void kiln_pool_nothing(void *ctx, int64_t lo, int64_t hi, int worker) {
  (void)ctx;
  (void)lo;
  (void)hi;
  (void)worker;
}

/* the pool's workers for this library's loops started now (when a model is loaded), not by its
   first inference */
void kiln_pool_start(void) {
  int participants = kiln_pool_threads();
  kiln_pool_used->parallel_for(0, participants, 1, participants, kiln_pool_nothing, NULL);
}

/* body(ctx, lo, hi, worker) over [begin, end) on the pool this library uses, by at most this
   library's threads (and `max_workers` when positive) */
static _Thread_local int kiln_last_bound; /* the bound the calling thread's last loop ran under */

/* the participants' bound of the calling thread's last parallel loop (what a run's threads gave) */
int kiln_pool_last_bound(void) { return kiln_last_bound; }

KILN_ENGINE void kiln_parallel_for(int64_t begin, int64_t end, int64_t grain, int max_workers, kiln_body body, void *ctx) {
  int participants = kiln_last_bound = kiln_pool_threads();
  if (max_workers > 0 && max_workers < participants) participants = max_workers;
  kiln_pool_used->parallel_for(begin, end, grain, participants, body, ctx);
}
