/* GGUF block-quantized weight x fp32 activation matmul for CPU (Q4_0, Q4_1, Q8_0).
 *
 * Weights stay in GGUF's own block layout (a row of K inputs = K/32 blocks, rows one after
 * the other); each block is turned into its 32 fp32 weights in registers, with exactly the
 * reference dequantizer's values (dequant.py: d*(q-8), d*q+m, d*q are exact or rounded
 * once either way), and multiplied with fp32 activations into fp32 accumulators. Only the
 * summation order differs from dequantize-then-F.linear.
 *
 * Built at first use by cpu_native.py (gcc -O3 -march=native -fopenmp); loaded with
 * ctypes. OpenMP: the same libgomp.so.1 torch loaded, so one thread pool. The caller passes
 * the thread count (torch.get_num_threads()).
 */
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
#endif
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QK_AVX2 1
#ifdef __AVX512F__
#define QK_AVX512 1
#endif
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 }; /* GGMLQuantizationType values */

/* Activation rows per direct pass: 8 with AVX-512's 32 registers (8 x 2 accumulators: a
 * speculative verify of k = 4..7 drafts, or a small batch, unpacks each weight block once),
 * 4 with AVX2's 16. */
#ifdef QK_AVX512
#define MB_MAX 8
#else
#define MB_MAX 4
#endif

/* The direct path fetches the bytes of the pass this many passes ahead (a pass: the NR
 * weight rows it multiplies, contiguous). A row of a few hundred bytes is too short a
 * stream for the hardware prefetcher to learn, so without it decode waited on memory:
 * the model's matmuls at batch 1 took 0.54-0.61x the time with it (docs/cpu.md); 1, 2, 4
 * and 8 passes ahead measured alike. */
#define PREFETCH_PASSES 2

static inline float f16_to_f32(uint16_t h) {
#ifdef QK_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

int qk_block_bytes(int kind) {
    switch (kind) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q8_0: return 34;
    default: return 0;
    }
}

int qk_has_avx2(void) {
#ifdef QK_AVX2
    return 1;
#else
    return 0;
#endif
}

/* Scalar: the 32 weights of one block (the reference's exact values). */
static inline void unpack_scalar(int kind, const uint8_t *b, float *w) {
    float d = f16_to_f32(rd16(b));
    if (kind == Q8_0) {
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++) w[j] = d * (float)q[j];
    } else if (kind == Q4_1) {
        float m = f16_to_f32(rd16(b + 2));
        const uint8_t *q = b + 4;
        for (int j = 0; j < 16; j++) {
            w[j] = __builtin_fmaf(d, (float)(q[j] & 0x0F), m);
            w[j + 16] = __builtin_fmaf(d, (float)(q[j] >> 4), m);
        }
    } else { /* Q4_0 */
        const uint8_t *q = b + 2;
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)((int)(q[j] & 0x0F) - 8);
            w[j + 16] = d * (float)((int)(q[j] >> 4) - 8);
        }
    }
}

#ifdef QK_AVX2
/* The 32 weights of one block as four 8-lane vectors (elements 0-7, 8-15, 16-23, 24-31). */
static inline __attribute__((always_inline)) void unpack_avx2(int kind, const uint8_t *b, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(_cvtsh_ss(rd16(b)));
    if (kind == Q8_0) {
        __m128i lo = _mm_loadu_si128((const __m128i *)(b + 2));
        __m128i hi = _mm_loadu_si128((const __m128i *)(b + 18));
        w[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
        w[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
        w[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
        w[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
        return;
    }
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i q = _mm_loadu_si128((const __m128i *)(b + (kind == Q4_1 ? 4 : 2)));
    __m128i lo = _mm_and_si128(q, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    if (kind == Q4_1) {
        __m256 m = _mm256_set1_ps(_cvtsh_ss(rd16(b + 2)));
        w[0] = _mm256_fmadd_ps(d, q0, m);
        w[1] = _mm256_fmadd_ps(d, q1, m);
        w[2] = _mm256_fmadd_ps(d, q2, m);
        w[3] = _mm256_fmadd_ps(d, q3, m);
    } else {
        __m256 eight = _mm256_set1_ps(8.0f);
        w[0] = _mm256_mul_ps(d, _mm256_sub_ps(q0, eight));
        w[1] = _mm256_mul_ps(d, _mm256_sub_ps(q1, eight));
        w[2] = _mm256_mul_ps(d, _mm256_sub_ps(q2, eight));
        w[3] = _mm256_mul_ps(d, _mm256_sub_ps(q3, eight));
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#ifdef QK_AVX512
/* The 32 weights of one block as two 16-lane vectors (elements 0-15, 16-31): the same
 * values as unpack_avx2. A 4-bit block has only 16 distinct weights, so they are computed
 * once (`table`: fma(d, q, m) or d * (q - 8) for q = 0..15, the reference's operations) and
 * each lane picks its own with a permute indexed by its nibble: one permute per 16 weights
 * instead of a convert and an FMA. vpermps reads only the index's low 4 bits, so the low
 * nibbles need no mask. */
static inline __attribute__((always_inline)) void unpack_avx512(int kind, const uint8_t *b, __m512 w[2]) {
    if (kind == Q8_0) {
        __m512 d = _mm512_set1_ps(_cvtsh_ss(rd16(b)));
        w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))));
        w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))));
        return;
    }
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table;
    if (kind == Q4_1) {
        uint32_t dm;
        memcpy(&dm, b, 4);
        /* d and m (two fp16) to fp32 in one conversion: lanes alternate d, m */
        __m512 both = _mm512_cvtph_ps(_mm256_set1_epi32((int)dm));
        table = _mm512_fmadd_ps(_mm512_permute_ps(both, 0x00), iota, _mm512_permute_ps(both, 0x55));
    } else {
        table = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(rd16(b))), _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)));
    }
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + (kind == Q4_1 ? 4 : 2))));
    w[0] = _mm512_permutexvar_ps(q, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}

/* hsum(a0 + a1) of an accumulator whose lanes 0-7 are a0 and 8-15 are a1. */
static inline float hsum512(__m512 a) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(a),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
}
#endif

/* The b-th share (`share` bytes) of a later pass, fetched while block b of this one runs:
 * the fetches are spread over the pass instead of bunched at its start. */
static inline __attribute__((always_inline)) void prefetch_share(const uint8_t *ahead, int64_t b, int64_t share) {
    for (int64_t off = b * share; off < (b + 1) * share; off += 64) __builtin_prefetch(ahead + off, 0, 3);
}

/* NR weight rows (nb blocks each, row_bytes apart) against MB activation rows (NR 1..4,
 * MB 1..MB_MAX, MB x NR <= 16; constants after inlining): out[m][r] = sum_k w_r[k] x[m][k]. Per output two
 * 8-lane accumulators, a0 (elements 0-7 and 16-23 of each block) and a1 (8-15, 24-31),
 * fed block after block, then hsum(a0 + a1): the same order whatever MB and NR, so a
 * row's result does not depend on how many rows share its pass (batch invariance: a token
 * gets the same logits alone or in a batch of 100). Several weight rows per pass give the
 * CPU independent FMA chains when there is a single activation row (decode). */
static inline __attribute__((always_inline)) void row_dot(
    int kind, const uint8_t *row, int64_t row_bytes, int NR, int64_t nb, int bb, const float *x, int64_t ldx,
    int MB, float out[MB_MAX][4]) {
#ifdef QK_AVX512 /* a0 and a1 as the halves of one register: a block is x[0..16) then x[16..32) */
    __m512 a[MB_MAX][4];
    for (int m = 0; m < MB; m++)
        for (int r = 0; r < NR; r++) a[m][r] = _mm512_setzero_ps();
    const uint8_t *ahead = row + PREFETCH_PASSES * NR * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * 32;
        prefetch_share(ahead, b, NR * bb);
        for (int r = 0; r < NR; r++) {
            __m512 w[2];
            unpack_avx512(kind, row + r * row_bytes + b * bb, w);
            for (int m = 0; m < MB; m++) {
                const float *xm = xb + m * ldx;
                a[m][r] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xm), a[m][r]);
                a[m][r] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xm + 16), a[m][r]);
            }
        }
    }
    for (int m = 0; m < MB; m++)
        for (int r = 0; r < NR; r++) out[m][r] = hsum512(a[m][r]);
#else
    __m256 a[MB_MAX][4][2];
    for (int m = 0; m < MB; m++)
        for (int r = 0; r < NR; r++) a[m][r][0] = a[m][r][1] = _mm256_setzero_ps();
    const uint8_t *ahead = row + PREFETCH_PASSES * NR * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * 32;
        prefetch_share(ahead, b, NR * bb);
        for (int r = 0; r < NR; r++) {
            __m256 w[4];
            unpack_avx2(kind, row + r * row_bytes + b * bb, w);
            for (int m = 0; m < MB; m++) {
                const float *xm = xb + m * ldx;
                a[m][r][0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xm), a[m][r][0]);
                a[m][r][1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xm + 8), a[m][r][1]);
                a[m][r][0] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xm + 16), a[m][r][0]);
                a[m][r][1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xm + 24), a[m][r][1]);
            }
        }
    }
    for (int m = 0; m < MB; m++)
        for (int r = 0; r < NR; r++) out[m][r] = hsum(_mm256_add_ps(a[m][r][0], a[m][r][1]));
#endif
}
#endif

static void row_dot_scalar(int kind, const uint8_t *row, int64_t nb, int bb, const float *x, int64_t ldx, int MB,
                           float *out) {
    for (int m = 0; m < MB; m++) out[m] = 0.0f;
    float w[32];
    for (int64_t b = 0; b < nb; b++) {
        unpack_scalar(kind, row + b * bb, w);
        for (int m = 0; m < MB; m++) {
            const float *xm = x + m * ldx + b * 32;
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += w[j] * xm[j];
            out[m] += s;
        }
    }
}

#ifdef QK_AVX2
/* The tiled path's register tile: TM activation rows x TN weight rows. Each output's
 * accumulator holds row_dot's a0 and a1: one 16-lane register with AVX-512 (lanes 0-7 are
 * a0, 8-15 a1: a block's x[0..16) then x[16..32) feed them exactly as w[0], w[1] then w[2],
 * w[3] do), else the two 8-lane registers themselves. */
#ifdef QK_AVX512
#define TM 4
#define TN 4
#else
#define TM 2
#define TN 2
#endif

/* TN dequantized weight rows (ws, row stride K) against MB activation rows: the same
 * accumulators, fed in the same order, as row_dot (a0 += w[0..8) x[0..8), a1 += w[8..16)
 * x[8..16), a0 += w[16..24) x[16..24), a1 += w[24..32) x[24..32), block after block, then
 * hsum(a0 + a1)), so each output has row_dot's bits; only the unpacking moved out. */
static inline __attribute__((always_inline)) void tile_dot(
    const float *ws, int64_t K, const float *x, int64_t ldx, int MB, float out[TM][TN]) {
#ifdef QK_AVX512
    __m512 a[TM][TN];
    for (int m = 0; m < TM; m++)
        for (int n = 0; n < TN; n++) a[m][n] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __m512 w[TN];
        for (int n = 0; n < TN; n++) {
            w[n] = _mm512_loadu_ps(ws + n * K + k);
            __asm__("" : "+v"(w[n])); /* keep it in a register: gcc would reload it per FMA */
        }
        for (int m = 0; m < MB; m++) {
            __m512 xv = _mm512_loadu_ps(x + m * ldx + k);
            __asm__("" : "+v"(xv));
            for (int n = 0; n < TN; n++) a[m][n] = _mm512_fmadd_ps(w[n], xv, a[m][n]);
        }
    }
    for (int m = 0; m < MB; m++)
        for (int n = 0; n < TN; n++)
            out[m][n] = hsum512(a[m][n]);
#else
    __m256 a[TM][TN][2];
    for (int m = 0; m < TM; m++)
        for (int n = 0; n < TN; n++) a[m][n][0] = a[m][n][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        for (int h = 0; h < 2; h++) {
            __m256 w[TN];
            for (int n = 0; n < TN; n++) {
                w[n] = _mm256_loadu_ps(ws + n * K + k + 8 * h);
                __asm__("" : "+x"(w[n])); /* keep it in a register: gcc would reload it */
            }
            for (int m = 0; m < MB; m++) {
                __m256 xv = _mm256_loadu_ps(x + m * ldx + k + 8 * h);
                __asm__("" : "+x"(xv));
                for (int n = 0; n < TN; n++) a[m][n][h] = _mm256_fmadd_ps(w[n], xv, a[m][n][h]);
            }
        }
    }
    for (int m = 0; m < MB; m++)
        for (int n = 0; n < TN; n++) out[m][n] = hsum(_mm256_add_ps(a[m][n][0], a[m][n][1]));
#endif
}

/* Rows of activations per cache chunk: the chunk's activations (rows x K fp32) stay in L2
 * while every weight tile of the matrix passes over them. */
#define CHUNK_BYTES (512 * 1024)

/* The fp32 weights of `blocks` consecutive blocks into ws (the tiled path's scratch). */
static inline __attribute__((always_inline)) void fill_tile(int kind, const uint8_t *w, int64_t blocks, float *ws) {
    const int bb = qk_block_bytes(kind);
    for (int64_t i = 0; i < blocks; i++) {
#ifdef QK_AVX512
        __m512 v[2];
        unpack_avx512(kind, w + i * bb, v);
        _mm512_storeu_ps(ws + i * 32, v[0]);
        _mm512_storeu_ps(ws + i * 32 + 16, v[1]);
#else
        __m256 v[4];
        unpack_avx2(kind, w + i * bb, v);
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(ws + i * 32 + 8 * j, v[j]);
#endif
    }
}

/* The tiled path: each TN weight rows are unpacked once per chunk of activation rows into
 * a per-thread fp32 scratch and reused by all the chunk's rows, TM at a time. Parallel
 * over weight-row tiles, like the direct path over rows. */
static int tiled_impl(
    int kind, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M, int64_t ldx, float *y,
    int64_t ldy, const float *bias, int nthreads) {
    const int bb = qk_block_bytes(kind);
    const int64_t nb = K / 32, row_bytes = nb * bb, tiles = (N + TN - 1) / TN;
    int64_t chunk = CHUNK_BYTES / (K * 4) / TM * TM;
    if (chunk < TM) chunk = TM;
    if (nthreads < 1) nthreads = 1;
    /* one scratch of TN rows per thread; rows past N stay 0 (computed, never stored) */
    float *scratch = (float *)calloc((size_t)nthreads * TN * K, sizeof(float));
    if (!scratch) return -1;
#pragma omp parallel num_threads(nthreads)
    {
        float *ws = scratch + (size_t)omp_get_thread_num() * TN * K;
        for (int64_t c0 = 0; c0 < M; c0 += chunk) {
            const int64_t c1 = c0 + chunk < M ? c0 + chunk : M;
#pragma omp for schedule(static) nowait /* same tiles per thread every chunk: no wait */
            for (int64_t t = 0; t < tiles; t++) {
                const int64_t n0 = t * TN, nr = N - n0 < TN ? N - n0 : TN;
                switch (kind) { /* a constant kind in each unpacking loop (see direct_group) */
                case Q4_0: fill_tile(Q4_0, w + n0 * row_bytes, nr * nb, ws); break;
                case Q4_1: fill_tile(Q4_1, w + n0 * row_bytes, nr * nb, ws); break;
                default: fill_tile(Q8_0, w + n0 * row_bytes, nr * nb, ws); break;
                }
                for (int64_t m0 = c0; m0 < c1; m0 += TM) {
                    const int mb = (int)(c1 - m0 < TM ? c1 - m0 : TM);
                    float out[TM][TN];
                    const float *xm = x + m0 * ldx;
                    switch (mb) { /* constant MB per call: the compiler specialises tile_dot */
                    case TM: tile_dot(ws, K, xm, ldx, TM, out); break;
                    case 1: tile_dot(ws, K, xm, ldx, 1, out); break;
#if TM > 2
                    case 2: tile_dot(ws, K, xm, ldx, 2, out); break;
                    case 3: tile_dot(ws, K, xm, ldx, 3, out); break;
#endif
                    default: break;
                    }
                    for (int m = 0; m < mb; m++)
                        for (int n = 0; n < nr; n++)
                            y[(m0 + m) * ldy + n0 + n] = out[m][n] + (bias ? bias[n0 + n] : 0.0f);
                }
            }
        }
    }
    free(scratch);
    return 0;
}
#endif

/* Weight rows per direct pass: 4 with AVX-512's 32 registers (4 x 4 accumulators for up to
 * 4 activation rows, 8 x 2 from 5), 2 with AVX2's 16 for up to 2 activation rows (1 from 3:
 * 4 x 2 accumulators). */
#ifdef QK_AVX512
#define RN 4
#define RN_WIDE 4
#define RN_XWIDE 2
#else
#define RN 2
#define RN_WIDE 1
#endif

/* One direct pass with constant MB and NR (the compiler specialises row_dot for each). */
#define ROW_DOT_CASE(MBV, NRV) row_dot(kind, row, row_bytes, NRV, nb, bb, xm, ldx, MBV, out)

/* Output rows [n0, n0 + RN) of y = x @ W^T (+ bias) for all M activation rows, MB_MAX at a
 * time. Called with a constant `kind` (a switch inside the parallel loop: gcc outlines an
 * OpenMP region before inlining, so a kind passed into the region would stay a runtime
 * value tested in the innermost loop). */
static inline __attribute__((always_inline)) void direct_group(
    int kind, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M, int64_t ldx, float *y,
    int64_t ldy, const float *bias, int64_t n0) {
    const int bb = qk_block_bytes(kind);
    const int64_t nb = K / 32, row_bytes = nb * bb;
    {
        const int64_t nr = N - n0 < RN ? N - n0 : RN;
        for (int64_t m0 = 0; m0 < M; m0 += MB_MAX) {
            const int mb = (int)(M - m0 < MB_MAX ? M - m0 : MB_MAX);
            const float *xm = x + m0 * ldx;
            float out[MB_MAX][4];
#ifdef QK_AVX2
            for (int64_t r0 = 0; r0 < nr;) {
                const uint8_t *row = w + (n0 + r0) * row_bytes;
                float (*o)[4] = out;
                int step;
                if (mb <= 2 && nr - r0 >= RN) {
                    step = RN;
                    if (mb == 1) ROW_DOT_CASE(1, RN); else ROW_DOT_CASE(2, RN);
                } else if (mb > 2 && mb <= 4 && RN_WIDE > 1 && nr - r0 >= RN_WIDE) {
                    step = RN_WIDE;
                    if (mb == 3) ROW_DOT_CASE(3, RN_WIDE); else ROW_DOT_CASE(4, RN_WIDE);
#if MB_MAX > 4
                } else if (mb > 4 && nr - r0 >= RN_XWIDE) {
                    step = RN_XWIDE;
                    switch (mb) {
                    case 5: ROW_DOT_CASE(5, RN_XWIDE); break;
                    case 6: ROW_DOT_CASE(6, RN_XWIDE); break;
                    case 7: ROW_DOT_CASE(7, RN_XWIDE); break;
                    default: ROW_DOT_CASE(MB_MAX, RN_XWIDE); break;
                    }
#endif
                } else { /* the last rows of the matrix, one at a time */
                    step = 1;
                    switch (mb) {
                    case 1: ROW_DOT_CASE(1, 1); break;
                    case 2: ROW_DOT_CASE(2, 1); break;
                    case 3: ROW_DOT_CASE(3, 1); break;
#if MB_MAX > 4
                    case 4: ROW_DOT_CASE(4, 1); break;
                    case 5: ROW_DOT_CASE(5, 1); break;
                    case 6: ROW_DOT_CASE(6, 1); break;
                    case 7: ROW_DOT_CASE(7, 1); break;
#endif
                    default: ROW_DOT_CASE(MB_MAX, 1); break;
                    }
                }
                for (int m = 0; m < mb; m++)
                    for (int r = 0; r < step; r++)
                        y[(m0 + m) * ldy + n0 + r0 + r] = o[m][r] + (bias ? bias[n0 + r0 + r] : 0.0f);
                r0 += step;
            }
#else
            for (int64_t r = 0; r < nr; r++) {
                float o[MB_MAX];
                row_dot_scalar(kind, w + (n0 + r) * row_bytes, nb, bb, xm, ldx, mb, o);
                for (int m = 0; m < mb; m++) y[(m0 + m) * ldy + n0 + r] = o[m] + (bias ? bias[n0 + r] : 0.0f);
            }
            (void)out;
#endif
        }
    }
}

/* y[M, N] (row stride ldy) = x[M, K] (row stride ldx) @ W[N, K]^T (+ bias[N] if given).
 * Parallel over groups of RN output rows; activations in chunks of MB_MAX rows per pass. */
void qk_matmul(int kind, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M, int64_t ldx, float *y,
               int64_t ldy, const float *bias, int nthreads) {
    if (kind != Q4_0 && kind != Q4_1 && kind != Q8_0) return;
    const int64_t groups = (N + RN - 1) / RN;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < groups; g++) {
        switch (kind) {
        case Q4_0: direct_group(Q4_0, w, N, K, x, M, ldx, y, ldy, bias, g * RN); break;
        case Q4_1: direct_group(Q4_1, w, N, K, x, M, ldx, y, ldy, bias, g * RN); break;
        default: direct_group(Q8_0, w, N, K, x, M, ldx, y, ldy, bias, g * RN); break;
        }
    }
}

/* The tiled path (many activation rows): the same bits as qk_matmul, unpacking each
 * weight block once per chunk of rows instead of once per 4 rows. Without AVX2 it is
 * qk_matmul. Returns -1 (nothing written) if its scratch cannot be allocated. */
int qk_matmul_tiled(int kind, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M, int64_t ldx,
                     float *y, int64_t ldy, const float *bias, int nthreads) {
#ifdef QK_AVX2
    switch (kind) {
    case Q4_0: case Q4_1: case Q8_0: return tiled_impl(kind, w, N, K, x, M, ldx, y, ldy, bias, nthreads);
    default: return 0;
    }
#else
    qk_matmul(kind, w, N, K, x, M, ldx, y, ldy, bias, nthreads);
    return 0;
#endif
}

/* out[N, K] = the fp32 weights of rows [0, N) (for a dequantize-then-GEMM path). */
void qk_dequant(int kind, const uint8_t *w, int64_t N, int64_t K, float *out, int nthreads) {
    const int bb = qk_block_bytes(kind);
    const int64_t nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < N * nb; i++) {
#ifdef QK_AVX2
        __m256 v[4];
        unpack_avx2(kind, w + i * bb, v);
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(out + i * 32 + 8 * j, v[j]);
#else
        unpack_scalar(kind, w + i * bb, out + i * 32);
#endif
    }
}

/* out[n, K] = the fp32 weights of rows ids[0..n) (embedding lookup of packed rows). */
void qk_rows(int kind, const uint8_t *w, int64_t K, const int64_t *ids, int64_t n, float *out) {
    const int bb = qk_block_bytes(kind);
    const int64_t nb = K / 32, row_bytes = nb * bb;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = w + ids[r] * row_bytes;
        for (int64_t b = 0; b < nb; b++) unpack_scalar(kind, row + b * bb, out + r * K + b * 32);
    }
}
