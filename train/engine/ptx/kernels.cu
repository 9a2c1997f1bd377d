// Kernels of ringtrain's CUDA engine. Each is the body of one function in
// ../threads.go (same name, same arithmetic), which the host engine runs and
// the tests check; change the two together. Every parameter is 8 bytes
// (pointers and long long): gorgonia.org/cu copies kernel arguments as
// 64-bit words. Regenerate kernels.ptx with `go generate ./train/engine/ptx`
// (needs nvcc; `make ptx` fetches one).

typedef long long i64;

__device__ __forceinline__ i64 tid() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }

extern "C" __global__ void im2col(const float* x, float* col, i64 C, i64 H, i64 W, i64 K, i64 pad, i64 OH, i64 OW) {
  i64 i = tid();
  if (i >= C * K * K * OH * OW) return;
  i64 ox = i % OW;
  i64 oy = (i / OW) % OH;
  i64 r = i / (OW * OH);
  i64 kx = r % K;
  i64 ky = (r / K) % K;
  i64 c = r / (K * K);
  i64 y = oy + ky - pad;
  i64 xx = ox + kx - pad;
  float v = 0.f;
  if (y >= 0 && y < H && xx >= 0 && xx < W) v = x[(c * H + y) * W + xx];
  col[i] = v;
}

extern "C" __global__ void col2im(const float* col, float* dx, i64 C, i64 H, i64 W, i64 K, i64 pad, i64 OH, i64 OW) {
  i64 i = tid();
  if (i >= C * H * W) return;
  i64 xx = i % W;
  i64 y = (i / W) % H;
  i64 c = i / (W * H);
  float sum = 0.f;
  for (i64 ky = 0; ky < K; ky++) {
    i64 oy = y + pad - ky;
    if (oy < 0 || oy >= OH) continue;
    for (i64 kx = 0; kx < K; kx++) {
      i64 ox = xx + pad - kx;
      if (ox < 0 || ox >= OW) continue;
      i64 r = (c * K + ky) * K + kx;
      sum += col[r * OH * OW + oy * OW + ox];
    }
  }
  dx[i] = sum;
}

extern "C" __global__ void bias_add(float* y, const float* b, i64 n, i64 cols, i64 inner) {
  i64 i = tid();
  if (i >= n) return;
  y[i] += b[(i / inner) % cols];
}

extern "C" __global__ void bias_grad(const float* dy, float* db, i64 rows, i64 cols, i64 inner) {
  i64 j = tid();
  if (j >= cols) return;
  float sum = 0.f;
  for (i64 r = 0; r < rows; r++) {
    i64 base = (r * cols + j) * inner;
    for (i64 k = 0; k < inner; k++) sum += dy[base + k];
  }
  db[j] = sum;
}

extern "C" __global__ void relu(const float* x, float* y, i64 n) {
  i64 i = tid();
  if (i >= n) return;
  float v = x[i];
  if (v < 0.f) v = 0.f;
  y[i] = v;
}

extern "C" __global__ void relu_backward(const float* y, const float* dy, float* dx, i64 n) {
  i64 i = tid();
  if (i >= n) return;
  float v = 0.f;
  if (y[i] > 0.f) v = dy[i];
  dx[i] = v;
}

extern "C" __global__ void max_pool(const float* x, float* y, i64 planes, i64 H, i64 W, i64 K, i64 OH, i64 OW) {
  i64 i = tid();
  if (i >= planes * OH * OW) return;
  i64 ox = i % OW;
  i64 oy = (i / OW) % OH;
  i64 p = i / (OW * OH);
  i64 base = p * H * W;
  float best = x[base + (oy * K) * W + ox * K];
  for (i64 ky = 0; ky < K; ky++)
    for (i64 kx = 0; kx < K; kx++) {
      float v = x[base + (oy * K + ky) * W + ox * K + kx];
      if (v > best) best = v;
    }
  y[i] = best;
}

extern "C" __global__ void max_pool_backward(const float* x, const float* dy, float* dx, i64 planes, i64 H, i64 W, i64 K, i64 OH, i64 OW) {
  i64 i = tid();
  if (i >= planes * H * W) return;
  i64 xx = i % W;
  i64 y = (i / W) % H;
  i64 p = i / (W * H);
  i64 oy = y / K, ox = xx / K;
  float v = 0.f;
  if (oy < OH && ox < OW) {
    i64 base = p * H * W;
    i64 arg = base + (oy * K) * W + ox * K;
    for (i64 ky = 0; ky < K; ky++)
      for (i64 kx = 0; kx < K; kx++) {
        i64 j = base + (oy * K + ky) * W + ox * K + kx;
        if (x[j] > x[arg]) arg = j;
      }
    if (arg == i) v = dy[(p * OH + oy) * OW + ox];
  }
  dx[i] = v;
}

extern "C" __global__ void softmax_xent(const float* logits, const float* labels, float* grad, float* loss, i64 rows, i64 n, i64 classes) {
  i64 r = tid();
  if (r >= rows) return;
  const float* row = logits + r * classes;
  float* g = grad + r * classes;
  if (r >= n) {
    for (i64 k = 0; k < classes; k++) g[k] = 0.f;
    loss[r] = 0.f;
    return;
  }
  float m = row[0];
  for (i64 k = 1; k < classes; k++) if (row[k] > m) m = row[k];
  float sum = 0.f;
  for (i64 k = 0; k < classes; k++) sum += expf(row[k] - m);
  i64 label = (i64)labels[r];
  float inv = 1.f / (float)n;
  for (i64 k = 0; k < classes; k++) {
    float p = expf(row[k] - m) / sum;
    if (k == label) p -= 1.f;
    g[k] = p * inv;
  }
  loss[r] = logf(sum) - (row[label] - m);
}
