/* The LoRA delta of a step's adapter rows, added into a fused projection's output (fp32).
 *
 * Per row with slot s >= 0 and per module of the projection (q/k/v, o, gate/up, down):
 * t = scaling[s] * (A_s x) over the slot's own rank (shrink: rank dot products of the
 * input), then out[:, module columns] += B_s t (expand: a rank-term sum per output
 * column). The torch path did this as 7 projections x layers x adapters of small GEMMs
 * and index_add_ calls; here one call covers a projection for every row, and the one-call
 * decoder (cpu_decoder.c) makes it after each packed matmul of its layer loop.
 *
 * Stacks as server/lora/weights.py keeps them on CPU: A [slots, n * R, in] (module i's
 * rows from i * R) and B stored transposed, [slots, R, W] (module i's columns from its
 * offset), zero-padded to R; ranks [slots, n] skip a slot's padding and the modules it
 * does not target (0). With B's rank terms as rows the expand is contiguous vector FMAs
 * over the output columns and reads only the slot's own rank rows (gathering B's [W, R]
 * columns instead ran at a tenth of the speed).
 *
 * Each output's arithmetic is fixed by its own row, slot and module: an fma chain over
 * r = 0..rank-1 from zero, then one add into out; a dot product's lanes and tail in one
 * order. So the bits do not depend on the batch, the thread count or the column tile,
 * and the Python layer loop (which calls this same function) and the C decoder agree.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QL_AVX2 1
#ifdef __AVX512F__
#define QL_AVX512 1
#endif
#endif

#define QL_MAX_MODULES 3
/* Multiply-adds from which a call runs on the caller's threads. A decode step's call is
 * tens of microseconds of work (8 rows, rank 16: ~0.2 M): a parallel region's barrier
 * costs more than it saves there, and on a loaded 2-core machine a barrier waits out a
 * whole scheduler slice, so (as cpu_ops.c does for small row counts) it runs on one. */
#define QL_PARALLEL_WORK (1 << 22)

typedef struct {
    const float *a;        /* [slots, n * R, in] */
    const float *bt;       /* [slots, R, W]: B transposed, W = sum of widths */
    const int32_t *ranks;  /* [slots, n]: the slot's rank per module, 0 = not targeted */
    int64_t in, n;
    int64_t widths[QL_MAX_MODULES];
} ql_group;

typedef struct {
    int64_t rank, slots;      /* R (the padded rank), slots in the stacks */
    const int32_t *row_slots; /* [M]: -1 = the base model */
    const float *scalings;    /* [slots] */
    float *t;                 /* work: [M, QL_MAX_MODULES, R] */
} ql_rows;

/* res[j] = dot(x, a + j * in) for j < NR; one order per dot whatever NR is. */
static inline __attribute__((always_inline)) void ql_dots(const float *x, const float *a, int64_t in, int nr,
                                                          float *res) {
    int64_t k = 0;
#if defined(QL_AVX512)
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (; k + 16 <= in; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
        for (int j = 0; j < nr; j++) acc[j] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(a + j * in + k), acc[j]);
    }
    if (k < in) {
        const __mmask16 m = (__mmask16)((1u << (in - k)) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
        for (int j = 0; j < nr; j++) acc[j] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, a + j * in + k), acc[j]);
    }
    for (int j = 0; j < nr; j++) res[j] = _mm512_reduce_add_ps(acc[j]);
#elif defined(QL_AVX2)
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (; k + 8 <= in; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        for (int j = 0; j < nr; j++) acc[j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(a + j * in + k), acc[j]);
    }
    for (int j = 0; j < nr; j++) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        float tail = 0.0f;
        for (int64_t kk = k; kk < in; kk++) tail = fmaf(x[kk], a[j * in + kk], tail);
        res[j] = _mm_cvtss_f32(s) + tail;
    }
#else
    for (int j = 0; j < nr; j++) {
        float s = 0.0f;
        for (k = 0; k < in; k++) s += x[k] * a[j * in + k];
        res[j] = s;
    }
#endif
}

/* t[0..R) = scaling * A x over the first `rank` rows of A (zeros after them). */
static void ql_shrink(const float *x, const float *a, int64_t in, int64_t rank, int64_t R, float scaling, float *t) {
    int64_t r = 0;
    for (; r + 4 <= rank; r += 4) ql_dots(x, a + r * in, in, 4, t + r);
    for (; r < rank; r++) ql_dots(x, a + r * in, in, 1, t + r);
    for (r = 0; r < rank; r++) t[r] *= scaling;
    for (; r < R; r++) t[r] = 0.0f;
}

/* out[c] += sum_r t[r] * bt[r * W + c] for columns [c0, c1) (bt: a module's first
 * column in the transposed stack, rows W apart): per column an fma chain over r from
 * zero, then one add, in the vector lanes and the scalar tail alike. */
static void ql_expand(const float *bt, int64_t W, const float *t, int64_t rank, int64_t c0, int64_t c1, float *out) {
    int64_t c = c0;
#if defined(QL_AVX512)
    for (; c + 64 <= c1; c += 64) { /* four independent chains */
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int64_t r = 0; r < rank; r++) {
            const __m512 tr = _mm512_set1_ps(t[r]);
            const float *row = bt + r * W + c;
            acc0 = _mm512_fmadd_ps(tr, _mm512_loadu_ps(row), acc0);
            acc1 = _mm512_fmadd_ps(tr, _mm512_loadu_ps(row + 16), acc1);
            acc2 = _mm512_fmadd_ps(tr, _mm512_loadu_ps(row + 32), acc2);
            acc3 = _mm512_fmadd_ps(tr, _mm512_loadu_ps(row + 48), acc3);
        }
        _mm512_storeu_ps(out + c, _mm512_add_ps(_mm512_loadu_ps(out + c), acc0));
        _mm512_storeu_ps(out + c + 16, _mm512_add_ps(_mm512_loadu_ps(out + c + 16), acc1));
        _mm512_storeu_ps(out + c + 32, _mm512_add_ps(_mm512_loadu_ps(out + c + 32), acc2));
        _mm512_storeu_ps(out + c + 48, _mm512_add_ps(_mm512_loadu_ps(out + c + 48), acc3));
    }
    for (; c + 16 <= c1; c += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t r = 0; r < rank; r++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(t[r]), _mm512_loadu_ps(bt + r * W + c), acc);
        _mm512_storeu_ps(out + c, _mm512_add_ps(_mm512_loadu_ps(out + c), acc));
    }
#elif defined(QL_AVX2)
    for (; c + 32 <= c1; c += 32) {
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int64_t r = 0; r < rank; r++) {
            const __m256 tr = _mm256_set1_ps(t[r]);
            const float *row = bt + r * W + c;
            acc0 = _mm256_fmadd_ps(tr, _mm256_loadu_ps(row), acc0);
            acc1 = _mm256_fmadd_ps(tr, _mm256_loadu_ps(row + 8), acc1);
            acc2 = _mm256_fmadd_ps(tr, _mm256_loadu_ps(row + 16), acc2);
            acc3 = _mm256_fmadd_ps(tr, _mm256_loadu_ps(row + 24), acc3);
        }
        _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_loadu_ps(out + c), acc0));
        _mm256_storeu_ps(out + c + 8, _mm256_add_ps(_mm256_loadu_ps(out + c + 8), acc1));
        _mm256_storeu_ps(out + c + 16, _mm256_add_ps(_mm256_loadu_ps(out + c + 16), acc2));
        _mm256_storeu_ps(out + c + 24, _mm256_add_ps(_mm256_loadu_ps(out + c + 24), acc3));
    }
    for (; c + 8 <= c1; c += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t r = 0; r < rank; r++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(t[r]), _mm256_loadu_ps(bt + r * W + c), acc);
        _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_loadu_ps(out + c), acc));
    }
#endif
    for (; c < c1; c++) {
        float s = 0.0f;
        for (int64_t r = 0; r < rank; r++) {
#ifdef QL_AVX2
            s = fmaf(t[r], bt[r * W + c], s);
#else
            s += t[r] * bt[r * W + c];
#endif
        }
        out[c] += s;
    }
}

/* out[m, :W] += the delta of row m for the group's modules, for the M rows of x (row
 * strides x_stride, out_stride). Returns 0; -1 a slot outside the stacks (nothing
 * written); -2 more modules than the work buffer holds. */
int ql_add(const ql_group *g, const ql_rows *rows, const float *x, int64_t x_stride, int64_t M, float *out,
           int64_t out_stride, int nthreads) {
    const int64_t R = rows->rank, n = g->n, in = g->in;
    if (n < 1 || n > QL_MAX_MODULES) return -2;
    int any = 0;
    for (int64_t m = 0; m < M; m++) {
        if (rows->row_slots[m] >= rows->slots) return -1;
        any |= rows->row_slots[m] >= 0;
    }
    if (!any) return 0;
    int64_t W = 0, col[QL_MAX_MODULES];
    for (int64_t i = 0; i < n; i++) {
        col[i] = W;
        W += g->widths[i];
    }
    int64_t work = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0, s = rows->row_slots[m]; s >= 0 && i < n; i++) work += g->ranks[s * n + i] * (in + g->widths[i]);
#pragma omp parallel for schedule(static, 1) num_threads(nthreads) if (nthreads > 1 && work >= QL_PARALLEL_WORK)
    for (int64_t task = 0; task < M * n; task++) { /* (row, module): one barrier per call */
        const int64_t m = task / n, i = task % n, s = rows->row_slots[m];
        if (s < 0) continue;
        const int64_t rank = g->ranks[s * n + i];
        if (rank == 0) continue;
        float *t = rows->t + (m * QL_MAX_MODULES + i) * R;
        ql_shrink(x + m * x_stride, g->a + (s * n + i) * R * in, in, rank, R, rows->scalings[s], t);
        ql_expand(g->bt + s * R * W + col[i], W, t, rank, 0, g->widths[i], out + m * out_stride + col[i]);
    }
    return 0;
}
