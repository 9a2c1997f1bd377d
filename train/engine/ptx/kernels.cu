// Kernels of ringtrain's CUDA engine. Each is the body of one function in
// ../threads.go (same name, same arithmetic), which the host engine runs and
// the tests check; change the two together. Every parameter is 8 bytes
// (pointers and long long): gorgonia.org/cu copies kernel arguments as
// 64-bit words. Regenerate kernels.ptx with `go generate ./train/engine/ptx`
// (needs nvcc; `make ptx` fetches one).

typedef long long i64;

__device__ __forceinline__ i64 tid() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }

// divi and modi divide nonnegative indices: in 32 bits where small (every
// index the kernel forms is below 2^32, the same for all its threads), a
// few instructions, instead of 64-bit division's long subroutine, which
// made the elementwise kernels that place their thread by division bound
// by arithmetic rather than memory.
__device__ __forceinline__ i64 divi(i64 a, i64 b, bool small) { return small ? (i64)((unsigned)a / (unsigned)b) : a / b; }
__device__ __forceinline__ i64 modi(i64 a, i64 b, bool small) { return small ? (i64)((unsigned)a % (unsigned)b) : a % b; }
__device__ __forceinline__ bool fits32(i64 n) { return n >= 0 && n <= 0xffffffffLL; }

// im2col_batch unrolls a batch x (B×C×H×W) into col, (C·K·K) × (B·OH·OW):
// row r is a kernel tap (c, ky, kx), column s·OH·OW + p sample s's output
// position p, so one GEMM with the weights convolves the whole batch.
extern "C" __global__ void im2col_batch(const float* x, float* col, i64 B, i64 C, i64 H, i64 W, i64 K, i64 pad, i64 OH, i64 OW) {
  i64 i = tid();
  i64 P = OH * OW;
  if (i >= C * K * K * B * P) return;
  bool sm = fits32(C * K * K * B * P) && fits32(B * C * H * W);
  i64 p = modi(i, P, sm);
  i64 s = modi(divi(i, P, sm), B, sm);
  i64 r = divi(i, P * B, sm);
  i64 ox = modi(p, OW, sm);
  i64 oy = divi(p, OW, sm);
  i64 kx = modi(r, K, sm);
  i64 ky = modi(divi(r, K, sm), K, sm);
  i64 c = divi(r, K * K, sm);
  i64 y = oy + ky - pad;
  i64 xx = ox + kx - pad;
  float v = 0.f;
  if (y >= 0 && y < H && xx >= 0 && xx < W) v = x[((s * C + c) * H + y) * W + xx];
  col[i] = v;
}

// col2im_batch is im2col_batch's adjoint, one thread per input value.
extern "C" __global__ void col2im_batch(const float* col, float* dx, i64 B, i64 C, i64 H, i64 W, i64 K, i64 pad, i64 OH, i64 OW) {
  i64 i = tid();
  if (i >= B * C * H * W) return;
  i64 P = OH * OW;
  bool sm = fits32(C * K * K * B * P) && fits32(B * C * H * W);
  i64 xx = modi(i, W, sm);
  i64 y = modi(divi(i, W, sm), H, sm);
  i64 c = modi(divi(i, W * H, sm), C, sm);
  i64 s = divi(i, W * H * C, sm);
  float sum = 0.f;
  for (i64 ky = 0; ky < K; ky++) {
    i64 oy = y + pad - ky;
    if (oy < 0 || oy >= OH) continue;
    for (i64 kx = 0; kx < K; kx++) {
      i64 ox = xx + pad - kx;
      if (ox < 0 || ox >= OW) continue;
      i64 r = (c * K + ky) * K + kx;
      sum += col[(r * B + s) * P + oy * OW + ox];
    }
  }
  dx[i] = sum;
}

// unbatch_bias: y[s, c, p] = t[c, s, p] + b[c], from the GEMM's
// channel-major output to the batch-major layout the next layer reads.
extern "C" __global__ void unbatch_bias(const float* t, const float* b, float* y, i64 B, i64 C, i64 P) {
  i64 i = tid();
  if (i >= B * C * P) return;
  bool sm = fits32(B * C * P);
  i64 p = modi(i, P, sm);
  i64 c = modi(divi(i, P, sm), C, sm);
  i64 s = divi(i, P * C, sm);
  y[i] = t[(c * B + s) * P + p] + b[c];
}

// rebatch: t[c, s, p] = y[s, c, p], unbatch's transpose, for the backward
// GEMMs.
extern "C" __global__ void rebatch(const float* y, float* t, i64 B, i64 C, i64 P) {
  i64 i = tid();
  if (i >= B * C * P) return;
  bool sm = fits32(B * C * P);
  i64 p = modi(i, P, sm);
  i64 s = modi(divi(i, P, sm), B, sm);
  i64 c = divi(i, P * B, sm);
  t[i] = y[(s * C + c) * P + p];
}

extern "C" __global__ void bias_add(float* y, const float* b, i64 n, i64 cols, i64 inner) {
  i64 i = tid();
  if (i >= n) return;
  bool sm = fits32(n);
  y[i] += b[modi(divi(i, inner, sm), cols, sm)];
}

// The bias gradient is summed in two passes (see BiasSplit in ../geom.go):
// the parts of each channel, then the parts in order. No atomics, so the
// result is the same bits on every run and every replica.

// bias_grad_part: block b (of 256 threads) writes part[s·cols + j], j = b mod
// cols and s = b / cols, the sum of channel j's values seg·s … seg·(s+1) − 1
// in the rows × inner order. Thread t sums every 256th value from the
// segment's t-th and a fixed tree adds the 256 partial sums. The row and
// position step by a constant, so the loop divides only once.
extern "C" __global__ void bias_grad_part(const float* dy, float* part, i64 rows, i64 cols, i64 inner, i64 seg) {
  __shared__ float sh[256];
  i64 j = blockIdx.x % cols;
  i64 s = blockIdx.x / cols;
  i64 t = threadIdx.x;
  i64 hi = min(rows * inner, (s + 1) * seg);
  float sum = 0.f;
  i64 e = s * seg + t;
  if (e < hi) {
    i64 r = e / inner, k = e % inner;
    i64 q = 256 / inner, rm = 256 % inner;
    for (; e < hi; e += 256) {
      sum += dy[(r * cols + j) * inner + k];
      r += q;
      k += rm;
      if (k >= inner) {
        k -= inner;
        r++;
      }
    }
  }
  sh[t] = sum;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (t < w) sh[t] += sh[t + w];
    __syncthreads();
  }
  if (t == 0) part[s * cols + j] = sh[0];
}

// bias_grad_rows: for one value a row (inner = 1), thread i = s·cols + j sums
// column j over rows seg·s … seg·(s+1) − 1 in order into part[i]: a warp
// reads adjacent columns, so the loads are coalesced.
extern "C" __global__ void bias_grad_rows(const float* dy, float* part, i64 rows, i64 cols, i64 seg, i64 parts) {
  i64 i = tid();
  if (i >= parts * cols) return;
  i64 j = i % cols;
  i64 s = i / cols;
  i64 hi = min(rows, (s + 1) * seg);
  float sum = 0.f;
  for (i64 r = s * seg; r < hi; r++) sum += dy[r * cols + j];
  part[i] = sum;
}

// bias_grad_sum: db[j] = part[j] + part[cols + j] + … in order.
extern "C" __global__ void bias_grad_sum(const float* part, float* db, i64 cols, i64 parts) {
  i64 j = tid();
  if (j >= cols) return;
  float sum = 0.f;
  for (i64 s = 0; s < parts; s++) sum += part[s * cols + j];
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
  bool sm = fits32(planes * H * W);
  i64 ox = modi(i, OW, sm);
  i64 oy = modi(divi(i, OW, sm), OH, sm);
  i64 p = divi(i, OW * OH, sm);
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
  bool sm = fits32(planes * H * W);
  i64 xx = modi(i, W, sm);
  i64 y = modi(divi(i, W, sm), H, sm);
  i64 p = divi(i, W * H, sm);
  i64 oy = divi(y, K, sm), ox = divi(xx, K, sm);
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

// nonfinite sets flag[0] to 1 if any of g is NaN or Inf. Every thread that
// writes, writes the same value, so the race is harmless.
extern "C" __global__ void nonfinite(const float* g, float* flag, i64 n) {
  i64 i = tid();
  if (i >= n) return;
  if (!isfinite(g[i])) flag[0] = 1.f;
}

// flush is x, or +0 where x is subnormal or ±0 (train/vec.Flush): the
// optimizers' state never holds a subnormal.
__device__ float flush(float x) { return fabsf(x) < 1.17549435e-38f ? 0.f : x; }

// sgd is train.SGD's update, value by value, skipped when skip[0] is not 0;
// hyper is (lr, momentum, weight decay), read from device memory so that a
// captured step picks up a new learning rate.
extern "C" __global__ void sgd(float* p, const float* g, float* v, const float* hyper, const float* skip, i64 n) {
  i64 i = tid();
  if (i >= n || skip[0] != 0.f) return;
  float lr = hyper[0], mu = hyper[1], wd = hyper[2];
  float w = p[i];
  if (mu == 0.f) {
    p[i] = w - lr * (g[i] + wd * w);
    return;
  }
  float m = flush(mu * v[i] + (g[i] + wd * w));
  v[i] = m;
  p[i] = w - lr * m;
}

// adam is train.Adam's update; hyper is (lr/(1-b1^t), sqrt(1-b2^t), weight
// decay, b1, b2, eps), computed on the host as train.Adam does. Built
// without fused multiply-adds (gen.sh), it rounds as the Go code does, so a
// GPU replica and a CPU one apply the same bits.
extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, const float* hyper, const float* skip, i64 n) {
  i64 i = tid();
  if (i >= n || skip[0] != 0.f) return;
  float step = hyper[0], sq = hyper[1], wd = hyper[2], b1 = hyper[3], b2 = hyper[4], eps = hyper[5];
  float d = g[i] + wd * p[i];
  float mi = flush(b1 * m[i] + (1.f - b1) * d);
  float vi = flush(b2 * v[i] + (1.f - b2) * d * d);
  m[i] = mi;
  v[i] = vi;
  p[i] = p[i] - step * mi / (sqrtf(vi) / sq + eps);
}

// The language model's kernels: activations are rows of one position each.

// embed: y[r, j] = table[tok[r], j] + pos[r mod T, j].
extern "C" __global__ void embed(const float* tok, const float* table, const float* pos, float* y, i64 rows, i64 T, i64 dim) {
  i64 i = tid();
  if (i >= rows * dim) return;
  i64 r = i / dim, j = i % dim;
  y[i] = table[(i64)tok[r] * dim + j] + pos[(r % T) * dim + j];
}

// embed_grad: dTable[v, j], the sum of dy[r, j] over the rows whose token
// is v, in row order (a gather: no atomics, the same bits every run).
// Each thread reads every token; embed_grad_lists, after token_rows, reads
// only its token's rows, in the same order, for the same bits.
extern "C" __global__ void embed_grad(const float* tok, const float* dy, float* dTable, i64 n, i64 rows, i64 dim) {
  i64 i = tid();
  if (i >= n) return;
  i64 v = i / dim, j = i % dim;
  float sum = 0.f;
  for (i64 r = 0; r < rows; r++)
    if ((i64)tok[r] == v) sum += dy[r * dim + j];
  dTable[i] = sum;
}

// token_rows: block v (of TOKEN_BLOCK threads) lists the rows whose token
// is v, in row order, as ints in lists[v·rows …], and their count in
// counts[v] (an int): a chunk of rows at a time, each warp's hits placed
// by a ballot and the warps' counts before it.
#define TOKEN_BLOCK 256
#ifndef FULL
#define FULL 0xffffffffu
#endif
extern "C" __global__ void token_rows(const float* tok, float* lists, float* counts, i64 rows) {
  __shared__ int hits[TOKEN_BLOCK / 32];
  i64 v = blockIdx.x;
  int* list = (int*)lists + v * rows;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int base = 0;
  for (i64 c = 0; c < rows; c += TOKEN_BLOCK) {
    i64 r = c + threadIdx.x;
    bool hit = r < rows && (i64)tok[r] == v;
    unsigned m = __ballot_sync(FULL, hit);
    if (lane == 0) hits[w] = __popc(m);
    __syncthreads();
    int at = base, total = 0;
    for (int k = 0; k < TOKEN_BLOCK / 32; k++) {
      if (k < w) at += hits[k];
      total += hits[k];
    }
    if (hit) list[at + __popc(m & ((1u << lane) - 1u))] = (int)r;
    __syncthreads();
    base += total;
  }
  if (threadIdx.x == 0) ((int*)counts)[v] = base;
}

// embed_grad_lists: embed_grad's dTable[i] from token_rows' lists.
extern "C" __global__ void embed_grad_lists(const float* lists, const float* counts, const float* dy, float* dTable, i64 n, i64 rows, i64 dim) {
  i64 i = tid();
  if (i >= n) return;
  bool sm = fits32(n);
  i64 v = divi(i, dim, sm), j = modi(i, dim, sm);
  const int* list = (const int*)lists + v * rows;
  int count = ((const int*)counts)[v];
  float sum = 0.f;
  for (int k = 0; k < count; k++) sum += dy[(i64)list[k] * dim + j];
  dTable[i] = sum;
}

// pos_grad: dPos[t, j], the sum of dy over the rows at position t.
extern "C" __global__ void pos_grad(const float* dy, float* dPos, i64 rows, i64 T, i64 dim) {
  i64 i = tid();
  if (i >= T * dim) return;
  i64 t = i / dim, j = i % dim;
  float sum = 0.f;
  for (i64 r = t; r < rows; r += T) sum += dy[r * dim + j];
  dPos[i] = sum;
}

// The row kernels run a warp of 32 threads per row (blockDim 32, a block
// per row): lane l takes the row's values l, l+32, …, sums what it took
// in order, and the lanes' sums are folded in halves by shuffles — the
// order threads.go's warpSum and warpMax follow.
#ifndef FULL
#define FULL 0xffffffffu
#endif

__device__ __forceinline__ float warp_sum(float v) {
  for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(FULL, v, s);
  return __shfl_sync(FULL, v, 0);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int s = 16; s > 0; s >>= 1) {
    float o = __shfl_down_sync(FULL, v, s);
    v = o > v ? o : v;
  }
  return __shfl_sync(FULL, v, 0);
}

// layer_norm: a warp a row; stats keeps its mean and 1/σ.
extern "C" __global__ void layer_norm(const float* x, const float* g, const float* b, float* y, float* stats, i64 rows, i64 dim) {
  i64 r = blockIdx.x;
  i64 l = threadIdx.x;
  if (r >= rows) return;
  const float* row = x + r * dim;
  float* out = y + r * dim;
  float sum = 0.f;
  for (i64 j = l; j < dim; j += 32) sum += row[j];
  float mu = warp_sum(sum) / (float)dim;
  float sq = 0.f;
  for (i64 j = l; j < dim; j += 32) {
    float d = row[j] - mu;
    sq += d * d;
  }
  sq = warp_sum(sq);
  float rs = (float)(1.0 / sqrt((double)(sq / (float)dim + 1e-5f)));
  for (i64 j = l; j < dim; j += 32) out[j] = (row[j] - mu) * rs * g[j] + b[j];
  if (l == 0) {
    stats[2 * r] = mu;
    stats[2 * r + 1] = rs;
  }
}

// layer_norm_backward: row r of dx, rs·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)).
extern "C" __global__ void layer_norm_backward(const float* x, const float* g, const float* stats, const float* dy, float* dx, i64 rows, i64 dim) {
  i64 r = blockIdx.x;
  i64 l = threadIdx.x;
  if (r >= rows) return;
  const float* row = x + r * dim;
  const float* d = dy + r * dim;
  float* out = dx + r * dim;
  float mu = stats[2 * r], rs = stats[2 * r + 1];
  float a = 0.f, c = 0.f;
  for (i64 j = l; j < dim; j += 32) a += d[j] * g[j];
  for (i64 j = l; j < dim; j += 32) c += (d[j] * g[j]) * ((row[j] - mu) * rs);
  a = warp_sum(a) / (float)dim;
  c = warp_sum(c) / (float)dim;
  for (i64 j = l; j < dim; j += 32) {
    float h = d[j] * g[j];
    out[j] = rs * ((h - a) - ((row[j] - mu) * rs) * c);
  }
}

// normalized_product: out = dy·x̂, whose column sums (bias_grad) are the
// gain's gradient.
extern "C" __global__ void normalized_product(const float* x, const float* stats, const float* dy, float* out, i64 rows, i64 dim) {
  i64 i = tid();
  if (i >= rows * dim) return;
  i64 r = divi(i, dim, fits32(rows * dim));
  out[i] = dy[i] * ((x[i] - stats[2 * r]) * stats[2 * r + 1]);
}

// gelu: x·Φ(x), the exact form, in single precision (erff and expf, within
// a few units in the last place); the host twin computes in double, and
// the tests hold the two within 1e-4. In double the GPT's large shape
// spent ~0.3 ms a layer here.
extern "C" __global__ void gelu(const float* x, float* y, i64 n) {
  i64 i = tid();
  if (i >= n) return;
  float v = x[i];
  y[i] = 0.5f * v * (1.f + erff(v * 0.70710678118654752440f));
}

extern "C" __global__ void gelu_backward(const float* x, const float* dy, float* dx, i64 n) {
  i64 i = tid();
  if (i >= n) return;
  float v = x[i];
  float d = 0.5f * (1.f + erff(v * 0.70710678118654752440f)) + v * expf(-0.5f * v * v) * 0.39894228040143267794f;
  dx[i] = dy[i] * d;
}

// causal_softmax: a warp a row; row r of blocks of T×T scores becomes the
// softmax of its first (r mod T)+1 values, zeros after.
extern "C" __global__ void causal_softmax(float* s, i64 rows, i64 T) {
  i64 r = blockIdx.x;
  i64 l = threadIdx.x;
  if (r >= rows) return;
  float* row = s + r * T;
  i64 n = r % T + 1;
  float m = row[0];
  for (i64 k = l; k < n; k += 32) m = row[k] > m ? row[k] : m;
  m = warp_max(m);
  float sum = 0.f;
  for (i64 k = l; k < n; k += 32) {
    float e = expf(row[k] - m);
    row[k] = e;
    sum += e;
  }
  float inv = 1.f / warp_sum(sum);
  for (i64 k = l; k < T; k += 32) row[k] = k < n ? row[k] * inv : 0.f;
}

// causal_softmax_backward: a warp a row; dp ← p ⊙ (dp − Σ p·dp) over the
// row's first (r mod T)+1, zeros after.
extern "C" __global__ void causal_softmax_backward(const float* p, float* dp, i64 rows, i64 T) {
  i64 r = blockIdx.x;
  i64 l = threadIdx.x;
  if (r >= rows) return;
  const float* pr = p + r * T;
  float* dr = dp + r * T;
  i64 n = r % T + 1;
  float dot = 0.f;
  for (i64 k = l; k < n; k += 32) dot += pr[k] * dr[k];
  dot = warp_sum(dot);
  for (i64 k = l; k < T; k += 32) dr[k] = k < n ? pr[k] * (dr[k] - dot) : 0.f;
}

extern "C" __global__ void add(const float* a, const float* b, float* y, i64 n) {
  i64 i = tid();
  if (i >= n) return;
  y[i] = a[i] + b[i];
}

extern "C" __global__ void accumulate(float* y, const float* x, i64 n) {
  i64 i = tid();
  if (i >= n) return;
  y[i] += x[i];
}

// scale: AdamW's decoupled decay, p *= hyper[at], skipped with the step.
extern "C" __global__ void scale(float* p, const float* hyper, i64 at, const float* skip, i64 n) {
  i64 i = tid();
  if (i >= n || skip[0] != 0.f) return;
  p[i] *= hyper[at];
}
