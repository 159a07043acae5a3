/* int4 weights × int8 activations on x86 CPUs: the product of a quantized linear layer (int4_native.py).

Weights: 4-bit q in 0..15 in groups of 32 inputs, w = scale·q + minimum, scale and minimum in fp16 (the grid
of a GGUF's Q4_1 blocks). They are stored as records of RECORD bytes, one per (block of 16 output rows,
group), in row-block-major order:

    bytes   0..255  the 16 × 32 nibbles, as 4 loads of 64 bytes. Load L holds chunks 2L and 2L+1 of the
                    group (chunk c: inputs 4c..4c+3): byte 4r + j has row r's input 4·(2L)+j in its low
                    nibble and row r's input 4·(2L+1)+j in its high nibble.
    bytes 256..287  the 16 rows' scales (fp16)
    bytes 288..319  the 16 rows' minimums (fp16)

so a 64-byte load, masked and shifted, gives two vectors of 16 lanes × 4 unsigned bytes: one chunk of every
row of the block, against which the same 4 activation bytes (broadcast) are multiplied and summed lane by
lane (AVX-512 VNNI's vpdpbusd; pmaddubsw + pmaddwd on AVX2).

Activations: each row of x is quantized per group of 32 to int8 (a = s·a8, s = max|a| / 127) with the
float sum of the group kept, so that a group's contribution to output (m, n) is

    Σ w·a ≈ s·scale·Σ q·a8 + minimum·Σ a

Σ q·a8 is exact in int32 (and in int16 on AVX2: 8 chunks × 2 products × 15 × 127 = 30,480 < 32,767).
A layer may ask for finer activations (`fine`): a second int8 per activation, its rounding residual in
256ths of a step, for 16 bits in all at twice the integer work.
*/
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#define ROWS 16
#define GROUP 32
#define RECORD 320
#define TILE 4 /* activation rows per pass over a row block's weights */

int kvadmit_int4_record_bytes(void) { return RECORD; }

/* 2: AVX-512 with VNNI; 1: AVX2 with FMA and F16C; 0: neither (the caller keeps its own path). */
int kvadmit_int4_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return 1;
    return 0;
}

/* Rows of x [m, k] to int8 per group of 32: q [m, k], scale [m, k/32], sum [m, k/32]; with `fine`, also the
   rounding residual in 256ths of a step, fine [m, k] (x ≈ scale·(q + fine/256)). */
__attribute__((target("avx2,fma"))) static void quantize_rows(
    const float *x, int m, int k, int8_t *q, int8_t *fine, float *scale, float *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const int groups = k / GROUP;
    for (int r = 0; r < m; r++) {
        for (int g = 0; g < groups; g++) {
            const float *p = x + (size_t)r * k + (size_t)g * GROUP;
            __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
            __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
            __m256 top = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                       _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            const float amax = _mm_cvtss_f32(h);
            __m256 total = _mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3));
            __m128 t = _mm_add_ps(_mm256_castps256_ps128(total), _mm256_extractf128_ps(total, 1));
            t = _mm_add_ps(t, _mm_movehl_ps(t, t));
            t = _mm_add_ss(t, _mm_movehdup_ps(t));
            const int at = r * groups + g;
            sum[at] = _mm_cvtss_f32(t);
            scale[at] = amax / 127.0f;
            const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            /* round to nearest (even), then int32 → int16 → int8; the packs interleave 128-bit lanes,
               which the final permutation undoes */
            const __m256 u0 = _mm256_mul_ps(v0, inv), u1 = _mm256_mul_ps(v1, inv);
            const __m256 u2 = _mm256_mul_ps(v2, inv), u3 = _mm256_mul_ps(v3, inv);
            __m256i i0 = _mm256_cvtps_epi32(u0), i1 = _mm256_cvtps_epi32(u1);
            __m256i i2 = _mm256_cvtps_epi32(u2), i3 = _mm256_cvtps_epi32(u3);
            __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            const size_t at_q = (size_t)r * k + (size_t)g * GROUP;
            _mm256_storeu_si256((__m256i *)(q + at_q), _mm256_permutevar8x32_epi32(bytes, order));
            if (fine != NULL) { /* (u − round(u))·256 is in [−128, 128]: 128 saturates to 127 */
                const __m256 k256 = _mm256_set1_ps(256.0f);
                i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(u0, _mm256_cvtepi32_ps(i0)), k256));
                i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(u1, _mm256_cvtepi32_ps(i1)), k256));
                i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(u2, _mm256_cvtepi32_ps(i2)), k256));
                i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(u3, _mm256_cvtepi32_ps(i3)), k256));
                bytes = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
                _mm256_storeu_si256((__m256i *)(fine + at_q), _mm256_permutevar8x32_epi32(bytes, order));
            }
        }
    }
}

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma"), always_inline))

/* Σ q·a over one group for the 16 rows of a block: 8 chunks of 4 byte products per lane. */
static inline VNNI_TARGET __m512i dot_vnni(const __m512i w[8], const int32_t *a) {
    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(a[0]));
    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], _mm512_set1_epi32(a[1]));
    s0 = _mm512_dpbusd_epi32(s0, w[2], _mm512_set1_epi32(a[2]));
    s1 = _mm512_dpbusd_epi32(s1, w[3], _mm512_set1_epi32(a[3]));
    s0 = _mm512_dpbusd_epi32(s0, w[4], _mm512_set1_epi32(a[4]));
    s1 = _mm512_dpbusd_epi32(s1, w[5], _mm512_set1_epi32(a[5]));
    s0 = _mm512_dpbusd_epi32(s0, w[6], _mm512_set1_epi32(a[6]));
    s1 = _mm512_dpbusd_epi32(s1, w[7], _mm512_set1_epi32(a[7]));
    return _mm512_add_epi32(s0, s1);
}

/* One block of 16 output rows against `tile` activation rows: out[i, 0..15] for i < tile. With `two`,
   the activations are q + fine/256: the dot is 256·Σ q·w + Σ fine·w, exact in int32 (|Σ q·w| ≤ 60,960). */
static inline VNNI_TARGET void block_vnni(const uint8_t *block, int groups, const int8_t *q, const int8_t *fine,
                                          const float *scale, const float *sum, int k, const int tile,
                                          const int two, float *out, int n) {
    __m512 acc[TILE];
    for (int i = 0; i < tile; i++) acc[i] = _mm512_setzero_ps();
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512 unit = _mm512_set1_ps(two ? 1.0f / 256.0f : 1.0f);
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = block + (size_t)g * RECORD;
        __m512i w[8];
        for (int l = 0; l < 4; l++) {
            const __m512i b = _mm512_load_si512((const void *)(rec + 64 * l));
            w[2 * l] = _mm512_and_si512(b, nibble);
            w[2 * l + 1] = _mm512_and_si512(_mm512_srli_epi16(b, 4), nibble);
        }
        const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(rec + 256))), unit);
        const __m512 low = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(rec + 288)));
        for (int i = 0; i < tile; i++) {
            const size_t at_q = (size_t)i * k + (size_t)g * GROUP;
            __m512i dot = dot_vnni(w, (const int32_t *)(q + at_q));
            if (two) dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), dot_vnni(w, (const int32_t *)(fine + at_q)));
            const int at = i * groups + g;
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(scale[at])), acc[i]);
            acc[i] = _mm512_fmadd_ps(low, _mm512_set1_ps(sum[at]), acc[i]);
        }
    }
    for (int i = 0; i < tile; i++) _mm512_storeu_ps(out + (size_t)i * n, acc[i]);
}

#define TILES(call_1, call_2, call_3, call_4) \
    switch (m - i < TILE ? m - i : TILE) { /* constant tiles, so each unrolls into registers */ \
        case 1: call_1; break; \
        case 2: call_2; break; \
        case 3: call_3; break; \
        default: call_4; break; \
    }

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma"))) static void linear_vnni(
    const uint8_t *w, int n, int k, const int8_t *q, const int8_t *fine, const float *scale, const float *sum,
    int m, float *out) {
    const int groups = k / GROUP;
    for (int rb = 0; rb < n / ROWS; rb++) {
        const uint8_t *b = w + (size_t)rb * groups * RECORD;
        for (int i = 0; i < m; i += TILE) {
            const int8_t *qi = q + (size_t)i * k, *fi = fine == NULL ? NULL : fine + (size_t)i * k;
            const float *si = scale + (size_t)i * groups, *ti = sum + (size_t)i * groups;
            float *o = out + (size_t)i * n + (size_t)rb * ROWS;
            if (fine == NULL) {
                TILES(block_vnni(b, groups, qi, fi, si, ti, k, 1, 0, o, n), block_vnni(b, groups, qi, fi, si, ti, k, 2, 0, o, n),
                      block_vnni(b, groups, qi, fi, si, ti, k, 3, 0, o, n), block_vnni(b, groups, qi, fi, si, ti, k, 4, 0, o, n))
            } else {
                TILES(block_vnni(b, groups, qi, fi, si, ti, k, 1, 1, o, n), block_vnni(b, groups, qi, fi, si, ti, k, 2, 1, o, n),
                      block_vnni(b, groups, qi, fi, si, ti, k, 3, 1, o, n), block_vnni(b, groups, qi, fi, si, ti, k, 4, 1, o, n))
            }
        }
    }
}

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c"), always_inline))

/* Σ q·a over one group for 8 rows: 8 chunks of pmaddubsw summed in int16 (≤ 30,480), then pairs in int32. */
static inline AVX2_TARGET __m256i dot_avx2(const __m256i w[8], const int32_t *a) {
    __m256i s = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(a[0]));
    for (int c = 1; c < 8; c++) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(a[c])));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

/* Half `h` (rows 8h..8h+7) of a block of 16 output rows against `tile` activation rows; as block_vnni. */
static inline AVX2_TARGET void half_block_avx2(const uint8_t *block, int h, int groups, const int8_t *q,
                                               const int8_t *fine, const float *scale, const float *sum, int k,
                                               const int tile, const int two, float *out, int n) {
    __m256 acc[TILE];
    for (int i = 0; i < tile; i++) acc[i] = _mm256_setzero_ps();
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256 unit = _mm256_set1_ps(two ? 1.0f / 256.0f : 1.0f);
    for (int g = 0; g < groups; g++) {
        const uint8_t *rec = block + (size_t)g * RECORD;
        __m256i w[8];
        for (int l = 0; l < 4; l++) {
            const __m256i b = _mm256_load_si256((const __m256i *)(rec + 64 * l + 32 * h));
            w[2 * l] = _mm256_and_si256(b, nibble);
            w[2 * l + 1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble);
        }
        const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(rec + 256 + 16 * h))), unit);
        const __m256 low = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(rec + 288 + 16 * h)));
        for (int i = 0; i < tile; i++) {
            const size_t at_q = (size_t)i * k + (size_t)g * GROUP;
            __m256i dot = dot_avx2(w, (const int32_t *)(q + at_q));
            if (two) dot = _mm256_add_epi32(_mm256_slli_epi32(dot, 8), dot_avx2(w, (const int32_t *)(fine + at_q)));
            const int at = i * groups + g;
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(scale[at])), acc[i]);
            acc[i] = _mm256_fmadd_ps(low, _mm256_set1_ps(sum[at]), acc[i]);
        }
    }
    for (int i = 0; i < tile; i++) _mm256_storeu_ps(out + (size_t)i * n + 8 * h, acc[i]);
}

__attribute__((target("avx2,fma,f16c"))) static void linear_avx2(
    const uint8_t *w, int n, int k, const int8_t *q, const int8_t *fine, const float *scale, const float *sum,
    int m, float *out) {
    const int groups = k / GROUP;
    for (int rb = 0; rb < n / ROWS; rb++) {
        const uint8_t *b = w + (size_t)rb * groups * RECORD;
        for (int h = 0; h < 2; h++) {
            for (int i = 0; i < m; i += TILE) {
                const int8_t *qi = q + (size_t)i * k, *fi = fine == NULL ? NULL : fine + (size_t)i * k;
                const float *si = scale + (size_t)i * groups, *ti = sum + (size_t)i * groups;
                float *o = out + (size_t)i * n + (size_t)rb * ROWS;
                if (fine == NULL) {
                    TILES(half_block_avx2(b, h, groups, qi, fi, si, ti, k, 1, 0, o, n),
                          half_block_avx2(b, h, groups, qi, fi, si, ti, k, 2, 0, o, n),
                          half_block_avx2(b, h, groups, qi, fi, si, ti, k, 3, 0, o, n),
                          half_block_avx2(b, h, groups, qi, fi, si, ti, k, 4, 0, o, n))
                } else {
                    TILES(half_block_avx2(b, h, groups, qi, fi, si, ti, k, 1, 1, o, n),
                          half_block_avx2(b, h, groups, qi, fi, si, ti, k, 2, 1, o, n),
                          half_block_avx2(b, h, groups, qi, fi, si, ti, k, 3, 1, o, n),
                          half_block_avx2(b, h, groups, qi, fi, si, ti, k, 4, 1, o, n))
                }
            }
        }
    }
}

/* out [m, n] = x [m, k] · Wᵀ, W packed as above (n a multiple of 16, k of 32, w 64-byte aligned). With
   `fine`, each activation carries 8 more bits (its int8 rounding residual, in 256ths of a step): twice the
   integer products, for layers whose inputs have outlier channels that one int8 step per group blurs.
   Returns 0, or -1 when `isa` is not one this CPU runs or the scratch memory could not be had. */
int kvadmit_int4_linear(const float *x, int m, int k, const uint8_t *w, int n, float *out, int isa, int fine) {
    if (isa != 1 && isa != 2) return -1;
    if (m == 0) return 0; /* (nothing to multiply; malloc(0) may answer NULL) */
    const int groups = k / GROUP;
    const size_t bytes = (size_t)m * k;
    int8_t *q = (int8_t *)malloc(2 * bytes + 2 * sizeof(float) * (size_t)m * groups);
    if (q == NULL) return -1;
    int8_t *residual = fine ? q + bytes : NULL;
    float *scale = (float *)(q + 2 * bytes);
    float *sum = scale + (size_t)m * groups;
    quantize_rows(x, m, k, q, residual, scale, sum);
    if (isa == 2)
        linear_vnni(w, n, k, q, residual, scale, sum, m, out);
    else
        linear_avx2(w, n, k, q, residual, scale, sum, m, out);
    free(q);
    return 0;
}

/* The weight itself, [n, k] row-major: scale·q + minimum in float32, then (bf16 != 0) rounded to bfloat16 (to
   nearest, ties to even) as `out`'s 16-bit words, else stored as float32. For a long prefill, which
   multiplies faster in bf16 on a CPU that has it (int4_native.NativeInt4Linear). */
static inline uint16_t to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

__attribute__((target("f16c"))) void kvadmit_int4_dequantize(const uint8_t *w, int n, int k, void *out, int bf16) {
    const int groups = k / GROUP;
    for (int rb = 0; rb < n / ROWS; rb++) {
        for (int g = 0; g < groups; g++) {
            const uint8_t *rec = w + ((size_t)rb * groups + g) * RECORD;
            for (int r = 0; r < ROWS; r++) {
                const float d = _cvtsh_ss(((const uint16_t *)(rec + 256))[r]);
                const float low = _cvtsh_ss(((const uint16_t *)(rec + 288))[r]);
                float values[GROUP];
                for (int l = 0; l < 4; l++) {
                    for (int j = 0; j < 4; j++) {
                        const uint8_t b = rec[64 * l + 4 * r + j];
                        values[8 * l + j] = d * (float)(b & 15) + low;
                        values[8 * l + 4 + j] = d * (float)(b >> 4) + low;
                    }
                }
                const size_t at = ((size_t)rb * ROWS + r) * k + (size_t)g * GROUP;
                if (bf16) {
                    for (int e = 0; e < GROUP; e++) ((uint16_t *)out)[at + e] = to_bf16(values[e]);
                } else {
                    for (int e = 0; e < GROUP; e++) ((float *)out)[at + e] = values[e];
                }
            }
        }
    }
}
