// Llama decoder layers for a few rows, in one parallel region: SpecLens's
// default CPU step (decoding/llama.py).
//
// Why in C++: with the products at the memory limit (rows.h), what is left
// of a small model's step is everything around them. Run from Python, a
// step's ~600 small torch ops (norms, rotary embedding, attention, residual
// adds, SiLU) took a quarter of the step, and the products slowed beside
// them. Here the layers are one call: its threads stay in one region from
// the first layer's norm to the last layer's residual, and the small ops
// work on rows still in cache.
//
// Every row is computed on its own, in a fixed order, whatever else is in
// the batch, as the products are: a token checked with k others gets the
// bits it gets alone. The norm, SiLU and attention are also exported on
// their own, and the model's own modules call them (llama.py swaps them
// in), so Hugging Face's forward of the same model computes these bits too.
// Built with -ffp-contract=off: the rotary embedding and the residual adds
// then round as torch's elementwise ops do.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <vector>

#include "rows.h"

static inline float dot(const float* a, const float* b, int64_t n) {
  if (n % kWidth == 0) {
    vec acc = vzero();
    for (int64_t t = 0; t < n; t += kWidth) acc = vfma(vload(a + t), vload(b + t), acc);
    return vsum(acc);
  }
  float s = 0.f;
  for (int64_t t = 0; t < n; t++) s += a[t] * b[t];
  return s;
}

// y = w * (x / sqrt(mean(x^2) + eps)), one row.
static void rmsnorm_row(const float* x, const float* w, float* y, int64_t D, float eps) {
  const float inv = 1.f / std::sqrt(dot(x, x, D) / static_cast<float>(D) + eps);
  for (int64_t t = 0; t < D; t++) y[t] = w[t] * (x[t] * inv);
}

#if defined(SPECLENS_PORTABLE)
typedef int32_t ivec __attribute__((vector_size(32)));
static inline vec vadd(vec a, vec b) { return a + b; }
static inline vec vsub(vec a, vec b) { return a - b; }
static inline vec vmul(vec a, vec b) { return a * b; }
static inline vec vdiv(vec a, vec b) { return a / b; }
// As the x86 instructions do: the second operand where the comparison fails (a NaN included).
static inline vec vmax(vec a, vec b) {
  vec r;
  for (int i = 0; i < kWidth; i++) r[i] = a[i] > b[i] ? a[i] : b[i];
  return r;
}
static inline vec vclamp(vec a, float lo, float hi) {
  vec r;
  for (int i = 0; i < kWidth; i++) r[i] = std::min(std::max(a[i], lo), hi);
  return r;
}
static inline vec vfloor(vec a) {
  vec r;
  for (int i = 0; i < kWidth; i++) r[i] = std::floor(a[i]);
  return r;
}
static inline vec vpow2(vec n) {  // 2^n for whole n in [-126, 127], built from its exponent bits
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  vec r;
  __builtin_memcpy(&r, &bits, sizeof r);
  return r;
}
static inline vec vzero_below(vec x, float lo, vec y) {
  vec r;
  for (int i = 0; i < kWidth; i++) r[i] = x[i] >= lo ? y[i] : 0.f;
  return r;
}
#elif defined(SPECLENS_AVX512)
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline vec vclamp(vec a, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(a, vset(lo)), vset(hi)); }
static inline vec vfloor(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
static inline vec vpow2(vec n) {  // 2^n for whole n in [-126, 127], built from its exponent bits
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
static inline vec vzero_below(vec x, float lo, vec y) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, vset(lo), _CMP_GE_OQ), y);
}
#else
static inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm256_div_ps(a, b); }
static inline vec vclamp(vec a, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(a, vset(lo)), vset(hi)); }
static inline vec vfloor(vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
static inline vec vpow2(vec n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vec vzero_below(vec x, float lo, vec y) { return _mm256_and_ps(_mm256_cmp_ps(x, vset(lo), _CMP_GE_OQ), y); }
#endif

// e^x by Cephes' expf polynomial (relative error near 1e-7), exactly 0 below
// e^-87. Not libm's expf: a call per element cost a step of 17 tokens 6 ms
// in its SiLUs alone. Every lane is computed alone, so an element
// gets the same bits wherever it sits in a vector.
static inline vec vexp(vec x) {
  const vec c = vclamp(x, -87.f, 88.f);
  const vec n = vfloor(vadd(vmul(c, vset(1.44269504088896341f)), vset(0.5f)));
  vec r = vsub(c, vmul(n, vset(0.693359375f)));
  r = vsub(r, vmul(n, vset(-2.12194440e-4f)));
  vec p = vset(1.9875691500e-4f);
  for (float coefficient : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = vadd(vmul(p, r), vset(coefficient));
  const vec y = vadd(vadd(vmul(p, vmul(r, r)), r), vset(1.f));
  return vzero_below(x, -87.f, vmul(y, vpow2(n)));
}

// out[t] = silu(g[t]) (* u[t] where u is given) = g / (1 + e^-g) (* u).
static inline vec vsilu(vec g) { return vdiv(g, vadd(vset(1.f), vexp(vsub(vzero(), g)))); }

// f over n floats a vector at a time, the tail through a padded vector.
template <typename F>
static inline void each_vector(int64_t n, F f) {
  int64_t t = 0;
  for (; t + kWidth <= n; t += kWidth) f(t, kWidth);
  if (t < n) f(t, n - t);
}

static inline vec vload_part(const float* p, int64_t count) {
  if (count == kWidth) return vload(p);
  float pad[kWidth] = {};
  for (int64_t i = 0; i < count; i++) pad[i] = p[i];
  return vload(pad);
}

static inline void vstore_part(float* p, vec a, int64_t count) {
  if (count == kWidth) return vstore(p, a);
  float pad[kWidth];
  vstore(pad, a);
  for (int64_t i = 0; i < count; i++) p[i] = pad[i];
}

static void silu_mul(const float* g, const float* u, float* out, int64_t n) {
  each_vector(n, [&](int64_t t, int64_t count) {
    vec y = vsilu(vload_part(g + t, count));
    if (u) y = vmul(y, vload_part(u + t, count));
    vstore_part(out + t, y, count);
  });
}

// Llama's rotary embedding of one head's row, as transformers writes it:
// x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1].
static void rope(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t t = 0; t < h; t++) {
    const float a = x[t], b = x[t + h];
    x[t] = a * cos[t] + (-b) * sin[t];
    x[t + h] = b * cos[t + h] + a * sin[t + h];
  }
}

// Which keys a query row sees: every key up to its own position (kind 0),
// a boolean mask (1, true = seen) or an additive float mask (2, a tree's).
struct Mask {
  int kind;
  const void* data;
  int64_t row_stride;
};

// The largest of x[0..n) (-inf for none); a maximum has one value whatever the order.
static float max_of(const float* x, int64_t n) {
  vec top = vset(-INFINITY);
  int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth) top = vmax(top, vload(x + j));
  float lanes[kWidth], m = -INFINITY;
  vstore(lanes, top);
  for (float v : lanes) m = v > m ? v : m;
  for (; j < n; j++) m = x[j] > m ? x[j] : m;
  return m;
}

#if defined(SPECLENS_AVX512)
// The sums of 16 vectors at once: lane 4 q + l holds the sum of a[q + 4 l].
// Lanes are paired at the distances vsum pairs them (8, 4, 2, 1), so each
// sum has vsum's bits, for a quarter of the shuffles.
static inline __m512 vsum16(const __m512* a) {
  __m512 b[8], c[4], e[2];
  for (int p = 0; p < 8; p++)
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
  for (int p = 0; p < 4; p++)
    c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0xDD));
  for (int p = 0; p < 2; p++)
    e[p] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0x44), _mm512_shuffle_ps(c[2 * p], c[2 * p + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xDD));
}

// dot(q, k_j) for 16 keys from j, each with dot()'s bits: a key at a time,
// its row's D vectors in order, q's held in registers (with the 16 keys'
// loads interleaved, the compiler ran out of registers for their addresses).
template <int D>
static inline void dots16(const float* q, const float* k, int64_t k_stride, float* out) {
  __m512 qv[D], acc[16];
  for (int t = 0; t < D; t++) qv[t] = _mm512_loadu_ps(q + 16 * t);
  for (int i = 0; i < 16; i++) {
    const float* key = k + i * k_stride;
    __m512 a = _mm512_setzero_ps();
    for (int t = 0; t < D; t++) a = _mm512_fmadd_ps(_mm512_loadu_ps(key + 16 * t), qv[t], a);
    acc[i] = a;
  }
  float sums[16];
  _mm512_storeu_ps(sums, vsum16(acc));
  for (int q4 = 0; q4 < 4; q4++)
    for (int l = 0; l < 4; l++) out[q4 + 4 * l] = sums[4 * q4 + l];
}

// The scores of keys 0, 1, ... 16 at a time; how many that made.
template <int D>
static int64_t dots_by16(const float* q, const float* k, int64_t k_stride, int64_t seen, float* scores) {
  int64_t j = 0;
  for (; j + 16 <= seen; j += 16) dots16<D>(q, k + j * k_stride, k_stride, scores + j);
  return j;
}
#endif

// Every seen key's score, in order; a key masked out scores -inf.
static void scores_row(const float* q, const float* k, int64_t k_stride, int64_t d, float scale, int64_t seen,
                       const uint8_t* allowed, const float* add, float* scores) {
  int64_t j = 0;
#if defined(SPECLENS_AVX512)
  switch (d) {  // 64 and 128 are the common sizes; 16 and 32, the tests' tiny models'
    case 16: j = dots_by16<1>(q, k, k_stride, seen, scores); break;
    case 32: j = dots_by16<2>(q, k, k_stride, seen, scores); break;
    case 64: j = dots_by16<4>(q, k, k_stride, seen, scores); break;
    case 128: j = dots_by16<8>(q, k, k_stride, seen, scores); break;
  }
#endif
  for (; j < seen; j++) scores[j] = dot(q, k + j * k_stride, d);
  for (j = 0; j < seen; j++) {
    float s = scores[j] * scale;
    if (allowed && !allowed[j]) s = -INFINITY;
    if (add) s = s + add[j];
    scores[j] = s;
  }
}

// out = sum_j p_j v_j in order of j, in registers where the row fits them.
static void weighted_sum(const float* p, const float* v, int64_t v_stride, int64_t seen, int64_t d, float* out) {
  constexpr int64_t kMax = 8;
  if (d % kWidth == 0 && d / kWidth <= kMax) {
    vec acc[kMax];
    const int64_t parts = d / kWidth;
    for (int64_t u = 0; u < parts; u++) acc[u] = vzero();
    for (int64_t j = 0; j < seen; j++) {
      const vec pj = vset(p[j]);
      for (int64_t u = 0; u < parts; u++) acc[u] = vadd(acc[u], vmul(pj, vload(v + j * v_stride + u * kWidth)));
    }
    for (int64_t u = 0; u < parts; u++) vstore(out + u * kWidth, acc[u]);
    return;
  }
  for (int64_t t = 0; t < d; t++) out[t] = 0.f;
  for (int64_t j = 0; j < seen; j++)
    for (int64_t t = 0; t < d; t++) out[t] += p[j] * v[j * v_stride + t];
}

// out = softmax(q k^T * scale + mask) v for one query row and G heads that
// share their keys and values, each head's sums over the keys in order; a
// key masked out weighs exactly 0, so it adds nothing to a sum. The heads
// go together so that their sums, each a chain of dependent adds, overlap,
// and each value row is loaded once for all of them: one head at a time
// took ~6 ns a key on 2 cores, mostly waiting on those chains. Keys and
// values are left to the hardware's prefetchers: prefetches 64 rows ahead
// made 30 layers after 1,500 cached tokens 3-7% slower (1 to 9 rows).
template <int G>
static void attend_heads(const float* q, int64_t q_head, const float* k, int64_t k_stride, const float* v,
                         int64_t v_stride, float* out, int64_t L, int64_t d, float scale, int64_t row, int64_t past,
                         const Mask& mask, float* scores) {
  const int64_t seen = mask.kind == 0 ? past + row + 1 : L;
  const uint8_t* allowed = mask.kind == 1 ? static_cast<const uint8_t*>(mask.data) + row * mask.row_stride : nullptr;
  const float* add = mask.kind == 2 ? static_cast<const float*>(mask.data) + row * mask.row_stride : nullptr;
  float top[G], total[G];
  for (int h = 0; h < G; h++) {
    scores_row(q + h * q_head, k, k_stride, d, scale, seen, allowed, add, scores + h * L);
    top[h] = max_of(scores + h * L, seen);
    total[h] = 0.f;
  }
  for (int h = 0; h < G; h++)
    each_vector(seen, [&](int64_t j, int64_t count) {
      float* at = scores + h * L + j;
      vstore_part(at, vexp(vsub(vload_part(at, count), vset(top[h]))), count);
    });
  for (int64_t j = 0; j < seen; j++)
    for (int h = 0; h < G; h++) total[h] += scores[h * L + j];
  constexpr int64_t kParts = 4;  // d = 64 on AVX-512: G x 4 accumulators in registers
  if (d == kParts * kWidth) {
    vec acc[G][kParts];
    for (int h = 0; h < G; h++)
      for (int64_t u = 0; u < kParts; u++) acc[h][u] = vzero();
    for (int64_t j = 0; j < seen; j++) {
      vec vj[kParts];
      for (int64_t u = 0; u < kParts; u++) vj[u] = vload(v + j * v_stride + u * kWidth);
      for (int h = 0; h < G; h++) {
        const vec pj = vset(scores[h * L + j]);
        for (int64_t u = 0; u < kParts; u++) acc[h][u] = vadd(acc[h][u], vmul(pj, vj[u]));
      }
    }
    for (int h = 0; h < G; h++)
      for (int64_t u = 0; u < kParts; u++) vstore(out + h * d + u * kWidth, acc[h][u]);
  } else {
    for (int h = 0; h < G; h++) weighted_sum(scores + h * L, v, v_stride, seen, d, out + h * d);
  }
  for (int h = 0; h < G; h++)
    for (int64_t t = 0; t < d; t++) out[h * d + t] /= total[h];
}

// Scratch space of the calling thread for one use, at least n floats, kept
// between calls: a layer's buffers came fresh from malloc each time, zeroed,
// and those over 128 KB (9 rows' worth) mapped anew, page faults and all.
enum Scratch { kLayerRows, kOwnRows, kScores, kUses };
static float* scratch(Scratch use, int64_t n) {
  thread_local std::vector<float> buffers[kUses];
  std::vector<float>& buffer = buffers[use];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

struct Attention {
  const float* q;  // row r, head h at q + r * q_row + h * q_head
  int64_t q_row, q_head;
  const float* k;  // key head g, position j at k + g * k_head + j * k_stride
  int64_t k_head, k_stride;
  const float* v;  // likewise
  int64_t v_head, v_stride;
  float* out;  // [n, heads * d]
  int64_t n, L, heads, kv_heads, d;
  float scale;
  Mask mask;
};

static const int kHeadsTogether = 4;  // at most: G x 4 accumulators of 32 registers

// attend_heads for 1 to kHeadsTogether heads sharing their keys: the count picks the instance.
static void attend_group(int64_t heads, const float* q, int64_t q_head, const float* k, int64_t k_stride,
                         const float* v, int64_t v_stride, float* out, int64_t L, int64_t d, float scale,
                         int64_t row, int64_t past, const Mask& mask, float* scores) {
  switch (heads) {
#define SPECLENS_ATTEND(G)                                                                              \
  case G:                                                                                                \
    attend_heads<G>(q, q_head, k, k_stride, v, v_stride, out, L, d, scale, row, past, mask, scores); \
    break;
    SPECLENS_ATTEND(1)
    SPECLENS_ATTEND(2)
    SPECLENS_ATTEND(3)
    SPECLENS_ATTEND(4)
#undef SPECLENS_ATTEND
  }
}

static void attention_rows(const Attention& a) {
  const int64_t group = a.heads / a.kv_heads, past = a.L - a.n;
  const int64_t together = std::min<int64_t>(group, kHeadsTogether);
  const int64_t parts = (group + together - 1) / together;  // tasks per row and key/value head
  float* scores = scratch(kScores, together * a.L);
  // Key/value head major: the tasks that read one head's keys and values run
  // one after another on a thread, so after the first they come from cache.
#pragma omp for schedule(static)
  for (int64_t task = 0; task < a.n * a.kv_heads * parts; task++) {
    const int64_t g = task / (a.n * parts), r = task / parts % a.n, h0 = g * group + task % parts * together;
    const int64_t heads = std::min(together, g * group + group - h0);
    const float *q = a.q + r * a.q_row + h0 * a.q_head, *k = a.k + g * a.k_head, *v = a.v + g * a.v_head;
    float* out = a.out + (r * a.heads + h0) * a.d;
    attend_group(heads, q, a.q_head, k, a.k_stride, v, a.v_stride, out, a.L, a.d, a.scale, r, past, a.mask, scores);
  }
}

struct Layer {
  const float *input_norm, *qkv, *qkv_bias, *o, *o_bias, *post_norm, *gate_up, *gate_up_bias, *down,
      *down_bias;
  const float *qkv_panels, *o_panels, *gate_up_panels, *down_panels;  // rows.h's panels, or null
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps, scale;
  int64_t half;  // 1: qkv, o, gate_up and down are float16 rows (uint16_t bits), without panels
};

// Where a layer keeps its keys and values: [kv_heads, capacity, head_dim].
struct LayerCache {
  float *k, *v;
  int64_t capacity;
};

// The model's final norm and output layer, over the last `keep` rows; or, in a
// step over several sequences with `last_of_each` set, over each one's last row
// (keep is then their number): a draft head drafting for a batch needs no more.
struct Head {
  const float* norm;  // [hidden]
  float eps;
  const float *w, *panels, *bias;  // w [vocab, hidden], its panels (or null), bias (or null)
  int64_t hidden, vocab, keep;
  float* logits;  // [keep, vocab]
  int64_t half;   // 1: w is float16 rows (uint16_t bits), without panels
  int64_t last_of_each;
};

// One sequence's rows in a step over several (a batch): rows [first, first + n)
// of the step, after `past` tokens of its own cache, seen through its own mask.
struct Segment {
  int64_t first, n, past;
  const LayerCache* caches;  // its cache of each layer of the call, from the call's first
  Mask mask;
};

// The rows a run of layers takes, after `past` cached ones; or, where
// `segments` is more than 0, the rows of that many sequences, one after
// another, each with its own cache (the step's past, mask and caches then
// unused): the products run over all the rows at once, the rotary
// embedding, the cache writes and attention sequence by sequence.
struct Step {
  const float* in;  // [n, hidden]
  float* out;       // [n, hidden]: each layer's output in turn, in place
  int64_t n, past;
  const float *cos, *sin;  // [n, head_dim]
  Mask mask;
  const Head* head;  // after the last layer, or null
  int64_t segments;
  const Segment* segment;
};

// The step's sequences (one, made of the step's own fields, where it names none)
// and, for each row, the sequence it belongs to.
struct Rows {
  std::vector<Segment> segments;
  std::vector<int64_t> owner;
  int64_t longest = 0;  // the most keys a row of theirs attends to
};

static Rows rows_of(const Step& s, const LayerCache* caches) {
  Rows rows;
  if (s.segments > 0)
    rows.segments.assign(s.segment, s.segment + s.segments);
  else
    rows.segments.push_back({0, s.n, s.past, caches, s.mask});
  rows.owner.resize(s.n);
  for (int64_t j = 0; j < static_cast<int64_t>(rows.segments.size()); j++) {
    const Segment& g = rows.segments[j];
    for (int64_t r = g.first; r < g.first + g.n; r++) rows.owner[r] = j;
    rows.longest = std::max(rows.longest, g.past + g.n);
  }
  return rows;
}

// What an EAGLE-3 head's layer reads besides its residual stream (the feature
// rows): the next tokens' embeddings [n, hidden] and the norm it gives the features.
struct EagleInput {
  const float *emb, *hidden_norm;
};

// attention_rows over the rows of every sequence of a step, each reading its
// own cache: one task list for all of them, so the threads meet at one
// barrier per layer however many sequences there are. A row's sums are
// those it gets alone.
static void attention_segments(const Layer* l, int64_t layer, const Rows& rows, const float* qkv, float* attended) {
  const int64_t d = l->head_dim, QKV = (l->heads + 2 * l->kv_heads) * d, n = rows.owner.size();
  const int64_t group = l->heads / l->kv_heads, together = std::min<int64_t>(group, kHeadsTogether);
  const int64_t parts = (group + together - 1) / together;
  float* scores = scratch(kScores, together * rows.longest);
#pragma omp for schedule(static)
  for (int64_t task = 0; task < n * l->kv_heads * parts; task++) {
    const int64_t g = task / (n * parts), r = task / parts % n, h0 = g * group + task % parts * together;
    const int64_t heads = std::min(together, g * group + group - h0);
    const Segment& own = rows.segments[rows.owner[r]];
    const LayerCache& c = own.caches[layer];
    const int64_t L = own.past + own.n, at = g * c.capacity * d;
    const float* q = qkv + r * QKV + h0 * d;
    float* out = attended + (r * l->heads + h0) * d;
    attend_group(heads, q, d, c.k + at, d, c.v + at, d, out, L, d, l->scale, r - own.first, own.past, own.mask,
                 scores);
  }
}

// A layer's intermediate rows that the threads share: qkv [n, QKV], attended [n, Q], gate_up [n, 2I].
static int64_t buffer_floats(const Layer* l, int64_t n) {
  const int64_t d = l->head_dim, Q = l->heads * d, QKV = Q + 2 * l->kv_heads * d;
  return n * (QKV + Q + 2 * l->intermediate);
}

// Layer l over the rows x (its input, replaced by its output: each row of the
// residual is read before its sum is written) inside a parallel region; its
// products are numbered from `number` among the region's.
//
// Every thread normalises all the rows, and applies SiLU to all of them, into
// rows of its own (normed [n, D], act [n, I]) that only its products read:
// split by rows, each thread read the rows the other had just written, then
// waited at a barrier. When a shared machine places the two cores apart (its
// memory then streams at ~50 GB/s rather than ~33, but reading what the other
// core just wrote takes 2.5 times as long and a barrier twice as long),
// those exchanges cost more than the work: on a 2-core AMD EPYC, doing it all
// twice made 1, 5 and 9 rows 0.2-0.35 ms (2%) faster there, and no slower
// otherwise.
//
// An EAGLE-3 head's layer (`eagle` given) attends over [input_norm(embedding) ;
// hidden_norm(x)], twice the hidden width, while x stays the residual stream.
static void layer_rows(const Layer* l, int64_t layer, const Rows& rows, const Step& s, float* x, float* buffers,
                       Share* shares, uint64_t number, const EagleInput* eagle = nullptr) {
  const int64_t n = s.n, D = l->hidden, d = l->head_dim, I = l->intermediate;
  const int64_t Q = l->heads * d, KV = l->kv_heads * d, QKV = Q + 2 * KV, K = eagle ? 2 * D : D;
  float *qkv = buffers, *attended = qkv + n * QKV, *gate_up = attended + n * Q;
  float *normed = scratch(kOwnRows, n * (K + I)), *act = normed + n * K;
  for (int64_t r = 0; r < n; r++) {
    if (eagle) {
      rmsnorm_row(eagle->emb + r * D, l->input_norm, normed + r * K, D, l->eps);
      rmsnorm_row(x + r * D, eagle->hidden_norm, normed + r * K + D, D, l->eps);
    } else {
      rmsnorm_row(x + r * D, l->input_norm, normed + r * D, D, l->eps);
    }
  }
  product(normed, l->qkv, l->qkv_panels, l->qkv_bias, nullptr, qkv, n, K, QKV, shares, number, l->half);
#pragma omp for schedule(static)
  for (int64_t r = 0; r < n; r++) {
    const Segment& own = rows.segments[rows.owner[r]];
    const LayerCache& c = own.caches[layer];
    float* row = qkv + r * QKV;
    const float *cos = s.cos + r * d, *sin = s.sin + r * d;
    for (int64_t h = 0; h < l->heads; h++) rope(row + h * d, cos, sin, d);
    for (int64_t g = 0; g < l->kv_heads; g++) {
      float* key = row + Q + g * d;
      const float* value = row + Q + KV + g * d;
      rope(key, cos, sin, d);
      const int64_t at = (g * c.capacity + own.past + r - own.first) * d;
      for (int64_t t = 0; t < d; t++) c.k[at + t] = key[t], c.v[at + t] = value[t];
    }
  }
  attention_segments(l, layer, rows, qkv, attended);
  product(attended, l->o, l->o_panels, l->o_bias, x, x, n, Q, D, shares, number + 1, l->half);
  for (int64_t r = 0; r < n; r++) rmsnorm_row(x + r * D, l->post_norm, normed + r * D, D, l->eps);
  product(normed, l->gate_up, l->gate_up_panels, l->gate_up_bias, nullptr, gate_up, n, D, 2 * I, shares,
          number + 2, l->half);
  for (int64_t r = 0; r < n; r++) silu_mul(gate_up + r * 2 * I, gate_up + r * 2 * I + I, act + r * I, I);
  product(act, l->down, l->down_panels, l->down_bias, x, x, n, I, D, shares, number + 3, l->half);
}

// The logits of the head's rows of x [n, hidden] (see Head), in a parallel
// region, each thread normalising them into rows of its own (as layer_rows does).
static void head_rows(const Head& h, const Rows& rows, const float* x, int64_t n, Share* shares, uint64_t number) {
  const int64_t D = h.hidden;
  float* normed = scratch(kOwnRows, h.keep * D);
  for (int64_t r = 0; r < h.keep; r++) {
    const Segment* own = h.last_of_each ? &rows.segments[r] : nullptr;
    const int64_t row = own ? own->first + own->n - 1 : n - h.keep + r;
    rmsnorm_row(x + row * D, h.norm, normed + r * D, D, h.eps);
  }
  product(normed, h.w, h.panels, h.bias, nullptr, h.logits, h.keep, D, h.vocab, shares, number, h.half);
}

// `count` consecutive layers over the step's rows in one parallel region, and
// then the step's head if it has one: the threads go from layer to layer
// without returning to Python, which cost about 10 microseconds a layer, and
// the head follows with no Python between. Python run straight after a step
// starts with its caches emptied by the weights streamed through them: a
// tensor allocated there took 85 microseconds, the final norm's call 40.
extern "C" void llama_layers(const Layer* layers, const LayerCache* caches, int64_t count, const Step* s) {
  int64_t floats = 0;
  for (int64_t i = 0; i < count; i++) floats = std::max(floats, buffer_floats(&layers[i], s->n));
  float* buffers = scratch(kLayerRows, floats);
  std::vector<Share> shares(omp_get_max_threads());
  const Rows rows = rows_of(*s, caches);
  if (count > 0 && s->out != s->in) std::copy(s->in, s->in + s->n * layers[0].hidden, s->out);
#pragma omp parallel num_threads(team())
  {
    for (int64_t i = 0; i < count; i++)
      layer_rows(&layers[i], i, rows, *s, s->out, buffers, shares.data(), 4 * i + 1);
    if (s->head) head_rows(*s->head, rows, s->out, s->n, shares.data(), 4 * count + 1);
  }
}

// One step of an EAGLE-3 draft head (decoding/drafts/head/kernel.py): its
// decoder layer over the step's rows (s->in: the features, s->out: the
// head's outputs) and, where s->head is given, its norm and output layer.
extern "C" void eagle_layer(const Layer* layer, const LayerCache* cache, const EagleInput* eagle, const Step* s) {
  float* buffers = scratch(kLayerRows, buffer_floats(layer, s->n));
  std::vector<Share> shares(omp_get_max_threads());
  const Rows rows = rows_of(*s, cache);
  if (s->out != s->in) std::copy(s->in, s->in + s->n * layer->hidden, s->out);
#pragma omp parallel num_threads(team())
  {
    layer_rows(layer, 0, rows, *s, s->out, buffers, shares.data(), 1, eagle);
    if (s->head) head_rows(*s->head, rows, s->out, s->n, shares.data(), 5);
  }
}

// The same pieces for the model's own modules (llama.py).

extern "C" void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t D, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; r++) rmsnorm_row(x + r * D, w, y + r * D, D, eps);
}

extern "C" void silu_rows(const float* x, float* y, int64_t n) { silu_mul(x, nullptr, y, n); }

extern "C" void attention(const Attention* a) {
#pragma omp parallel num_threads(team())
  attention_rows(*a);
}

// The structs' sizes and the offsets of the fields added last, for llama.py's ctypes mirrors to be
// checked against (tests/test_batch.py): a mismatch would read garbage, not fail.
extern "C" void struct_layout(int64_t* out) {
  const int64_t layout[] = {
      sizeof(Mask),     sizeof(Layer),        sizeof(LayerCache), sizeof(Head),
      sizeof(Segment),  offsetof(Segment, caches), offsetof(Segment, mask), sizeof(Step),
      offsetof(Step, head), offsetof(Step, segments), offsetof(Step, segment), sizeof(Attention),
      offsetof(Head, last_of_each),
  };
  std::copy(std::begin(layout), std::end(layout), out);
}
