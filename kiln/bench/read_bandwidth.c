/* The machine's read bandwidth as a streaming kernel sees it: THREADS threads each summing its
   share of a buffer far larger than the caches with the widest vector loads the compiler has
   (-march=native), eight independent sums so the adds never wait; each round reads the buffer
   twice, once as one stream a thread and once as four side by side (each thread's share in four
   parts, eight vectors of each in turn: the memory serves several streams faster, and kiln's own
   decode rows read several), and the best of every read over ROUNDS is the figure. Built and
   called by kiln.bench.bandwidth (read_bandwidth; TokenClock, between a decode loop's tokens,
   over a buffer it keeps) for the generation table's bound: a NumPy sum
   reads slower than the machine can on some (its loop, not the memory, is the limit). */
#define _POSIX_C_SOURCE 200112L
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float vec __attribute__((vector_size(64), aligned(64)));

#define KILN_READ_STREAMS 4

typedef struct {
  const vec *from;
  size_t count;
  int streams; /* 1, or KILN_READ_STREAMS parts read side by side */
  float sum;
} share;

static void *reader(void *arg) {
  share *s = (share *)arg;
  vec a[8] = {{0}};
  const size_t part = s->count / (size_t)s->streams, whole = part - part % 8;
  const vec *p[KILN_READ_STREAMS];
  for (int t = 0; t < s->streams; ++t) p[t] = s->from + part * (size_t)t;
  for (size_t i = 0; i < whole; i += 8)
    for (int t = 0; t < s->streams; ++t)
      for (int j = 0; j < 8; ++j) a[j] += p[t][i + j];
  for (int t = 0; t < s->streams; ++t) /* (each part's last vectors, then the share's last) */
    for (size_t i = whole; i < part; ++i) a[0] += p[t][i];
  for (size_t i = part * (size_t)s->streams; i < s->count; ++i) a[0] += s->from[i];
  vec t = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
  float total = 0.0f;
  for (int j = 0; j < (int)(sizeof(vec) / sizeof(float)); ++j) total += t[j];
  s->sum = total; /* (kept: the reads cannot be dropped) */
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* bytes per second read from `bytes` of `buffer` (far larger than the caches, its pages faulted in
   already); 0 when a thread could not start; *sink gets the sums' total */
double kiln_read_bandwidth_in(const void *buffer, int64_t bytes, int threads, int rounds, float *sink) {
  if (!buffer || threads < 1 || threads > 256 || bytes < (int64_t)sizeof(vec) || rounds < 1) return 0.0;
  const size_t count = (size_t)bytes / sizeof(vec);
  const vec *from = (const vec *)buffer;
  share shares[256];
  pthread_t ids[256];
  double best = 1e30;
  float total = 0.0f;
  for (int r = 0; r < 2 * rounds; ++r) {
    const int streams = r % 2 ? KILN_READ_STREAMS : 1;
    const double started = now();
    int made = 0;
    for (int t = 0; t < threads; ++t) {
      const size_t lo = count * (size_t)t / (size_t)threads, hi = count * (size_t)(t + 1) / (size_t)threads;
      shares[t] = (share){from + lo, hi - lo, streams, 0.0f};
      if (t > 0 && pthread_create(&ids[t], NULL, reader, &shares[t]) == 0) ++made;
      else if (t > 0) break;
    }
    if (made != threads - 1) {
      for (int t = 1; t <= made; ++t) pthread_join(ids[t], NULL);
      return 0.0;
    }
    reader(&shares[0]);
    for (int t = 1; t < threads; ++t) pthread_join(ids[t], NULL);
    const double took = now() - started;
    best = took < best ? took : best;
    for (int t = 0; t < threads; ++t) total += shares[t].sum;
  }
  *sink = total;
  return (double)(count * sizeof(vec)) / best;
}

/* the same over a buffer of `megabytes` of its own (allocated, faulted in, freed); 0 when out of
   memory or a thread could not start */
double kiln_read_bandwidth(int64_t megabytes, int threads, int rounds, float *sink) {
  if (megabytes < 1 || megabytes > ((int64_t)1 << 40)) return 0.0;
  const size_t bytes = (size_t)megabytes << 20;
  void *buffer = aligned_alloc(64, bytes);
  if (!buffer) return 0.0;
  memset(buffer, 0, bytes); /* (every page faulted in before the clock starts) */
  const double found = kiln_read_bandwidth_in(buffer, (int64_t)bytes, threads, rounds, sink);
  free(buffer);
  return found;
}
