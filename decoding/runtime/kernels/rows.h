// y[m][n] = sum_k x[m][k] * w[n][k] (+ b[n]) for a handful of rows m: the
// products of one decoding step (1 token) or one verification (k+1 tokens).
//
// Why not MKL: a small model's step is bound by streaming its weights, and
// checking 5 tokens reads the same weights as checking 1, but MKL's sgemm
// takes about twice as long for 5 rows as for 1 (see decoding/rowlinear.py).
// Here each block of 4 weight rows is read once and multiplied by up to 6
// input rows from registers, and the next rows are prefetched meanwhile.
//
// That is linear_rows, over w as it is; linear_panels below does the same
// over a packed copy of w and is what runs wherever the copy exists (N a
// multiple of the vector width): past 6 rows it reaches about 90% of the
// cores' arithmetic where linear_rows reaches 70%.
//
// Every y[m][n] is summed in the same order (one vector accumulator over k,
// then a fixed reduction) whatever the number of rows, their blocking, or
// which rows of w the call covers: a token's result never depends on what
// else is in the batch, so plain decoding (1 row) and verification (k+1
// rows) agree bit for bit, and a fused q/k/v product equals the three.
#pragma once
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#if defined(SPECLENS_PORTABLE)
// The same algorithm in the compiler's own vectors (GCC and Clang vector extensions), for any CPU:
// an ARM laptop, an x86 without AVX2, FMA and F16C. Multiplies and adds round apart (no fused
// multiply-add), so its bits differ from the x86 builds' but, as theirs, never with the batch.
typedef float vec __attribute__((vector_size(32)));
static const int kWidth = 8;
static inline vec vzero() { return vec{}; }
static inline vec vload(const float* p) {
  vec v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
static inline vec vfma(vec a, vec b, vec c) { return a * b + c; }
static inline vec vset(float a) { return vec{} + a; }
static inline void vstore(float* p, vec a) { __builtin_memcpy(p, &a, sizeof a); }
// The AVX2 build's pairing: lanes 4 apart, then 2, then 1.
static inline float vsum(vec a) {
  const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
  return (t0 + t2) + (t1 + t3);
}
static inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }
static inline void spin_pause() {}
// A float16's bits as the float32 of the same value (exact: every float16 is a float32).
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exp = h >> 10 & 0x1f, man = h & 0x3ffu;
  uint32_t bits = sign;
  if (exp == 0x1f) {
    bits |= 0x7f800000u | man << 13;  // infinity, NaN
  } else if (exp != 0) {
    bits |= (exp + 112) << 23 | man << 13;
  } else if (man != 0) {  // subnormal: shift the mantissa up to its leading 1
    uint32_t m = man, e = 113;
    while (!(m & 0x400u)) m <<= 1, e--;
    bits |= e << 23 | (m & 0x3ffu) << 13;
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}
static inline vec vload(const uint16_t* p) {
  vec v;
  for (int i = 0; i < kWidth; i++) v[i] = half_to_float(p[i]);
  return v;
}
#else
#include <immintrin.h>
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "needs AVX2, FMA and F16C, or -DSPECLENS_PORTABLE"
#endif
static inline void prefetch_l2(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T1); }
static inline void spin_pause() { _mm_pause(); }

#if defined(__AVX512F__)
#define SPECLENS_AVX512 1  // the 16-lane build: the sections below that need it test this
typedef __m512 vec;
static const int kWidth = 16;
static inline vec vzero() { return _mm512_setzero_ps(); }
static inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vec vload(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec vset(float a) { return _mm512_set1_ps(a); }
static inline void vstore(float* p, vec a) { _mm512_storeu_ps(p, a); }
static inline __m256 vhalf(vec a) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  return _mm256_add_ps(_mm512_castps512_ps256(a), hi);
}
#else
typedef __m256 vec;
static const int kWidth = 8;
static inline vec vzero() { return _mm256_setzero_ps(); }
static inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vec vload(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vset(float a) { return _mm256_set1_ps(a); }
static inline void vstore(float* p, vec a) { _mm256_storeu_ps(p, a); }
static inline __m256 vhalf(vec a) { return a; }
#endif

static inline float vsum(vec a) {
  __m256 s = vhalf(a);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}
#endif  // SPECLENS_PORTABLE

static const int kRowsOfW = 4;  // weight rows per block
static const int kRowsOfX = 6;  // input rows held in registers at once

// The choices that depend on the machine's memory rather than on its
// registers, measured at first use on each machine (runtime/tuning.py) and
// set by rowlinear_tune. None of them changes the order of any sum, so no
// result's bits depend on them. The defaults are the 2-core AMD EPYC's.
struct Tuning {
  int prefetch_rows = 8;     // linear_rows: weight rows ahead to prefetch (0: none)
  int chunk = 32;            // panels: steps of k per chunk
  int ahead = 2;             // panels: chunks ahead to prefetch
  int prefetch_one_tile = 0; // panels: software prefetch when all rows fit one tile too
  int threads = 0;           // threads a product or a step runs on (0: all OpenMP offers)
};
inline Tuning tuning;  // one for the whole library (C++17 inline variable), not one per source file

// The team of every parallel region: which thread computes what never changes a result's bits.
static inline int team() {
  const int all = omp_get_max_threads();
  return tuning.threads > 0 && tuning.threads < all ? tuning.threads : all;
}
// Prefetches go into L2, not L1: on a 2-core AMD EPYC (Zen 4) the whole
// model's products took 0.6-0.8 of their time with prefetches into L1 (1 to
// 17 rows, side by side), and ×1.2-1.6 theirs without any: a line headed for
// L1 holds one of the core's few L1 miss buffers for the whole trip from memory.

// y = x w^T (+ b) (+ r): r, a residual added to each result, may be y itself. The weights W are
// float32, or float16 (uint16_t, IEEE bits): those are widened exactly as they load, so a product
// over a float16 copy of weights that float16 holds exactly gives the float32 product's bits while
// streaming half the bytes.
template <int NB, int MB, typename W>
static inline void block(const float* x, const W* w, const float* b, const float* r, float* y,
                         int64_t K, int64_t N, int64_t n0, int64_t m0) {
  vec acc[NB][MB];
  for (int j = 0; j < NB; j++)
    for (int i = 0; i < MB; i++) acc[j][i] = vzero();
  const W* wr = w + n0 * K;
  const float* xr = x + m0 * K;
  const int ahead = tuning.prefetch_rows;
  for (int64_t k = 0; k < K; k += kWidth) {
    vec wv[NB];
    for (int j = 0; j < NB; j++) wv[j] = vload(wr + j * K + k);
    if (m0 == 0 && ahead > 0)  // one cache line of each coming row per step (a hint: past the end is harmless)
      for (int j = 0; j < NB; j++) prefetch_l2(wr + (ahead + j) * K + k);
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

template <int NB, typename W>
static void rows_of_w(const float* x, const W* w, const float* b, const float* r, float* y,
                      int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m0 = 0;
  for (; m0 + kRowsOfX <= M; m0 += kRowsOfX) block<NB, kRowsOfX, W>(x, w, b, r, y, K, N, n0, m0);
  switch (M - m0) {
    case 1: block<NB, 1, W>(x, w, b, r, y, K, N, n0, m0); break;
    case 2: block<NB, 2, W>(x, w, b, r, y, K, N, n0, m0); break;
    case 3: block<NB, 3, W>(x, w, b, r, y, K, N, n0, m0); break;
    case 4: block<NB, 4, W>(x, w, b, r, y, K, N, n0, m0); break;
    case 5: block<NB, 5, W>(x, w, b, r, y, K, N, n0, m0); break;
  }
}

// The product's share of the calling thread: an orphaned worksharing loop, so
// it splits the rows of w among the threads of an enclosing parallel region
// (the decoder layer's) or runs whole on a thread outside one.
template <typename W>
static inline void linear_rows(const float* x, const W* w, const float* b, const float* r, float* y,
                               int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = N / kRowsOfW;
#pragma omp for schedule(static) nowait  // the tail's loop below ends with the barrier
  for (int64_t nb = 0; nb < blocks; nb++) rows_of_w<kRowsOfW, W>(x, w, b, r, y, M, K, N, nb * kRowsOfW);
#pragma omp for schedule(static)
  for (int64_t n0 = blocks * kRowsOfW; n0 < N; n0++) rows_of_w<1, W>(x, w, b, r, y, M, K, N, n0);
}

// --- Panels: the same product over weights packed for it ------------------
//
// Past 6 rows the blocks above are bound by the cores' arithmetic (about 70%
// of it: a dot product per output ends in a horizontal sum, and an input
// row is reloaded for every block of weight rows). Here the weights are
// packed in panels of up to 4 vectors of output columns, the panel from
// column n0 holding w[n0 + c][k] at n0 * K + k * width + c, so one vector
// of weights meets one broadcast input value; each y[m][n] is one accumulator summed
// over k in order, whatever the rows, the tile or the panel (so, again, a
// token's results do not depend on the batch). K goes in chunks of kChunk
// steps: a chunk serves every tile of rows from L1 while the chunks after it
// are prefetched, spread over all the tiles' steps, so memory streams evenly
// instead of in bursts during the first tile. One tile (up to 6 rows) runs
// on the hardware's prefetchers alone: software prefetches there cost a
// 2-core AMD EPYC's 1 to 5 rows 5-20% while memory streamed at 44 GB/s
// (none at 29-32 GB/s), and past one tile they save a third.

static const int kPanelVectors = 4;  // at most

// Columns per panel for N outputs: 4 vectors, or 3 where 4 would leave an odd
// number of panels under 16 (SmolLM2's 576 outputs: 12 panels, not 9), so
// two threads get equal shares; a last panel may be narrower. Which panel a
// column sits in does not change its sum.
static inline int64_t panel_columns(int64_t N) {
  const int64_t wide = kPanelVectors * kWidth, narrow = (kPanelVectors - 1) * kWidth;
  const int64_t panels = (N + wide - 1) / wide;
  return panels % 2 == 1 && panels < 16 && N % narrow == 0 ? narrow : wide;
}
#if defined(SPECLENS_AVX512)
static const int kTileRows = 6;  // 24 accumulators of 32 registers
#else
static const int kTileRows = 2;  // 8 of 16
#endif
static const int kTiles = 4;  // tiles whose accumulators wait between chunks

// acc[R][V] (+= or =) over steps k0..k1 of panel p (V vectors wide); then back to buf. Tile
// `tile` of `tiles` prefetches the lines `ahead` steps ahead at every tiles-th step from its own
// (ahead 0: none).
template <int R, int V>
static inline void panel_tile(const float* x, const float* p, vec* buf, int64_t K, int64_t k0, int64_t k1,
                              bool first, int tile, int tiles, int64_t ahead) {
  vec acc[R][V];
  for (int i = 0; i < R; i++)
    for (int v = 0; v < V; v++) acc[i][v] = first ? vzero() : buf[i * kPanelVectors + v];
  int turn = tile;
  for (int64_t k = k0; k < k1; k++) {
    const float* pk = p + k * V * kWidth;
    vec wv[V];
    for (int v = 0; v < V; v++) wv[v] = vload(pk + v * kWidth);
    if (ahead > 0 && turn == 0)  // a hint: past the end is harmless
      for (int v = 0; v < V; v++) prefetch_l2(pk + (ahead * V + v) * kWidth);
    if (--turn < 0) turn = tiles - 1;
    for (int i = 0; i < R; i++) {
      const vec xv = vset(x[i * K + k]);
      for (int v = 0; v < V; v++) acc[i][v] = vfma(xv, wv[v], acc[i][v]);
    }
  }
  for (int i = 0; i < R; i++)
    for (int v = 0; v < V; v++) buf[i * kPanelVectors + v] = acc[i][v];
}

template <int V>
static inline void panel_tile_rows(int rows, const float* x, const float* p, vec* buf, int64_t K, int64_t k0,
                                   int64_t k1, bool first, int tile, int tiles, int64_t ahead) {
  switch (rows) {
    case 1: panel_tile<1, V>(x, p, buf, K, k0, k1, first, tile, tiles, ahead); break;
    case 2: panel_tile<2, V>(x, p, buf, K, k0, k1, first, tile, tiles, ahead); break;
#if defined(SPECLENS_AVX512)
    case 3: panel_tile<3, V>(x, p, buf, K, k0, k1, first, tile, tiles, ahead); break;
    case 4: panel_tile<4, V>(x, p, buf, K, k0, k1, first, tile, tiles, ahead); break;
    case 5: panel_tile<5, V>(x, p, buf, K, k0, k1, first, tile, tiles, ahead); break;
    case 6: panel_tile<6, V>(x, p, buf, K, k0, k1, first, tile, tiles, ahead); break;
#endif
  }
}

// Rows m0..m0+M of one panel (V vectors wide, its first column n0), up to kTiles tiles of rows.
template <int V>
static void panel_rows(const float* x, const float* p, const float* b, const float* r, float* y, int64_t M,
                       int64_t K, int64_t N, int64_t n0) {
  vec buf[kTiles][kTileRows * kPanelVectors];
  const int tiles = static_cast<int>((M + kTileRows - 1) / kTileRows);
  const int64_t chunk = tuning.chunk;
  const bool prefetch = tiles > 1 || tuning.prefetch_one_tile;
  const int64_t ahead = prefetch ? int64_t{tuning.ahead} * chunk : 0;
  for (int64_t k0 = 0; k0 < K; k0 += chunk) {
    const int64_t k1 = k0 + chunk < K ? k0 + chunk : K;
    for (int t = 0; t < tiles; t++) {
      const int64_t m0 = t * kTileRows;
      const int rows = static_cast<int>(M - m0 < kTileRows ? M - m0 : kTileRows);
      panel_tile_rows<V>(rows, x + m0 * K, p, buf[t], K, k0, k1, k0 == 0, t, tiles, ahead);
    }
  }
  for (int t = 0; t < tiles; t++)
    for (int64_t m = t * kTileRows; m < M && m < (t + 1) * kTileRows; m++)
      for (int v = 0; v < V; v++) {
        float out[kWidth];
        vstore(out, buf[t][(m - t * kTileRows) * kPanelVectors + v]);
        for (int c = 0; c < kWidth; c++) {
          const int64_t n = n0 + v * kWidth + c;
          float s = out[c];
          if (b) s += b[n];
          if (r) s = r[m * N + n] + s;
          y[m * N + n] = s;
        }
      }
}

// Panel pn (its first column pn * columns) for every row.
static inline void panel(const float* x, const float* panels, const float* b, const float* r, float* y, int64_t M,
                         int64_t K, int64_t N, int64_t columns, int64_t pn) {
  const int64_t n0 = pn * columns, width = std::min(columns, N - n0) / kWidth, group = kTiles * kTileRows;
  const float* p = panels + n0 * K;
  for (int64_t m0 = 0; m0 < M; m0 += group) {
    const int64_t rows = std::min(group, M - m0);
    const float *xm = x + m0 * K, *rm = r ? r + m0 * N : nullptr;
    float* ym = y + m0 * N;
    switch (width) {
      case 1: panel_rows<1>(xm, p, b, rm, ym, rows, K, N, n0); break;
      case 2: panel_rows<2>(xm, p, b, rm, ym, rows, K, N, n0); break;
      case 3: panel_rows<3>(xm, p, b, rm, ym, rows, K, N, n0); break;
      case 4: panel_rows<4>(xm, p, b, rm, ym, rows, K, N, n0); break;
    }
  }
}

// Which panels a thread computes. It starts on its own share of the static
// schedule, in order, so that its weights stream from memory as one run
// (panels handed out one by one streamed 15% slower); done with those, it
// takes panels from the back of the others' shares, so that a thread that
// falls behind, as one core of a shared machine often does, no longer keeps
// the others waiting at the barrier: on a 2-core AMD EPYC the thread done
// first waited 1-2 ms of a 17 ms step. A share's next front and back sit in
// one word with the product's number within the parallel region, so that
// each panel is claimed once and a share not yet set out is waited for.
// Which thread computes a panel does not change its bits.
struct alignas(64) Share {
  std::atomic<uint64_t> word{0};  // product << 40 | front << 20 | back; product 0: not set out yet
};

static inline uint64_t share_word(uint64_t product, uint64_t front, uint64_t back) {
  return product << 40 | front << 20 | back;
}

// The front panel of share s (its owner's) or the back one (another's) for `product`; -1 once empty.
static inline int64_t claim(Share& s, uint64_t product, bool front) {
  const uint64_t mask = (uint64_t{1} << 20) - 1;
  uint64_t w = s.word.load(std::memory_order_acquire);
  for (;;) {
    if (w >> 40 != product) {  // its owner has not reached this product yet
      spin_pause();
      w = s.word.load(std::memory_order_acquire);
      continue;
    }
    const uint64_t f = w >> 20 & mask, b = w & mask;
    if (f >= b) return -1;
    const uint64_t next = front ? share_word(product, f + 1, b) : share_word(product, f, b - 1);
    if (s.word.compare_exchange_weak(w, next, std::memory_order_acq_rel, std::memory_order_acquire))
      return static_cast<int64_t>(front ? f : b - 1);
  }
}

// y = x w^T (+ b) (+ r) from w's panels (pack_panels); N a multiple of kWidth. Orphaned, as
// linear_rows: `shares` has a Share for each thread of the enclosing region (zeroed when the
// region began), and `product` numbers this product among the region's, from 1.
static inline void linear_panels(const float* x, const float* panels, const float* b, const float* r, float* y,
                                 int64_t M, int64_t K, int64_t N, Share* shares, uint64_t product) {
  const int64_t columns = panel_columns(N), count = (N + columns - 1) / columns;
  const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
  const int64_t q = count / threads, extra = count % threads;  // the static schedule's shares
  const int64_t begin = t * q + std::min(t, extra), end = begin + q + (t < extra ? 1 : 0);
  shares[t].word.store(share_word(product, begin, end), std::memory_order_release);
  for (int64_t pn; (pn = claim(shares[t], product, true)) >= 0;) panel(x, panels, b, r, y, M, K, N, columns, pn);
  for (int64_t other = 1; other < threads; other++)
    for (int64_t pn; (pn = claim(shares[(t + other) % threads], product, false)) >= 0;)
      panel(x, panels, b, r, y, M, K, N, columns, pn);
#pragma omp barrier
}

// The product from panels where w has them, else from w's rows: float16 ones where `half` (w then
// points at uint16_t), else float32.
static inline void product(const float* x, const void* w, const float* panels, const float* b, const float* r,
                           float* y, int64_t M, int64_t K, int64_t N, Share* shares, uint64_t number,
                           bool half = false) {
  if (panels)
    linear_panels(x, panels, b, r, y, M, K, N, shares, number);
  else if (half)
    linear_rows(x, static_cast<const uint16_t*>(w), b, r, y, M, K, N);
  else
    linear_rows(x, static_cast<const float*>(w), b, r, y, M, K, N);
}
