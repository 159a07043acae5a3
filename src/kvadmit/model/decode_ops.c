/* Two small operations of an eager decode step, each one call instead of a dozen PyTorch operators
(decode_ops.py): at one sequence, a layer's operators cost more in dispatch than in arithmetic.

kvadmit_kv_store_int8: new K and V rows into an int8 pool (kv_quant.py's format): for each token's head
x[0..dim), s = max|x| / 127 (float32), q = x / s rounded to the nearest integer, ties to even (0 when s is
0), clamped to ±127; q then the 4 bytes of s at pool[head][slot]. The same operations in the same float32
order as kv_quant.quantize_rows, so the bytes are identical.

kvadmit_rms_norm: out = w · (x / sqrt(mean(x²) + eps)) per row, float32 (llama.RMSNorm on a float32 model;
the sum in a different order than PyTorch's, so equal to within float32 rounding, not bit for bit).
*/
#include <math.h>
#include <stdint.h>
#include <string.h>

/* src [t, heads2, dim] float32 (token-major: heads2 = K heads then V heads); pool [heads2, pool_slots,
   dim + 4] int8; slots [t]. */
void kvadmit_kv_store_int8(const float *src, int t, int heads2, int dim, const int64_t *slots, int8_t *pool,
                           int64_t pool_slots) {
    const size_t width = (size_t)dim + 4;
    for (int i = 0; i < t; i++) {
        for (int h = 0; h < heads2; h++) {
            const float *x = src + ((size_t)i * heads2 + h) * dim;
            int8_t *row = pool + ((size_t)h * pool_slots + (size_t)slots[i]) * width;
            float top = 0.0f;
            for (int d = 0; d < dim; d++) top = fabsf(x[d]) > top ? fabsf(x[d]) : top;
            const float s = top / 127.0f;
            for (int d = 0; d < dim; d++) {
                float q = s > 0.0f ? nearbyintf(x[d] / s) : 0.0f;
                q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
                row[d] = (int8_t)q;
            }
            memcpy(row + dim, &s, sizeof s);
        }
    }
}

/* x [rows, dim], w [dim] → out [rows, dim], float32. */
void kvadmit_rms_norm(const float *x, int rows, int dim, const float *w, float eps, float *out) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        float lanes[8] = {0};
        int d = 0;
        for (; d + 8 <= dim; d += 8)
            for (int j = 0; j < 8; j++) lanes[j] += xr[d + j] * xr[d + j];
        float total = 0.0f;
        for (; d < dim; d++) total += xr[d] * xr[d];
        for (int j = 0; j < 8; j++) total += lanes[j];
        const float inv = 1.0f / sqrtf(total / (float)dim + eps);
        for (d = 0; d < dim; d++) o[d] = w[d] * (xr[d] * inv);
    }
}
