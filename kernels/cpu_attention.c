/* Paged decode attention for CPU, fp32: reads K/V rows straight from the block pool.
 *
 * One query token per sequence. A task is one (sequence, KV head): its G = Hq / Hkv query
 * heads share every K and V row it reads (GQA). Pass 1 walks the context through the
 * block table and writes the G scores of each position into a per-thread buffer; then
 * a max-subtracted softmax; pass 2 walks it again and accumulates the weighted V rows.
 * Each K and V row is read once per (sequence, KV head): no gathered copy of the context.
 *
 * Pools: [num_blocks, block_size, Hkv, D] contiguous; q and out: [B, Hq, D] contiguous;
 * block_tables: [B, max_blocks] int32 (row stride bt_stride); seq_lens: [B] int32.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static __thread float *scratch = NULL;
static __thread int64_t scratch_len = 0;

static float *scores_buffer(int64_t n) {
    if (n > scratch_len) { /* grown, never shrunk: no allocation once warm */
        free(scratch);
        scratch = (float *)malloc((size_t)n * sizeof(float));
        scratch_len = scratch ? n : 0;
    }
    return scratch;
}

int qa_decode(const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
              int64_t bt_stride, const int32_t *seq_lens, int64_t B, int64_t Hq, int64_t Hkv, int64_t D,
              int64_t block_size, float scale, float *out, int nthreads) {
    const int64_t G = Hq / Hkv;
    const int64_t row = Hkv * D, block = block_size * row;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t task = 0; task < B * Hkv; task++) {
        const int64_t b = task / Hkv, h = task % Hkv;
        const int64_t L = seq_lens[b];
        const int32_t *bt = block_tables + b * bt_stride;
        const float *qg = q + (b * Hq + h * G) * D;
        float *og = out + (b * Hq + h * G) * D;
        float *s = scores_buffer(L * G > 0 ? L * G : 1);
        if (!s) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        for (int64_t t = 0; t < L; t++) {
            const float *kr = k_cache + (int64_t)bt[t / block_size] * block + (t % block_size) * row + h * D;
            for (int64_t g = 0; g < G; g++) {
                const float *qh = qg + g * D;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int64_t d = 0; d < D; d++) acc += qh[d] * kr[d];
                s[g * L + t] = acc * scale;
            }
        }
        for (int64_t g = 0; g < G; g++) {
            float *sg = s + g * L, mx = -INFINITY, sum = 0.0f;
            for (int64_t t = 0; t < L; t++) mx = sg[t] > mx ? sg[t] : mx;
            for (int64_t t = 0; t < L; t++) {
                sg[t] = expf(sg[t] - mx);
                sum += sg[t];
            }
            const float inv = L > 0 ? 1.0f / sum : 0.0f;
            for (int64_t t = 0; t < L; t++) sg[t] *= inv;
            float *oh = og + g * D;
            for (int64_t d = 0; d < D; d++) oh[d] = 0.0f;
        }
        for (int64_t t = 0; t < L; t++) {
            const float *vr = v_cache + (int64_t)bt[t / block_size] * block + (t % block_size) * row + h * D;
            for (int64_t g = 0; g < G; g++) {
                const float p = s[g * L + t];
                float *oh = og + g * D;
#pragma omp simd
                for (int64_t d = 0; d < D; d++) oh[d] += p * vr[d];
            }
        }
    }
    return failed ? -1 : 0;
}
