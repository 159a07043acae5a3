/* Decode attention over the token pool, reading each sequence's K and V through its slot list
(attention_native.py): no gathered copy of the keys and values, float32 arithmetic throughout.

The pool of one layer is [2·kv_heads, slots, row]: K head h at pool[h], V head h at pool[kv_heads + h]. A row
is one token's head: `dim` bf16 values (KIND_BF16), or `dim` int8 values q followed by the float32 scale s
of the row (KIND_INT8, kv_quant.py: the value is q·s, rounded to float32).
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
#include <string.h>

#define MAX_DIM 256
#define KIND_BF16 0
#define KIND_INT8 1
#define BLOCK 8 /* keys whose scores are reduced together */

#define AHEAD 16 /* value rows fetched ahead of use: slots are in no order, so no hardware prefetcher helps */

#define AVX2 __attribute__((target("avx2,fma")))

/* A row of up to 128 bytes (64 bf16: two cache lines) on its way into L1. */
static inline void prefetch_row(const unsigned char *p) {
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)p + 64, _MM_HINT_T0);
}

/* 8 bf16 → 8 float32 (exact: a bf16 is the top half of a float32). */
static inline AVX2 __m256 load_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* A row's bytes: dim bf16, or dim int8 and a float32 scale. */
static inline size_t row_bytes(int dim, int kind) { return kind == KIND_INT8 ? (size_t)dim + 4 : (size_t)dim * 2; }

/* The scale of an int8 row (stored after its values; 1 for bf16). */
static inline float row_scale(const unsigned char *row, int dim, int kind) {
    if (kind != KIND_INT8) return 1.0f;
    float s;
    memcpy(&s, row + dim, sizeof s);
    return s;
}

/* Values at..at+7 of a row as float32: bf16 exactly, or int8 q times the row's scale s (one rounding, as
   q.float() * s in PyTorch). */
static inline AVX2 __attribute__((always_inline)) __m256 load8(const unsigned char *row, int at, int kind, __m256 s) {
    if (kind == KIND_INT8)
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + at)))), s);
    return load_bf16((const uint16_t *)row + at);
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
    const unsigned char *values, int dim, const int kind, const int64_t *slots, int length, const float *restrict p,
    int stride, int g0, const int gn, int c0, const int cn, float *restrict out) {
    const size_t bytes = row_bytes(dim, kind);
    __m256 acc[3][4];
    for (int g = 0; g < gn; g++)
        for (int c = 0; c < cn; c++) acc[g][c] = _mm256_setzero_ps();
    for (int t = 0; t < length; t++) {
        if (t + AHEAD < length) prefetch_row(values + (size_t)slots[t + AHEAD] * bytes);
        const unsigned char *v = values + (size_t)slots[t] * bytes;
        const __m256 s = _mm256_set1_ps(row_scale(v, dim, kind));
        __m256 vc[4];
        for (int c = 0; c < cn; c++) vc[c] = load8(v, 8 * (c0 + c), kind, s);
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
    const float *restrict q, int groups, const int chunks, const int kind, const unsigned char *keys,
    const unsigned char *values, const int64_t *slots, int length, float scale, float *restrict scores,
    float *restrict out) {
    const int dim = 8 * chunks;
    const size_t bytes = row_bytes(dim, kind);
    float block[BLOCK][MAX_DIM] __attribute__((aligned(32)));
    /* scores, BLOCK keys at a time: their rows converted once, then each query head against them */
    for (int t0 = 0; t0 < length; t0 += BLOCK) {
        const int n = length - t0 < BLOCK ? length - t0 : BLOCK;
        for (int i = 0; t0 + BLOCK + i < length && i < BLOCK; i++) prefetch_row(keys + (size_t)slots[t0 + BLOCK + i] * bytes);
        for (int i = 0; i < BLOCK; i++) {
            const unsigned char *k = keys + (size_t)slots[t0 + (i < n ? i : 0)] * bytes;
            const __m256 s = _mm256_set1_ps(row_scale(k, dim, kind));
            for (int c = 0; c < chunks; c++) _mm256_store_ps(&block[i][8 * c], load8(k, 8 * c, kind, s));
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
                case 3 * 4 + 4: values_pass(values, dim, kind, slots, length, scores, length, g0, 3, c0, 4, out); break;
                case 2 * 4 + 4: values_pass(values, dim, kind, slots, length, scores, length, g0, 2, c0, 4, out); break;
                case 1 * 4 + 4: values_pass(values, dim, kind, slots, length, scores, length, g0, 1, c0, 4, out); break;
                default: values_pass(values, dim, kind, slots, length, scores, length, g0, gn, c0, cn, out); break;
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

/* Values at..at+15 of a row as float32 (load8's 16-wide twin). */
static inline AVX512 __m512 load16(const unsigned char *row, int at, const int kind, __m512 s) {
    if (kind == KIND_INT8)
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + at)))), s);
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + at))), 16));
}

/* The 16-wide twin of one_head for a head size of 64 (4 vectors): scores for BLOCK keys at a time, each
   key's 16 lanes folded to 8 before sums_of_8; then the values for up to 3 query heads at once (12
   accumulators). The softmax in between is one_head's (softmax_rows). */
static inline AVX512 void one_head_64(const float *restrict q, int groups, const int kind, const unsigned char *keys,
                                      const unsigned char *values, const int64_t *slots, int length, float scale,
                                      float *restrict scores, float *restrict out, float *total) {
    const size_t bytes = row_bytes(64, kind);
    __m512 qv[64][4];
    for (int g = 0; g < groups; g++)
        for (int c = 0; c < 4; c++) qv[g][c] = _mm512_loadu_ps(q + (size_t)g * 64 + 16 * c);
    for (int t0 = 0; t0 < length; t0 += BLOCK) {
        const int n = length - t0 < BLOCK ? length - t0 : BLOCK;
        __m512 k[BLOCK][4];
        for (int i = 0; t0 + BLOCK + i < length && i < BLOCK; i++) prefetch_row(keys + (size_t)slots[t0 + BLOCK + i] * bytes);
        for (int i = 0; i < BLOCK; i++) {
            const unsigned char *row = keys + (size_t)slots[t0 + (i < n ? i : 0)] * bytes;
            const __m512 s = _mm512_set1_ps(row_scale(row, 64, kind));
            for (int c = 0; c < 4; c++) k[i][c] = load16(row, 16 * c, kind, s);
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
            if (t + AHEAD < length) prefetch_row(values + (size_t)slots[t + AHEAD] * bytes);
            const unsigned char *v = values + (size_t)slots[t] * bytes;
            const __m512 s = _mm512_set1_ps(row_scale(v, 64, kind));
            const __m512 v0 = load16(v, 0, kind, s), v1 = load16(v, 16, kind, s);
            const __m512 v2 = load16(v, 32, kind, s), v3 = load16(v, 48, kind, s);
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

static inline AVX512 void all_heads_64(
    const float *q, int b, int kv_heads, int groups, const int kind, const unsigned char *pool, int64_t slots,
    const int64_t *gather, int stride, const int32_t *lengths, float scale, float *scores, float *out) {
    const size_t head = (size_t)slots * row_bytes(64, kind);
    float total[64];
    for (int i = 0; i < b; i++) {
        for (int h = 0; h < kv_heads; h++) {
            const size_t at = ((size_t)i * kv_heads + h) * groups * 64;
            one_head_64(q + at, groups, kind, pool + h * head, pool + (kv_heads + h) * head,
                        gather + (size_t)i * stride, lengths[i], scale, scores, out + at, total);
        }
    }
}

/* each kind of pool compiled on its own (its loads inlined) */
static __attribute__((target("avx512f,avx2,fma"))) void all_heads_64_bf16(
    const float *q, int b, int kv_heads, int groups, const unsigned char *pool, int64_t slots,
    const int64_t *gather, int stride, const int32_t *lengths, float scale, float *scores, float *out) {
    all_heads_64(q, b, kv_heads, groups, KIND_BF16, pool, slots, gather, stride, lengths, scale, scores, out);
}

static __attribute__((target("avx512f,avx2,fma"))) void all_heads_64_int8(
    const float *q, int b, int kv_heads, int groups, const unsigned char *pool, int64_t slots,
    const int64_t *gather, int stride, const int32_t *lengths, float scale, float *scores, float *out) {
    all_heads_64(q, b, kv_heads, groups, KIND_INT8, pool, slots, gather, stride, lengths, scale, scores, out);
}

/* every sequence and KV head; head size 64 (8 chunks) compiled on its own, its loops unrolled */
static inline AVX2 __attribute__((always_inline)) void all_heads(
    const float *q, int b, int kv_heads, int groups, int dim, const int kind, const unsigned char *pool,
    int64_t slots, const int64_t *gather, int stride, const int32_t *lengths, float scale, float *scores,
    float *out) {
    const size_t head = (size_t)slots * row_bytes(dim, kind);
    for (int i = 0; i < b; i++) {
        for (int h = 0; h < kv_heads; h++) {
            const size_t at = ((size_t)i * kv_heads + h) * groups * dim;
            const unsigned char *k = pool + h * head, *v = pool + (kv_heads + h) * head;
            const int64_t *s = gather + (size_t)i * stride;
            if (dim == 64)
                one_head(q + at, groups, 8, kind, k, v, s, lengths[i], scale, scores, out + at);
            else
                one_head(q + at, groups, dim / 8, kind, k, v, s, lengths[i], scale, scores, out + at);
        }
    }
}

static AVX2 void all_heads_bf16(const float *q, int b, int kv_heads, int groups, int dim, const unsigned char *pool,
                                int64_t slots, const int64_t *gather, int stride, const int32_t *lengths,
                                float scale, float *scores, float *out) {
    all_heads(q, b, kv_heads, groups, dim, KIND_BF16, pool, slots, gather, stride, lengths, scale, scores, out);
}

static AVX2 void all_heads_int8(const float *q, int b, int kv_heads, int groups, int dim, const unsigned char *pool,
                                int64_t slots, const int64_t *gather, int stride, const int32_t *lengths,
                                float scale, float *scores, float *out) {
    all_heads(q, b, kv_heads, groups, dim, KIND_INT8, pool, slots, gather, stride, lengths, scale, scores, out);
}

/* q [b, kv_heads·groups, dim] float32; pool as above (`kind`: KIND_BF16 or KIND_INT8) with `slots` rows per
   head; gather [b, stride] int64 slot lists (sequence i's first lengths[i]); out [b, kv_heads·groups, dim]
   float32. 0, or -1 on a shape this code does not take (dim not a multiple of 8 or over MAX_DIM, groups
   over 64, an unknown kind) or no memory. The AVX2 path is the reference: `wide` 0 keeps to it. */
int kvadmit_decode_attention(const float *q, int b, int kv_heads, int groups, int dim, const void *pool,
                             int64_t slots, const int64_t *gather, int stride, const int32_t *lengths,
                             float scale, float *out, int kind, int wide) {
    if (dim % 8 || dim > MAX_DIM || groups > 64 || (kind != KIND_BF16 && kind != KIND_INT8) ||
        !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return -1;
    wide = wide && dim == 64 && __builtin_cpu_supports("avx512f");
    int longest = 1;
    for (int i = 0; i < b; i++) longest = lengths[i] > longest ? lengths[i] : longest;
    float *scores = (float *)malloc(sizeof(float) * (size_t)groups * longest);
    if (scores == NULL) return -1;
    const unsigned char *rows = (const unsigned char *)pool;
    if (wide && kind == KIND_INT8)
        all_heads_64_int8(q, b, kv_heads, groups, rows, slots, gather, stride, lengths, scale, scores, out);
    else if (wide)
        all_heads_64_bf16(q, b, kv_heads, groups, rows, slots, gather, stride, lengths, scale, scores, out);
    else if (kind == KIND_INT8)
        all_heads_int8(q, b, kv_heads, groups, dim, rows, slots, gather, stride, lengths, scale, scores, out);
    else
        all_heads_bf16(q, b, kv_heads, groups, dim, rows, slots, gather, stride, lengths, scale, scores, out);
    free(scores);
    return 0;
}
