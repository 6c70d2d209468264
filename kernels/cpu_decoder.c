/* Every decoder layer of a decode-only CPU step in one call (packed GGUF weights, fp32).
 *
 * At batch 1 the model's Python loop made ~10 calls per layer, each with its checks,
 * views and allocations: a quarter of a token's time on the embedded model went there,
 * not into arithmetic. This runs the same loop in C: it calls the very kernels the
 * Python path calls (cpu_quant.c, cpu_ops.c, cpu_attention.c, built into this library
 * as one unit), in the same order, on buffers laid out as the Python path's tensors, with
 * the same thread count, so each output is the same bits as the Python loop's.
 *
 * Per layer: qkv = x W_qkv^T (+ bias); q/k head norms (Qwen3); rotary on q and k; K/V
 * rows into the paged pools; paged decode attention; o = attn W_o^T; residual += o;
 * x = norm(residual); gate_up; silu(gate) * up; down; residual += down; x = norm(residual)
 * with the next layer's input norm (the final norm after the last layer).
 *
 * With adapter rows (`lora` not NULL) each of the four matmuls is followed by ql_add
 * (cpu_lora.c, the function the Python loop calls): the LoRA delta of every row that has
 * a slot, added into that projection's output before anything reads it.
 */
#include "cpu_quant.c"
#include "cpu_ops.c"
#include "cpu_attention.c"
#include "cpu_lora.c"

typedef struct {
    const uint8_t *qkv, *o, *gate_up, *down; /* GGUF blocks, rows contiguous */
    const float *qkv_bias;                   /* NULL: none */
    const float *input_norm, *post_norm;
    const float *q_norm, *k_norm; /* NULL: no per-head norm */
    int32_t qkv_kind, o_kind, gate_up_kind, down_kind;
} qd_layer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate;
    float eps, scale;
    const float *cos_sin; /* [rotary_positions, head_dim] */
    int64_t rotary_positions;
    const float *final_norm;
} qd_model;

/* The Python path's matmul: the tiled kernel from TILED_MIN_ROWS rows (chosen by the
 * caller), the direct one otherwise or when tiled cannot get its scratch; same bits. */
static void linear(int kind, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M, float *y,
                   const float *bias, int tiled, int nthreads) {
    if (!tiled || qk_matmul_tiled(kind, w, N, K, x, M, K, y, N, bias, nthreads) != 0)
        qk_matmul(kind, w, N, K, x, M, K, y, N, bias, nthreads);
}

/* Floats of the `work` buffer qd_decode carves for B rows: qkv, q, attention output,
 * gate_up, and the SiLU product. */
int64_t qd_work_floats(const qd_model *m, int64_t B) {
    const int64_t nq = m->heads * m->head_dim, nkv = m->kv_heads * m->head_dim;
    return B * ((nq + 2 * nkv) + nq + nq + 2 * m->intermediate + m->intermediate);
}

/* residual [B, hidden]: the embeddings in, the residual stream out; out [B, hidden]: the
 * final-normed hidden states; work: qd_work_floats(m, B) floats; lora_groups: NULL (no
 * adapter rows) or the slot pool's stacks, 4 per layer (qkv, o, gate_up, down), with the
 * step's rows in lora_rows. Returns 0; -1 a position outside the rotary cache, -2 a slot
 * outside the pools, -4 an adapter slot outside the stacks (all checked before anything
 * is written), -3 no memory for the attention scores. */
int qd_decode(const qd_model *m, const qd_layer *layers, float *const *k_caches, float *const *v_caches,
              int64_t num_slots, int64_t block_size, float *residual, float *out, const int64_t *positions,
              const int64_t *slots, const int32_t *tables, int64_t bt_stride, const int32_t *lens, int64_t B,
              int tiled, float *work, const ql_group *lora_groups, const ql_rows *lora_rows, int nthreads) {
    const int64_t H = m->hidden, D = m->head_dim, nq = m->heads * D, nkv = m->kv_heads * D;
    const int64_t nqkv = nq + 2 * nkv, I = m->intermediate;
    for (int64_t b = 0; b < B; b++) {
        if (positions[b] < 0 || positions[b] >= m->rotary_positions) return -1;
        if (slots[b] < 0 || slots[b] >= num_slots) return -2;
        if (lora_groups && lora_rows->row_slots[b] >= lora_rows->slots) return -4;
    }
    float *qkv = work, *q = qkv + B * nqkv, *attn = q + B * nq, *gate_up = attn + B * nq, *act = gate_up + B * 2 * I;
    float *x = out, *proj = out; /* x is consumed by each matmul before proj is written */
    qo_rms_norm(residual, layers[0].input_norm, B, H, m->eps, x, nthreads);
    for (int64_t l = 0; l < m->layers; l++) {
        const qd_layer *L = &layers[l];
        linear(L->qkv_kind, L->qkv, nqkv, H, x, B, qkv, L->qkv_bias, tiled, nthreads);
        if (lora_groups) ql_add(&lora_groups[l * 4], lora_rows, x, H, B, qkv, nqkv, nthreads);
        if (L->q_norm) /* per head, in place: each row is read in full before it is written */
            for (int64_t b = 0; b < B; b++) {
                float *row = qkv + b * nqkv;
                qo_rms_norm(row, L->q_norm, m->heads, D, m->eps, row, nthreads);
                qo_rms_norm(row + nq, L->k_norm, m->kv_heads, D, m->eps, row + nq, nthreads);
            }
        qo_rotary(positions, qkv, nqkv, m->heads, qkv + nq, nqkv, m->kv_heads, B, D, m->cos_sin,
                  m->rotary_positions, nthreads);
        qo_cache_write(qkv + nq, nqkv, qkv + nq + nkv, nqkv, k_caches[l], v_caches[l], slots, B, nkv, num_slots);
        for (int64_t b = 0; b < B; b++) memcpy(q + b * nq, qkv + b * nqkv, (size_t)nq * sizeof(float));
        if (qa_decode(q, k_caches[l], v_caches[l], tables, bt_stride, lens, B, m->heads, m->kv_heads, D, block_size,
                      m->scale, attn, nthreads) != 0)
            return -3;
        linear(L->o_kind, L->o, H, nq, attn, B, proj, NULL, tiled, nthreads);
        if (lora_groups) ql_add(&lora_groups[l * 4 + 1], lora_rows, attn, nq, B, proj, H, nthreads);
        qo_add_rms_norm(proj, residual, L->post_norm, B, H, m->eps, x, nthreads);
        linear(L->gate_up_kind, L->gate_up, 2 * I, H, x, B, gate_up, NULL, tiled, nthreads);
        if (lora_groups) ql_add(&lora_groups[l * 4 + 2], lora_rows, x, H, B, gate_up, 2 * I, nthreads);
        qo_silu_mul(gate_up, B, I, act, nthreads);
        linear(L->down_kind, L->down, H, I, act, B, proj, NULL, tiled, nthreads);
        if (lora_groups) ql_add(&lora_groups[l * 4 + 3], lora_rows, act, I, B, proj, H, nthreads);
        const float *next_norm = l + 1 < m->layers ? layers[l + 1].input_norm : m->final_norm;
        qo_add_rms_norm(proj, residual, next_norm, B, H, m->eps, x, nthreads);
    }
    return 0;
}
