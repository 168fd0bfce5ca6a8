// The linear layers' product for a handful of rows (rows.h has the why and
// the how); decoding/rowlinear.py calls it for every float32 linear layer.
#include "rows.h"

extern "C" int rowlinear_width() { return kWidth; }

// x [M, K], w [N, K], b [N] or null, y [M, N]; all float32, contiguous; K a multiple of the width.
extern "C" void rowlinear(const float* x, const float* w, const float* b, float* y, int64_t M,
                          int64_t K, int64_t N) {
#pragma omp parallel
  linear_rows(x, w, b, nullptr, y, M, K, N);
}
