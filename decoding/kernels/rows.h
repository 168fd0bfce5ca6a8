// y[m][n] = sum_k x[m][k] * w[n][k] (+ b[n]) for a handful of rows m: the
// products of one decoding step (1 token) or one verification (k+1 tokens).
//
// Why not MKL: a small model's step is bound by streaming its weights, and
// checking 5 tokens reads the same weights as checking 1, but MKL's sgemm
// takes about twice as long for 5 rows as for 1 (see decoding/rowlinear.py).
// Here each block of 4 weight rows is read once and multiplied by up to 6
// input rows from registers, and the next rows are prefetched meanwhile.
//
// Every y[m][n] is summed in the same order (one vector accumulator over k,
// then a fixed reduction) whatever the number of rows, their blocking, or
// which rows of w the call covers: a token's result never depends on what
// else is in the batch, so plain decoding (1 row) and verification (k+1
// rows) agree bit for bit, and a fused q/k/v product equals the three.
#pragma once
#include <immintrin.h>

#include <cstdint>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "needs AVX2 and FMA"
#endif

#if defined(__AVX512F__)
typedef __m512 vec;
static const int kWidth = 16;
static inline vec vzero() { return _mm512_setzero_ps(); }
static inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline __m256 vhalf(vec a) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  return _mm256_add_ps(_mm512_castps512_ps256(a), hi);
}
#else
typedef __m256 vec;
static const int kWidth = 8;
static inline vec vzero() { return _mm256_setzero_ps(); }
static inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline __m256 vhalf(vec a) { return a; }
#endif

static inline float vsum(vec a) {
  __m256 s = vhalf(a);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}

static const int kRowsOfW = 4;   // weight rows per block
static const int kRowsOfX = 6;   // input rows held in registers at once
static const int kPrefetch = 8;  // weight rows ahead to prefetch
// Into L2, not L1: on a 2-core AMD EPYC (Zen 4) the whole model's products
// took 0.6-0.8 of their time with prefetches into L1 (1 to 17 rows, side by
// side), and ×1.2-1.6 theirs without any: a line headed for L1 holds one of
// the core's few L1 miss buffers for the whole trip from memory.

// y = x w^T (+ b) (+ r): r, a residual added to each result, may be y itself.
template <int NB, int MB>
static inline void block(const float* x, const float* w, const float* b, const float* r, float* y,
                         int64_t K, int64_t N, int64_t n0, int64_t m0) {
  vec acc[NB][MB];
  for (int j = 0; j < NB; j++)
    for (int i = 0; i < MB; i++) acc[j][i] = vzero();
  const float* wr = w + n0 * K;
  const float* xr = x + m0 * K;
  for (int64_t k = 0; k < K; k += kWidth) {
    vec wv[NB];
    for (int j = 0; j < NB; j++) wv[j] = vload(wr + j * K + k);
    if (m0 == 0)  // one cache line of each coming row per step (a hint: past the end is harmless)
      for (int j = 0; j < NB; j++) _mm_prefetch((const char*)(wr + (kPrefetch + j) * K + k), _MM_HINT_T1);
    for (int i = 0; i < MB; i++) {
      vec xv = vload(xr + i * K + k);
      for (int j = 0; j < NB; j++) acc[j][i] = vfma(wv[j], xv, acc[j][i]);
    }
  }
  for (int i = 0; i < MB; i++)
    for (int j = 0; j < NB; j++) {
      float s = vsum(acc[j][i]);
      if (b) s += b[n0 + j];
      if (r) s = r[(m0 + i) * N + n0 + j] + s;
      y[(m0 + i) * N + n0 + j] = s;
    }
}

template <int NB>
static void rows_of_w(const float* x, const float* w, const float* b, const float* r, float* y,
                      int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m0 = 0;
  for (; m0 + kRowsOfX <= M; m0 += kRowsOfX) block<NB, kRowsOfX>(x, w, b, r, y, K, N, n0, m0);
  switch (M - m0) {
    case 1: block<NB, 1>(x, w, b, r, y, K, N, n0, m0); break;
    case 2: block<NB, 2>(x, w, b, r, y, K, N, n0, m0); break;
    case 3: block<NB, 3>(x, w, b, r, y, K, N, n0, m0); break;
    case 4: block<NB, 4>(x, w, b, r, y, K, N, n0, m0); break;
    case 5: block<NB, 5>(x, w, b, r, y, K, N, n0, m0); break;
  }
}

// The product's share of the calling thread: an orphaned worksharing loop, so
// it splits the rows of w among the threads of an enclosing parallel region
// (the decoder layer's) or runs whole on a thread outside one.
static inline void linear_rows(const float* x, const float* w, const float* b, const float* r, float* y,
                               int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = N / kRowsOfW;
#pragma omp for schedule(static) nowait  // the tail's loop below ends with the barrier
  for (int64_t nb = 0; nb < blocks; nb++) rows_of_w<kRowsOfW>(x, w, b, r, y, M, K, N, nb * kRowsOfW);
#pragma omp for schedule(static)
  for (int64_t n0 = blocks * kRowsOfW; n0 < N; n0++) rows_of_w<1>(x, w, b, r, y, M, K, N, n0);
}
