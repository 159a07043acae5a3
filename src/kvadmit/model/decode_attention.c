/* Decode attention over a bf16 token pool, reading each sequence's K and V through its slot list
(decode_attention_native.py): no gathered copy of the keys and values, float32 arithmetic throughout.

The pool of one layer is [2·kv_heads, slots, dim] bf16: K head h at pool[h], V head h at pool[kv_heads + h].
Query heads are kv_head·groups + group. For sequence b, KV head h, query head g of its group:

    score_t = scale · q_g · K[slot_t]          t < length_b
    p_t     = exp(score_t − max) / Σ exp(score − max)
    out_g   = Σ_t p_t · V[slot_t]

Vectorized with AVX2 and FMA (8 floats); `dim` must be a multiple of 8 and at most MAX_DIM.
*/
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_DIM 256
#define BLOCK 8 /* keys whose scores are reduced together */

#define AHEAD 16 /* value rows fetched ahead of use: slots are in no order, so no hardware prefetcher helps */

#define AVX2 __attribute__((target("avx2,fma")))

/* A 128-byte row (64 bf16: two cache lines) on its way into L1. */
static inline void prefetch_row(const uint16_t *p) {
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)p + 64, _MM_HINT_T0);
}

/* 8 bf16 → 8 float32 (exact: a bf16 is the top half of a float32). */
static inline AVX2 __m256 load_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* The sums of 8 vectors' lanes, as one vector: lane i = Σ lanes of v[i]. */
static inline AVX2 __m256 sums_of_8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
    const __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    /* ab = [s0 s1 s2 s3 | s0' s1' s2' s3'] (low and high 128-bit halves of each vector's sum); cd likewise */
    const __m256 low = _mm256_permute2f128_ps(ab, cd, 0x20), high = _mm256_permute2f128_ps(ab, cd, 0x31);
    return _mm256_add_ps(low, high);
}

/* exp(x) for x ≤ 0 (x − max of a softmax), relative error ~2e-7: 2^(x·log2 e) as 2^n · 2^f, f in
   [−0.5, 0.5], 2^f by its degree-6 Taylor polynomial in f·ln 2; below −87 it is 0. */
static inline AVX2 __m256 exp_nonpositive(__m256 x) {
    const __m256 floor_x = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, floor_x, _CMP_LT_OQ);
    x = _mm256_max_ps(x, floor_x);
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147180559945309f));
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

/* Each of the `groups` rows of scores [groups, length] replaced by exp(score − the row's max), and each
   row's sum in total[g] (the softmax unnormalized: the sum divides at the end). */
static inline AVX2 __attribute__((always_inline)) void softmax_rows(float *scores, int groups, int length,
                                                                    float *total) {
    for (int g = 0; g < groups; g++) {
        float *s = scores + (size_t)g * length;
        __m256 top8 = _mm256_set1_ps(-INFINITY);
        int m = 0;
        for (; m + 8 <= length; m += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + m));
        float lanes_top[8];
        _mm256_storeu_ps(lanes_top, top8);
        float top = -INFINITY;
        for (int i = 0; i < 8; i++) top = lanes_top[i] > top ? lanes_top[i] : top;
        for (; m < length; m++) top = s[m] > top ? s[m] : top;
        const __m256 topv = _mm256_set1_ps(top);
        __m256 sum = _mm256_setzero_ps();
        int t = 0;
        for (; t + 8 <= length; t += 8) {
            const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), topv));
            _mm256_storeu_ps(s + t, e);
            sum = _mm256_add_ps(sum, e);
        }
        float rest = 0.0f;
        if (t < length) {
            float tail[8] = {0};
            for (int i = 0; t + i < length; i++) tail[i] = s[t + i] - top;
            float e[8];
            _mm256_storeu_ps(e, exp_nonpositive(_mm256_loadu_ps(tail)));
            for (int i = 0; t + i < length; i++) {
                s[t + i] = e[i];
                rest += e[i];
            }
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, sum);
        total[g] = rest;
        for (int i = 0; i < 8; i++) total[g] += lanes[i];
    }
}

/* out[g, 8·c0 .. 8·(c0+cn)) = Σ_t p[g, t] V_t over those dims, for query heads g0 .. g0+gn (gn ≤ 3, cn ≤ 4) */
static inline AVX2 __attribute__((always_inline)) void values_pass(
    const uint16_t *values, size_t row, const int64_t *slots, int length, const float *restrict p, int stride,
    int g0, const int gn, int c0, const int cn, float *restrict out, int dim) {
    __m256 acc[3][4];
    for (int g = 0; g < gn; g++)
        for (int c = 0; c < cn; c++) acc[g][c] = _mm256_setzero_ps();
    for (int t = 0; t < length; t++) {
        if (t + AHEAD < length) prefetch_row(values + (size_t)slots[t + AHEAD] * row + 8 * c0);
        const uint16_t *v = values + (size_t)slots[t] * row + 8 * c0;
        __m256 vc[4];
        for (int c = 0; c < cn; c++) vc[c] = load_bf16(v + 8 * c);
        for (int g = 0; g < gn; g++) {
            const __m256 pt = _mm256_set1_ps(p[(size_t)(g0 + g) * stride + t]);
            for (int c = 0; c < cn; c++) acc[g][c] = _mm256_fmadd_ps(pt, vc[c], acc[g][c]);
        }
    }
    for (int g = 0; g < gn; g++)
        for (int c = 0; c < cn; c++) _mm256_storeu_ps(out + (size_t)(g0 + g) * dim + 8 * (c0 + c), acc[g][c]);
}

/* One sequence and one KV head: the `groups` query heads q [groups, dim] → out [groups, dim].
   scores: scratch of groups × length floats. */
static inline AVX2 __attribute__((always_inline)) void one_head(
    const float *restrict q, int groups, const int chunks, const uint16_t *keys, const uint16_t *values,
    size_t row, const int64_t *slots, int length, float scale, float *restrict scores, float *restrict out) {
    const int dim = 8 * chunks;
    float block[BLOCK][MAX_DIM] __attribute__((aligned(32)));
    /* scores, BLOCK keys at a time: their rows converted once, then each query head against them */
    for (int t0 = 0; t0 < length; t0 += BLOCK) {
        const int n = length - t0 < BLOCK ? length - t0 : BLOCK;
        for (int i = 0; t0 + BLOCK + i < length && i < BLOCK; i++) prefetch_row(keys + (size_t)slots[t0 + BLOCK + i] * row);
        for (int i = 0; i < BLOCK; i++) {
            const uint16_t *k = keys + (size_t)slots[t0 + (i < n ? i : 0)] * row;
            for (int c = 0; c < chunks; c++) _mm256_store_ps(&block[i][8 * c], load_bf16(k + 8 * c));
        }
        for (int g = 0; g < groups; g++) {
            const float *qg = q + (size_t)g * dim;
            __m256 acc[BLOCK];
            for (int i = 0; i < BLOCK; i++) acc[i] = _mm256_setzero_ps();
            for (int c = 0; c < chunks; c++) {
                const __m256 qc = _mm256_loadu_ps(qg + 8 * c);
                for (int i = 0; i < BLOCK; i++) acc[i] = _mm256_fmadd_ps(qc, _mm256_load_ps(&block[i][8 * c]), acc[i]);
            }
            float s[BLOCK];
            _mm256_storeu_ps(s, _mm256_mul_ps(sums_of_8(acc), _mm256_set1_ps(scale)));
            for (int i = 0; i < n; i++) scores[(size_t)g * length + t0 + i] = s[i];
        }
    }
    float total[64];
    softmax_rows(scores, groups, length, total);
    /* out_g = Σ p_t V_t / Σ p_t: up to 3 query heads and 4 chunks (32 dims) at a time, their 12
       accumulators in registers, each value chunk converted once per pass for all of them */
    for (int g0 = 0; g0 < groups; g0 += 3) {
        const int gn = groups - g0 < 3 ? groups - g0 : 3;
        for (int c0 = 0; c0 < chunks; c0 += 4) {
            const int cn = chunks - c0 < 4 ? chunks - c0 : 4;
            switch (gn * 4 + cn) { /* constant counts, so each unrolls */
                case 3 * 4 + 4: values_pass(values, row, slots, length, scores, length, g0, 3, c0, 4, out, dim); break;
                case 2 * 4 + 4: values_pass(values, row, slots, length, scores, length, g0, 2, c0, 4, out, dim); break;
                case 1 * 4 + 4: values_pass(values, row, slots, length, scores, length, g0, 1, c0, 4, out, dim); break;
                default: values_pass(values, row, slots, length, scores, length, g0, gn, c0, cn, out, dim); break;
            }
        }
    }
    for (int g = 0; g < groups; g++) {
        const __m256 inv = _mm256_set1_ps(1.0f / total[g]);
        for (int c = 0; c < chunks; c++) {
            float *o = out + (size_t)g * dim + 8 * c;
            _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), inv));
        }
    }
}

#define AVX512 __attribute__((target("avx512f,avx2,fma"), always_inline))

/* 16 bf16 → 16 float32. */
static inline AVX512 __m512 load_bf16_16(const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* The 16-wide twin of one_head for a head size of 64 (4 vectors): scores for BLOCK keys at a time, each
   key's 16 lanes folded to 8 before sums_of_8; then the values for up to 3 query heads at once (12
   accumulators). The softmax in between is one_head's (softmax_rows). */
static inline AVX512 void one_head_64(const float *restrict q, int groups, const uint16_t *keys,
                                      const uint16_t *values, const int64_t *slots, int length, float scale,
                                      float *restrict scores, float *restrict out, float *total) {
    __m512 qv[64][4];
    for (int g = 0; g < groups; g++)
        for (int c = 0; c < 4; c++) qv[g][c] = _mm512_loadu_ps(q + (size_t)g * 64 + 16 * c);
    for (int t0 = 0; t0 < length; t0 += BLOCK) {
        const int n = length - t0 < BLOCK ? length - t0 : BLOCK;
        __m512 k[BLOCK][4];
        for (int i = 0; t0 + BLOCK + i < length && i < BLOCK; i++) prefetch_row(keys + (size_t)slots[t0 + BLOCK + i] * 64);
        for (int i = 0; i < BLOCK; i++) {
            const uint16_t *row = keys + (size_t)slots[t0 + (i < n ? i : 0)] * 64;
            for (int c = 0; c < 4; c++) k[i][c] = load_bf16_16(row + 16 * c);
        }
        for (int g = 0; g < groups; g++) {
            __m256 acc[BLOCK];
            for (int i = 0; i < BLOCK; i++) {
                __m512 a = _mm512_mul_ps(qv[g][0], k[i][0]);
                a = _mm512_fmadd_ps(qv[g][1], k[i][1], a);
                a = _mm512_fmadd_ps(qv[g][2], k[i][2], a);
                a = _mm512_fmadd_ps(qv[g][3], k[i][3], a);
                acc[i] = _mm256_add_ps(_mm512_castps512_ps256(a),
                                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
            }
            float s[BLOCK];
            _mm256_storeu_ps(s, _mm256_mul_ps(sums_of_8(acc), _mm256_set1_ps(scale)));
            for (int i = 0; i < n; i++) scores[(size_t)g * length + t0 + i] = s[i];
        }
    }
    softmax_rows(scores, groups, length, total);
    for (int g0 = 0; g0 < groups; g0 += 3) {
        const int gn = groups - g0 < 3 ? groups - g0 : 3;
        __m512 acc[3][4];
        for (int g = 0; g < 3; g++)
            for (int c = 0; c < 4; c++) acc[g][c] = _mm512_setzero_ps();
        for (int t = 0; t < length; t++) {
            if (t + AHEAD < length) prefetch_row(values + (size_t)slots[t + AHEAD] * 64);
            const uint16_t *v = values + (size_t)slots[t] * 64;
            const __m512 v0 = load_bf16_16(v), v1 = load_bf16_16(v + 16);
            const __m512 v2 = load_bf16_16(v + 32), v3 = load_bf16_16(v + 48);
            for (int g = 0; g < 3; g++) {
                if (g < gn) {
                    const __m512 pt = _mm512_set1_ps(scores[(size_t)(g0 + g) * length + t]);
                    acc[g][0] = _mm512_fmadd_ps(pt, v0, acc[g][0]);
                    acc[g][1] = _mm512_fmadd_ps(pt, v1, acc[g][1]);
                    acc[g][2] = _mm512_fmadd_ps(pt, v2, acc[g][2]);
                    acc[g][3] = _mm512_fmadd_ps(pt, v3, acc[g][3]);
                }
            }
        }
        for (int g = 0; g < gn; g++) {
            const __m512 inv = _mm512_set1_ps(1.0f / total[g0 + g]);
            for (int c = 0; c < 4; c++)
                _mm512_storeu_ps(out + (size_t)(g0 + g) * 64 + 16 * c, _mm512_mul_ps(acc[g][c], inv));
        }
    }
}

static __attribute__((target("avx512f,avx2,fma"))) void all_heads_64(
    const float *q, int b, int kv_heads, int groups, const uint16_t *pool, int64_t slots,
    const int64_t *gather, int stride, const int32_t *lengths, float scale, float *scores, float *out) {
    const size_t head = (size_t)slots * 64;
    float total[64];
    for (int i = 0; i < b; i++) {
        for (int h = 0; h < kv_heads; h++) {
            const size_t at = ((size_t)i * kv_heads + h) * groups * 64;
            one_head_64(q + at, groups, pool + h * head, pool + (kv_heads + h) * head, gather + (size_t)i * stride,
                        lengths[i], scale, scores, out + at, total);
        }
    }
}

/* every sequence and KV head; head size 64 (8 chunks) compiled on its own, its loops unrolled */
static AVX2 void all_heads(const float *q, int b, int kv_heads, int groups, int dim, const uint16_t *pool,
                           int64_t slots, const int64_t *gather, int stride, const int32_t *lengths,
                           float scale, float *scores, float *out) {
    const size_t head = (size_t)slots * dim;
    for (int i = 0; i < b; i++) {
        for (int h = 0; h < kv_heads; h++) {
            const size_t at = ((size_t)i * kv_heads + h) * groups * dim;
            const uint16_t *k = pool + h * head, *v = pool + (kv_heads + h) * head;
            const int64_t *s = gather + (size_t)i * stride;
            if (dim == 64)
                one_head(q + at, groups, 8, k, v, (size_t)dim, s, lengths[i], scale, scores, out + at);
            else
                one_head(q + at, groups, dim / 8, k, v, (size_t)dim, s, lengths[i], scale, scores, out + at);
        }
    }
}

/* q [b, kv_heads·groups, dim] float32; pool as above with `slots` rows per head; gather [b, stride] int64
   slot lists (sequence i's first lengths[i]); out [b, kv_heads·groups, dim] float32. 0, or -1 on a shape
   this code does not take (dim not a multiple of 8 or over MAX_DIM, groups over 64) or no memory. */
int kvadmit_decode_attention(const float *q, int b, int kv_heads, int groups, int dim, const uint16_t *pool,
                             int64_t slots, const int64_t *gather, int stride, const int32_t *lengths,
                             float scale, float *out) {
    if (dim % 8 || dim > MAX_DIM || groups > 64 || !__builtin_cpu_supports("avx2") ||
        !__builtin_cpu_supports("fma"))
        return -1;
    const int wide = dim == 64 && __builtin_cpu_supports("avx512f");
    int longest = 1;
    for (int i = 0; i < b; i++) longest = lengths[i] > longest ? lengths[i] : longest;
    float *scores = (float *)malloc(sizeof(float) * (size_t)groups * longest);
    if (scores == NULL) return -1;
    if (wide)
        all_heads_64(q, b, kv_heads, groups, pool, slots, gather, stride, lengths, scale, scores, out);
    else
        all_heads(q, b, kv_heads, groups, dim, pool, slots, gather, stride, lengths, scale, scores, out);
    free(scores);
    return 0;
}
