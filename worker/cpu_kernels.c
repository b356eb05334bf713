/* The CPU engine's float32 kernels: causal attention over a paged KV cache, SiLU-mul, and
 * rotary + KV store. Attention: the keys and values are read through
 * each sequence's block table, once per tile of query rows, and never copied out of the cache.
 *
 * Built by worker/native.py with the system C compiler (-O3 -march=native -ffast-math) and called
 * through ctypes. Layouts (element strides):
 *   q, out      [T, heads, head_dim]        row t, head h at t * st + h * sh (head_dim contiguous)
 *   k/v cache   [kv_heads, slots, head_dim] kv head g, slot s at g * skh + s * head_dim
 *   block_tables[num_seqs, max_blocks] int32; slot of position p = table[p / bs] * bs + p % bs
 * Sequence i has query rows [q_starts[i], q_starts[i] + q_lens[i]) at positions
 * seq_lens[i] - q_lens[i] ...; each row sees keys [0, its position].
 *
 * Per (sequence, kv head): the query heads that share the kv head (GQA group) and up to a few
 * query tokens form a tile of rows; pass 1 scores every key for every row of the tile (keys read
 * once per tile), the softmax runs per row in float32, pass 2 accumulates the values (read once
 * per tile) into the rows' outputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TILE_ROWS 16

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

int helix_paged_attention_f32(float *out, const float *q, const float *k_cache, const float *v_cache,
                              const int32_t *block_tables, const int32_t *seq_lens,
                              const int32_t *q_starts, const int32_t *q_lens, int64_t num_seqs,
                              int64_t max_blocks, int64_t heads, int64_t kv_heads, int64_t head_dim,
                              int64_t block_size, int64_t q_stride_t, int64_t q_stride_h,
                              int64_t o_stride_t, int64_t o_stride_h, int64_t kv_stride_h,
                              float scale) {
    int64_t group = heads / kv_heads;
    int64_t tile_tokens = group >= MAX_TILE_ROWS ? 1 : MAX_TILE_ROWS / group;
    int64_t longest = 0;
    for (int64_t i = 0; i < num_seqs; i++)
        if (seq_lens[i] > longest) longest = seq_lens[i];
    int64_t rows_cap = tile_tokens * group;
    float *scores = malloc(sizeof(float) * (size_t)(rows_cap * (longest > 0 ? longest : 1)));
    float *acc = malloc(sizeof(float) * (size_t)(rows_cap * head_dim));
    if (scores == NULL || acc == NULL) {
        free(scores);
        free(acc);
        return 1;
    }
    for (int64_t s = 0; s < num_seqs; s++) {
        const int32_t *table = block_tables + s * max_blocks;
        int64_t q_len = q_lens[s], seq_len = seq_lens[s], ctx0 = seq_len - q_len;
        for (int64_t g = 0; g < kv_heads; g++) {
            const float *kc = k_cache + g * kv_stride_h, *vc = v_cache + g * kv_stride_h;
            for (int64_t t0 = 0; t0 < q_len; t0 += tile_tokens) {
                int64_t nt = q_len - t0 < tile_tokens ? q_len - t0 : tile_tokens;
                int64_t rows = nt * group;
                int64_t keys = ctx0 + t0 + nt;           /* what the tile's last token sees */
                /* pass 1: scores (row r = token t0 + r / group, head g * group + r % group),
                 * block by block: no division per key */
                for (int64_t b0 = 0; b0 < keys; b0 += block_size) {
                    const float *kb = kc + (int64_t)table[b0 / block_size] * block_size * head_dim;
                    int64_t nb = keys - b0 < block_size ? keys - b0 : block_size;
                    for (int64_t r = 0; r < rows; r++) {
                        int64_t t = t0 + r / group, limit = ctx0 + t + 1 - b0;   /* keys it sees here */
                        const float *qr = q + (q_starts[s] + t) * q_stride_t + (g * group + r % group) * q_stride_h;
                        float *sr = scores + r * longest + b0;
                        int64_t n = nb < limit ? nb : limit;
                        for (int64_t j = 0; j < n; j++) sr[j] = dot(qr, kb + j * head_dim, head_dim) * scale;
                    }
                }
                /* softmax per row over its own keys */
                for (int64_t r = 0; r < rows; r++) {
                    int64_t n = ctx0 + t0 + r / group + 1;
                    float *sr = scores + r * longest, m = sr[0], sum = 0.0f;
                    for (int64_t p = 1; p < n; p++) m = sr[p] > m ? sr[p] : m;
                    for (int64_t p = 0; p < n; p++) {
                        sr[p] = expf(sr[p] - m);
                        sum += sr[p];
                    }
                    float inv = 1.0f / sum;
                    for (int64_t p = 0; p < n; p++) sr[p] *= inv;
                }
                /* pass 2: values, block by block */
                memset(acc, 0, sizeof(float) * (size_t)(rows * head_dim));
                for (int64_t b0 = 0; b0 < keys; b0 += block_size) {
                    const float *vb = vc + (int64_t)table[b0 / block_size] * block_size * head_dim;
                    int64_t nb = keys - b0 < block_size ? keys - b0 : block_size;
                    for (int64_t r = 0; r < rows; r++) {
                        int64_t limit = ctx0 + t0 + r / group + 1 - b0;
                        int64_t n = nb < limit ? nb : limit;
                        const float *pr = scores + r * longest + b0;
                        float *a = acc + r * head_dim;
                        for (int64_t j = 0; j < n; j++) {
                            const float w = pr[j], *v = vb + j * head_dim;
#pragma omp simd
                            for (int64_t d = 0; d < head_dim; d++) a[d] += w * v[d];
                        }
                    }
                }
                for (int64_t r = 0; r < rows; r++) {
                    int64_t t = t0 + r / group;
                    float *o = out + (q_starts[s] + t) * o_stride_t + (g * group + r % group) * o_stride_h;
                    memcpy(o, acc + r * head_dim, sizeof(float) * (size_t)head_dim);
                }
            }
        }
    }
    free(scores);
    free(acc);
    return 0;
}

/* silu(gate) * up, row by row: gate_up [n, 2 * inter] (gate first; row stride in elements),
 * out [n, inter] contiguous. */
void helix_silu_mul_f32(float *out, const float *gate_up, int64_t n, int64_t inter, int64_t stride_in) {
    for (int64_t i = 0; i < n; i++) {
        const float *g = gate_up + i * stride_in, *u = g + inter;
        float *o = out + i * inter;
#pragma omp simd
        for (int64_t j = 0; j < inter; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

/* HF's rotate-half rotary on the q and k heads of qkv [n, (heads + 2 kv_heads) * head_dim] (row
 * stride in elements), in place, then the rotated k and the v of each token stored at its slot of
 * one layer's cache [kv_heads, slots, head_dim]. cos/sin: [positions, head_dim] tables whose two
 * halves are equal (HF's cat(freqs, freqs)). */
void helix_rotary_store_f32(float *qkv, const int64_t *positions, const int64_t *slots,
                            const float *cos_table, const float *sin_table, float *k_cache,
                            float *v_cache, int64_t n, int64_t heads, int64_t kv_heads,
                            int64_t head_dim, int64_t stride_t, int64_t kv_stride_h) {
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < n; t++) {
        const float *c = cos_table + positions[t] * head_dim, *s = sin_table + positions[t] * head_dim;
        float *row = qkv + t * stride_t;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            float *x = row + h * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i + half] + x1 * s[i + half];
            }
        }
        for (int64_t g = 0; g < kv_heads; g++) {
            float *kd = k_cache + g * kv_stride_h + slots[t] * head_dim;
            float *vd = v_cache + g * kv_stride_h + slots[t] * head_dim;
            memcpy(kd, row + (heads + g) * head_dim, sizeof(float) * (size_t)head_dim);
            memcpy(vd, row + (heads + kv_heads + g) * head_dim, sizeof(float) * (size_t)head_dim);
        }
    }
}
