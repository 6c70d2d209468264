/* The small per-layer ops of the CPU decoder in one C call each (fp32, contiguous rows).
 *
 * At batch 1 a layer is ~45 torch ops whose dispatch costs more than their arithmetic;
 * these replace the norm, rotary and SiLU-gate ops with a few calls. Each row is computed
 * on its own (same result whatever the batch), in fp32, the HF rounding order: the norm
 * scales by 1/sqrt(mean(x^2) + eps), then multiplies by the weight.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_math.h"

static inline void norm_row(const float *x, const float *w, int64_t n, float eps, float *out) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] * r) * w[i];
}

/* out[r] = rms_norm(x[r]) * w for `rows` rows of n (x and out may not alias). */
void qo_rms_norm(const float *x, const float *w, int64_t rows, int64_t n, float eps, float *out, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows > 16)
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * n, w, n, eps, out + r * n);
}

/* residual[r] += x[r]; out[r] = rms_norm(residual[r]) * w. */
void qo_add_rms_norm(const float *x, float *residual, const float *w, int64_t rows, int64_t n, float eps, float *out,
                     int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows > 16)
    for (int64_t r = 0; r < rows; r++) {
        float *res = residual + r * n;
        const float *xr = x + r * n;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) res[i] += xr[i];
        norm_row(res, w, n, eps, out + r * n);
    }
}

/* Rotate-half rotary in place on q [T, Hq, D] and k [T, Hk, D], rows `q_stride` /
 * `k_stride` floats apart per token (views into the fused QKV output); cos_sin [P, D] =
 * cat(cos, sin) over the D/2 frequencies. */
int qo_rotary(const int64_t *positions, float *q, int64_t q_stride, int64_t hq, float *k, int64_t k_stride, int64_t hk,
              int64_t T, int64_t D, const float *cos_sin, int64_t P, int nthreads) {
    const int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) /* a position past the cache: nothing written, -1 - t */
        if (positions[t] < 0 || positions[t] >= P) return (int)(-1 - t);
#pragma omp parallel for schedule(static) num_threads(nthreads) if (T > 16)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_sin + positions[t] * D, *s = c + half;
        for (int64_t h = 0; h < hq + hk; h++) {
            float *x = h < hq ? q + t * q_stride + h * D : k + t * k_stride + (h - hq) * D;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
    return 0;
}

/* out[r] = silu(gu[r, :n]) * gu[r, n:] for gate_up rows of 2n. */
void qo_silu_mul(const float *gu, int64_t rows, int64_t n, float *out, int nthreads) {
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows > 16)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        /* g * sigmoid(g), with exp taken of -|g| only (no overflow), vectorized */
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float e = exp_nonpositive(-fabsf(g[i]));
            const float sig = g[i] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
            o[i] = g[i] * sig * u[i];
        }
    }
}

/* k_cache[slots[t]] = key[t], v_cache[slots[t]] = value[t]: T token rows of `row` floats
 * (Hkv x D), key/value rows `key_stride` / `value_stride` floats apart (views into the fused
 * QKV output). Returns -1 - t for the first slot outside [0, num_slots), before writing. */
int qo_cache_write(const float *key, int64_t key_stride, const float *value, int64_t value_stride, float *k_cache,
                   float *v_cache, const int64_t *slots, int64_t T, int64_t row, int64_t num_slots) {
    for (int64_t t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= num_slots) return (int)(-1 - t);
    for (int64_t t = 0; t < T; t++) {
        memcpy(k_cache + slots[t] * row, key + t * key_stride, (size_t)row * sizeof(float));
        memcpy(v_cache + slots[t] * row, value + t * value_stride, (size_t)row * sizeof(float));
    }
    return 0;
}
