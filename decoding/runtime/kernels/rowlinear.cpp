// The linear layers' product for a handful of rows (rows.h has the why and
// the how); decoding/rowlinear.py calls it for every float32 linear layer.
#include <algorithm>
#include <iterator>
#include <vector>

#include "rows.h"

extern "C" int rowlinear_width() { return kWidth; }

// The build's choices, for the probe to print: vector width, weight rows and input rows per block,
// the panels' tile rows and tiles; then the measured ones (Tuning in rows.h): weight rows prefetched
// ahead, the panels' chunk steps, chunks prefetched ahead, prefetching within one tile, threads.
extern "C" void rowlinear_settings(int64_t* out) {
  const int64_t settings[] = {kWidth,        kRowsOfW,      kRowsOfX,     kTileRows,
                              kTiles,        tuning.prefetch_rows, tuning.chunk, tuning.ahead,
                              tuning.prefetch_one_tile, tuning.threads};
  std::copy(std::begin(settings), std::end(settings), out);
}

// Sets the measured choices, in rowlinear_settings' order (its last four); call it between products.
extern "C" void rowlinear_tune(const int64_t* choices) {
  tuning.prefetch_rows = static_cast<int>(choices[0]);
  tuning.chunk = static_cast<int>(std::max<int64_t>(1, choices[1]));
  tuning.ahead = static_cast<int>(choices[2]);
  tuning.prefetch_one_tile = static_cast<int>(choices[3]);
  tuning.threads = static_cast<int>(std::max<int64_t>(0, choices[4]));
}

// x [M, K], w [N, K], b [N] or null, y [M, N]; all float32, contiguous; K a multiple of the width.
extern "C" void rowlinear(const float* x, const float* w, const float* b, float* y, int64_t M,
                          int64_t K, int64_t N) {
#pragma omp parallel num_threads(team())
  linear_rows(x, w, b, nullptr, y, M, K, N);
}

// The same product over float16 weights (their IEEE bits), widened exactly as they load.
extern "C" void rowlinear_half(const float* x, const uint16_t* w, const float* b, float* y, int64_t M, int64_t K,
                               int64_t N) {
#pragma omp parallel num_threads(team())
  linear_rows(x, w, b, nullptr, y, M, K, N);
}

// The same product from w's panels (pack_panels); N also a multiple of the width.
extern "C" void rowlinear_panels(const float* x, const float* panels, const float* b, float* y, int64_t M,
                                 int64_t K, int64_t N) {
  std::vector<Share> shares(omp_get_max_threads());
#pragma omp parallel num_threads(team())
  linear_panels(x, panels, b, nullptr, y, M, K, N, shares.data(), 1);
}

// w [N, K] into panels [N * K] as rows.h lays them out.
extern "C" void pack_panels(const float* w, float* panels, int64_t K, int64_t N) {
  const int64_t columns = panel_columns(N);
#pragma omp parallel for schedule(static)
  for (int64_t n0 = 0; n0 < N; n0 += columns) {
    const int64_t width = std::min(columns, N - n0);
    for (int64_t k = 0; k < K; k++)
      for (int64_t c = 0; c < width; c++) panels[n0 * K + k * width + c] = w[(n0 + c) * K + k];
  }
}
