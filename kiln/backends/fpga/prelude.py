"""The C++ every fpga design starts with: the headers, and the helpers its kernels call
(mantissa access, ROM words, exact division, rounding, square root, table indices, clamps) —
each a fixed number of steps, so synthesizable."""

PRELUDE = """\
#include <ap_fixed.h>
#include <ap_int.h>
#include <hls_stream.h>

#define KILN_FRACTION_BITS 24

// the mantissa of a fixed-point value, and a value set from one
template <int W, bool S, class T> static inline long long kiln_raw(const T &x) {
  if (S) { ap_int<W> r; r.range(W - 1, 0) = x.range(W - 1, 0); return r.to_int64(); }
  ap_uint<W> r; r.range(W - 1, 0) = x.range(W - 1, 0); return (long long)r.to_uint64();
}
template <int W, class T> static inline void kiln_set(T &x, long long m) {
  ap_int<64> r = m; x.range(W - 1, 0) = r.range(W - 1, 0);
}
// a ROM word (a mantissa, stored as a plain integer: W bits of block RAM or LUT ROM) as its type
template <class T, int W> static inline T kiln_rom(long long m) { T x; kiln_set<W>(x, m); return x; }
// quotient of aligned mantissas, truncated toward zero; by zero the extreme of the dividend's sign
static inline long long kiln_div(long long a, long long b, int shift, long long lowest, long long highest) {
  if (b == 0) return a == 0 ? 0 : (a > 0 ? highest : lowest);
  ap_int<200> n = a, d = b;
  if (shift >= 0) n = n << shift; else d = d << (-shift);
  bool negative = (n < 0) != (d < 0);
  if (n < 0) n = -n;
  if (d < 0) d = -d;
  ap_int<200> q = n / d;
  if (negative) q = -q;
  if (q > highest) return highest;
  if (q < lowest) return lowest;
  return q.to_int64();
}
static inline long long kiln_floor(long long m, int f) { return f > 0 ? (m >> f) : (m << (-f)); }
static inline long long kiln_ceil(long long m, int f) { return f > 0 ? -((-m) >> f) : (m << (-f)); }
static inline long long kiln_round_even(long long m, int f) {
  if (f <= 0) return m << (-f);
  long long q = (m + (1LL << (f - 1))) >> f;
  if ((m & ((1LL << f) - 1)) == (1LL << (f - 1)) && (q & 1)) q -= 1;
  return q;
}
// floor(sqrt(m << shift)), digit by digit (a fixed number of steps: synthesizable); m <= 0 gives 0
static inline long long kiln_sqrt(long long m, int shift) {
  if (m <= 0) return 0;
  ap_uint<128> n = m;
  if (shift >= 0) n = n << shift; else n = n >> (-shift);
  ap_uint<128> root = 0, bit = ap_uint<128>(1) << 126;
  for (int i = 0; i < 64; ++i) {
    if (bit != 0) {
      if (n >= root + bit) { n -= root + bit; root = (root >> 1) + bit; } else { root = root >> 1; }
      bit = bit >> 2;
    }
  }
  return (long long)root.to_uint64();
}
// a function ROM of size + 1 edge values, interpolated linearly within an input's bin (tables.py)
template <class T> static inline long long kiln_interp(long long m, long long start, int shift, int size, const T *table) {
  long long top = (long long)size << shift, p = m - start;
  p = p < 0 ? 0 : (p > top ? top : p);
  long long i = p >> shift;
  if (i > size - 1) i = size - 1;
  long long within = p - (i << shift);
  int drop = shift > KILN_FRACTION_BITS ? shift - KILN_FRACTION_BITS : 0;
  within = within >> drop;
  int s = shift - drop;
  long long product = ((long long)table[i + 1] - (long long)table[i]) * within;
  return (long long)table[i] + (s > 0 ? ((product + (1LL << (s - 1))) >> s) : product);
}
static inline long long kiln_clamp(long long i, long long size) { return i < 0 ? 0 : (i >= size ? size - 1 : i); }
"""
