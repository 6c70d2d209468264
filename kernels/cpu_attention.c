/* Paged decode attention for CPU, fp32: reads K/V rows straight from the block pool.
 *
 * One query token per sequence. A task is one (sequence, KV head): its G = Hq / Hkv query
 * heads share every K and V row it reads (GQA). Pass 1 walks the context through the
 * block table and writes the G scores of each position into a per-thread buffer; then
 * a max-subtracted softmax; pass 2 walks it again and accumulates the weighted V rows.
 * Each K and V row is read once per (sequence, KV head): no gathered copy of the context.
 *
 * With AVX-512 and D a multiple of 16 (task_avx512): the scores of 16 positions at a time
 * are 16 vector dot products summed lane-wise in one transpose-and-add tree (a position's
 * sum never mixes with another's, so a padded tail gives the same bits as a full tile),
 * and each head's output stays in registers across the context. A row's result depends
 * only on its own q, context and length, never on the batch around it: a verification
 * row computes bit for bit what a plain decode at that position does.
 *
 * Pools: [num_blocks, block_size, Hkv, D] contiguous; q and out: [B, Hq, D] contiguous;
 * block_tables: [B, max_blocks] int32 (row stride bt_stride); seq_lens: [B] int32.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h" /* exp_nonpositive */

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

/* Each of the G rows of s (L scores) in place: max-subtracted, exponentiated, normalized. */
static void softmax_rows(float *s, int64_t L, int64_t G) {
    for (int64_t g = 0; g < G; g++) {
        float *sg = s + g * L, mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int64_t t = 0; t < L; t++) mx = sg[t] > mx ? sg[t] : mx;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < L; t++) {
            sg[t] = exp_nonpositive(sg[t] - mx);
            sum += sg[t];
        }
        const float inv = L > 0 ? 1.0f / sum : 0.0f;
#pragma omp simd
        for (int64_t t = 0; t < L; t++) sg[t] *= inv;
    }
}

#ifdef __AVX512F__
#include <immintrin.h>

/* 16 vectors -> one vector of their 16 horizontal sums, in order. */
static inline __m512 sum16(const __m512 v[16]) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* b[i] holds positions 4i..4i+3 in each 128-bit lane (partial sums): add the lanes */
    const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
    const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

/* One (sequence, KV head) task: G heads of q (qg, D apart) over L positions -> og. */
static inline __attribute__((always_inline)) void task_avx512(
    const int64_t nj, const float *qg, float *og, const float *k_base, const float *v_base,
    const int32_t *bt, int64_t L, int64_t G, int64_t block_size, int64_t row, int64_t block,
    float scale, float *s) {
    const int64_t D = nj * 16;
    for (int64_t g = 0; g < G; g++) {
        __m512 qv[16];
        for (int64_t j = 0; j < nj; j++) qv[j] = _mm512_loadu_ps(qg + g * D + 16 * j);
        float *sg = s + g * L;
        for (int64_t t0 = 0; t0 < L; t0 += 16) {
            __m512 v[16];
            const int64_t n = L - t0 < 16 ? L - t0 : 16;
            for (int64_t i = 0; i < 16; i++) {
                if (i >= n) {
                    v[i] = _mm512_setzero_ps();
                    continue;
                }
                const int64_t t = t0 + i;
                const float *kr = k_base + (int64_t)bt[t / block_size] * block + (t % block_size) * row;
                __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
                for (int64_t j = 1; j < nj; j++) acc = _mm512_fmadd_ps(qv[j], _mm512_loadu_ps(kr + 16 * j), acc);
                v[i] = acc;
            }
            const __m512 sc = _mm512_mul_ps(sum16(v), _mm512_set1_ps(scale));
            _mm512_mask_storeu_ps(sg + t0, (__mmask16)((1u << n) - 1u), sc);
        }
    }
    softmax_rows(s, L, G);
    for (int64_t g = 0; g < G; g++) {
        __m512 o[16];
        for (int64_t j = 0; j < nj; j++) o[j] = _mm512_setzero_ps();
        const float *sg = s + g * L;
        for (int64_t t = 0; t < L; t++) {
            const float *vr = v_base + (int64_t)bt[t / block_size] * block + (t % block_size) * row;
            const __m512 p = _mm512_set1_ps(sg[t]);
            for (int64_t j = 0; j < nj; j++) o[j] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * j), o[j]);
        }
        for (int64_t j = 0; j < nj; j++) _mm512_storeu_ps(og + g * D + 16 * j, o[j]);
    }
}
#endif

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
        const float *k_base = k_cache + h * D, *v_base = v_cache + h * D;
#ifdef __AVX512F__
        if (D == 64) {
            task_avx512(4, qg, og, k_base, v_base, bt, L, G, block_size, row, block, scale, s);
            continue;
        }
        if (D == 128) {
            task_avx512(8, qg, og, k_base, v_base, bt, L, G, block_size, row, block, scale, s);
            continue;
        }
        if (D % 16 == 0 && D <= 256) {
            task_avx512(D / 16, qg, og, k_base, v_base, bt, L, G, block_size, row, block, scale, s);
            continue;
        }
#endif
        for (int64_t t = 0; t < L; t++) {
            const float *kr = k_base + (int64_t)bt[t / block_size] * block + (t % block_size) * row;
            for (int64_t g = 0; g < G; g++) {
                const float *qh = qg + g * D;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int64_t d = 0; d < D; d++) acc += qh[d] * kr[d];
                s[g * L + t] = acc * scale;
            }
        }
        softmax_rows(s, L, G);
        for (int64_t g = 0; g < G; g++)
            for (int64_t d = 0; d < D; d++) og[g * D + d] = 0.0f;
        for (int64_t t = 0; t < L; t++) {
            const float *vr = v_base + (int64_t)bt[t / block_size] * block + (t % block_size) * row;
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
