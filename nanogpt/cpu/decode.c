/* Decoding on CPUs with AVX-512 (F, BW, VL, VNNI, BF16), or else AVX2 and FMA: few-row products, and a transformer
 * block's whole step.
 *
 * matvec: y = act(x W^T * scale + bias) + residual, for x float32 (B, K) with B small (one row per sequence
 * decoded) and W (N, K) float32, bfloat16 or int8 rows, a float32 scale each. A decode step multiplies a row or a
 * few by every weight matrix, so its time is the time it takes to read the weights; PyTorch's one-row products
 * read bfloat16 and int8 weights at about half the rate they read float32 ones (docs/generation.md). Here each
 * weight is read once and multiplied where it lies in registers:
 *   - float32: float32 products and sums;
 *   - bfloat16: x rounded to bfloat16 (as autocast's and oneDNN's bfloat16 products round it), pairs multiplied
 *     and summed in float32 (AVX-512 BF16's dot product; with AVX2, each widened to float32 and multiplied there);
 *   - int8: x rounded to 16-bit integers on its row's scale (max |x| / 32767: finer than bfloat16 for every value
 *     above 1/128 of the largest), products of integers summed exactly in 32 bits, then times both scales.
 * The AVX-512 loops read 16 floats at a time; the AVX2 ones (VECTOR 256) are the same loops on 8, where a CPU has
 * no AVX-512 (Intel's laptops and desktops since Alder Lake, AMD's before Zen 4): the same math, summed in another
 * order.
 * Rows of W are split over OpenMP threads (the runtime PyTorch loaded: its threads, not a second pool).
 *
 * model_step: GPT.forward for one new token per row, the whole step in one call: each Block of model.py for one
 * new position per row, each row at its own position in its own slot of the cache (generate.KVCache,
 * engine.SlotCache): x += attn(norm_1(x)), x += mlp(norm_2(x)), the new keys and values written into the layer's
 * cache. Each operation around the products costs a few microseconds from Python, some 150 of them a step; here
 * they cost what their arithmetic costs. One team of threads runs the whole step, meeting only where a product
 * needs all of the one before (a product's own team would start and meet 25 times a step). The same math as
 * fused_step.py's: tests/test_fused_step.py holds both to the model's uncached forward.
 * model_run: up to n steps of model_step, each step's greedy or sampled choice fed to the next: a decode's loop in one call.
 *
 * native.py compiles this file on first use and calls it through ctypes; tests/test_native.py holds it to
 * float64 references. Rules: sizes positive; x, W and y contiguous; residual and y may be the same buffer,
 * nothing else overlaps; scale NULL except for int8, bias and residual NULL where absent.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>
#include <x86intrin.h> /* __rdtsc: immintrin.h declares it only from GCC 11 */
#define VECTOR 512
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <x86intrin.h>
#define VECTOR 256
#endif

enum { F32 = 0, BF16 = 1, INT8 = 2 };
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3, ACT_RELU2 = 4 };
#define ROWS 4              /* rows of W summed together: each chunk of x is loaded once for ROWS rows */
#if VECTOR == 256
#define XROWS 2             /* rows of x summed together: each chunk of W is converted once for XROWS rows (AVX2's
                               16 registers hold 2 x ROWS sums, ROWS chunks of W and one of x) */
#else
#define XROWS 4
#endif
#define INT_BLOCK 512       /* int8 products summed exactly in 32 bits over at most this many columns, then in
                               float32: a lane adds |2 * 32767 * 128| at most per 32 columns, and a row's 16 lanes
                               are summed in 32 bits (four rows in one set of shuffles): 16 * 16 * 2 * 32767 * 128
                               < 2^31 */
#define INT16_MAX_X 32767.0f

/* x as the kernel reads it: float32 as given; bfloat16 rounded; int16 on each row's scale (xscale[b]) */
typedef struct {
    const float *f;
    uint16_t *h;
    int16_t *i;
    float *xscale;
    long ld; /* elements between rows of h and i: K rounded up to 32, the tail zero */
} input;

#if VECTOR == 512
/* e^x for 16 floats, x <= 88: 2^n e^r, r = x - n ln 2 in [-ln2/2, ln2/2], e^r by its Taylor polynomial to r^7
 * (relative error below 2e-7); below -104 (and -inf) it gives 0 */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x); /* NaN second: max keeps it (as the second operand) */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* erf for 16 floats: Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7 */
static inline __m512 erf16(__m512 x) {
    __m512 a = _mm512_abs_ps(x);
    __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    p = _mm512_mul_ps(p, t);
    __m512 e = _mm512_fnmadd_ps(p, exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a))), _mm512_set1_ps(1.0f));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(e),  /* erf(-x) = -erf(x) */
                               _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
}

/* act (ACT_*, as torch.nn.functional computes it) of 16 floats */
static inline __m512 activate16(__m512 v, int act) {
    __m512 zero = _mm512_setzero_ps(), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    switch (act) {
    case ACT_RELU: return _mm512_max_ps(zero, v); /* NaN second: kept, as torch's relu keeps it */
    case ACT_RELU2: v = _mm512_max_ps(zero, v); return _mm512_mul_ps(v, v);
    case ACT_GELU:
        return _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, erf16(_mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)))));
    case ACT_GELU_TANH: { /* tanh(u) = 1 - 2 / (e^(2u) + 1) */
        __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286536f),
                                 _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), v), _mm512_mul_ps(v, v), v));
        __m512 e = exp16(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_add_ps(u, u)));
        __m512 th = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
        return _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, th));
    }
    default: return v;
    }
}

/* sums[b][r] = x[b] . W[n + r] for b < nb, r < nr: W's chunks converted once, x's loaded once a chunk */
static inline __attribute__((always_inline)) void dots(const input *x, int nb, const void *w, int kind, long n,
                                                       int nr, int K, long ldw, float sums[XROWS][ROWS]) {
    if (kind == F32) {
        __m512 acc[XROWS][ROWS];
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) acc[b][r] = _mm512_setzero_ps();
        const float *wf = (const float *)w;
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            __m512 wk[ROWS];
            for (int r = 0; r < nr; r++) wk[r] = _mm512_loadu_ps(wf + (n + r) * ldw + k);
            for (int b = 0; b < nb; b++) {
                __m512 xk = _mm512_loadu_ps(x->f + (long)b * K + k);
                for (int r = 0; r < nr; r++) acc[b][r] = _mm512_fmadd_ps(wk[r], xk, acc[b][r]);
            }
        }
        __mmask16 tail = (__mmask16)((1u << (K - k)) - 1);
        if (tail) {
            __m512 wk[ROWS];
            for (int r = 0; r < nr; r++) wk[r] = _mm512_maskz_loadu_ps(tail, wf + (n + r) * ldw + k);
            for (int b = 0; b < nb; b++) {
                __m512 xk = _mm512_maskz_loadu_ps(tail, x->f + (long)b * K + k);
                for (int r = 0; r < nr; r++) acc[b][r] = _mm512_fmadd_ps(wk[r], xk, acc[b][r]);
            }
        }
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) sums[b][r] = _mm512_reduce_add_ps(acc[b][r]);
    } else if (kind == BF16) {
        __m512 acc[XROWS][ROWS];
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) acc[b][r] = _mm512_setzero_ps();
        const uint16_t *wh = (const uint16_t *)w;
        for (int k = 0; k < K; k += 32) {
            __mmask32 in = K - k >= 32 ? 0xffffffffu : (__mmask32)((1u << (K - k)) - 1);
            __m512i wk[ROWS];
            for (int r = 0; r < nr; r++) wk[r] = _mm512_maskz_loadu_epi16(in, wh + (n + r) * ldw + k);
            for (int b = 0; b < nb; b++) {
                __m512i xk = _mm512_loadu_si512((const void *)(x->h + b * x->ld + k));
                for (int r = 0; r < nr; r++)
                    acc[b][r] = _mm512_dpbf16_ps(acc[b][r], (__m512bh)wk[r], (__m512bh)xk);
            }
        }
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) sums[b][r] = _mm512_reduce_add_ps(acc[b][r]);
    } else {
        float total[XROWS][ROWS] = {{0}};
        const int8_t *wi = (const int8_t *)w;
        for (int k0 = 0; k0 < K; k0 += INT_BLOCK) {
            int k1 = K - k0 < INT_BLOCK ? K : k0 + INT_BLOCK, k = k0;
            __m512i acc[XROWS][ROWS];
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < nr; r++) acc[b][r] = _mm512_setzero_si512();
            for (; k + 32 <= k1; k += 32) {  /* whole chunks: the load folds into the conversion */
                __m512i wk[ROWS];
                for (int r = 0; r < nr; r++)
                    wk[r] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wi + (n + r) * ldw + k)));
                for (int b = 0; b < nb; b++) {
                    __m512i xk = _mm512_loadu_si512((const void *)(x->i + b * x->ld + k));
                    for (int r = 0; r < nr; r++) acc[b][r] = _mm512_dpwssd_epi32(acc[b][r], wk[r], xk);
                }
            }
            if (k < k1) {
                __mmask32 in = (__mmask32)((1u << (k1 - k)) - 1);
                __m512i wk[ROWS];
                for (int r = 0; r < nr; r++)
                    wk[r] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(in, wi + (n + r) * ldw + k));
                for (int b = 0; b < nb; b++) {
                    __m512i xk = _mm512_loadu_si512((const void *)(x->i + b * x->ld + k));
                    for (int r = 0; r < nr; r++) acc[b][r] = _mm512_dpwssd_epi32(acc[b][r], wk[r], xk);
                }
            }
            for (int b = 0; b < nb; b++) {
                if (nr == ROWS) {  /* each row's lanes summed, four rows at once: [r0 r1 r2 r3] in each 128 bits */
                    __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[b][0], acc[b][1]),
                                                   _mm512_unpackhi_epi32(acc[b][0], acc[b][1]));
                    __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[b][2], acc[b][3]),
                                                   _mm512_unpackhi_epi32(acc[b][2], acc[b][3]));
                    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
                    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
                    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                    int sum[4];
                    _mm_storeu_si128((__m128i *)sum, q);
                    for (int r = 0; r < ROWS; r++) total[b][r] += (float)sum[r];
                } else
                    for (int r = 0; r < nr; r++) total[b][r] += (float)_mm512_reduce_add_epi32(acc[b][r]);
            }
        }
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) sums[b][r] = total[b][r] * x->xscale[b];
    }
}

/* y's rows [n0, n1) = act(t * scale + bias) + residual, t the raw sums (B, n1 - n0), 16 at a time: residual is read
 * before y is written (they may alias) */
static void finish(const float *t, int B, const float *scale, const float *bias, const float *residual, float *y,
                   int N, int act, long n0, long n1) {
    long width = n1 - n0;
    for (int b = 0; b < B; b++)
        for (long j = 0; j < width; j += 16) {
            __mmask16 in = width - j >= 16 ? 0xffff : (__mmask16)((1u << (width - j)) - 1);
            long i = (long)b * N + n0 + j;
            __m512 v = _mm512_maskz_loadu_ps(in, t + b * width + j);
            if (scale) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(in, scale + n0 + j));
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(in, bias + n0 + j));
            v = activate16(v, act);
            if (residual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(in, residual + i));
            _mm512_mask_storeu_ps(y + i, in, v);
        }
}

/* x's rows as kind reads them, into h (bfloat16) or i and xscale (int8), each row x->ld elements (K rounded up to
 * 32, the tail zeroed): B * x->ld elements of room, and B scales */
static void round_input(input *x, const float *f, int B, int K, int kind, uint16_t *h, int16_t *i, float *xscale) {
    memset(x, 0, sizeof *x);
    x->f = f;
    x->ld = (K + 31) / 32 * 32;
    if (kind == BF16) {
        x->h = h;
        for (int b = 0; b < B; b++) {
            for (int j = 0; j < K; j += 16) {  /* rounded to nearest even, as PyTorch's .bfloat16() */
                __mmask16 in = K - j >= 16 ? 0xffff : (__mmask16)((1u << (K - j)) - 1);
                __m256bh r = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(in, f + (long)b * K + j));
                _mm256_mask_storeu_epi16(h + b * x->ld + j, in, (__m256i)r);
            }
            memset(h + b * x->ld + K, 0, (x->ld - K) * sizeof *h);
        }
    } else if (kind == INT8) {
        x->i = i, x->xscale = xscale;
        for (int b = 0; b < B; b++) {
            const float *row = f + (long)b * K;
            __m512 top = _mm512_setzero_ps();
            __mmask16 nan = 0;
            for (int j = 0; j < K; j += 16) {
                __mmask16 in = K - j >= 16 ? 0xffff : (__mmask16)((1u << (K - j)) - 1);
                __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(in, row + j));
                nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
                top = _mm512_max_ps(top, a);
            }
            float amax = _mm512_reduce_max_ps(top), s = amax > 0.0f ? amax / INT16_MAX_X : 1.0f;
            if (nan || isinf(amax)) s = NAN; /* a NaN input gives NaN outputs, as a float product would; so does an
                                                infinite one, which no finite scale holds (inf / inf rounds to
                                                -32768: outputs of the wrong sign) */
            xscale[b] = s;
            for (int j = 0; j < K; j += 16) {  /* row / s rounded to nearest even: within [-32767, 32767] */
                __mmask16 in = K - j >= 16 ? 0xffff : (__mmask16)((1u << (K - j)) - 1);
                __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(in, row + j), _mm512_set1_ps(s)));
                _mm256_mask_storeu_epi16(i + b * x->ld + j, in, _mm512_cvtsepi32_epi16(q));
            }
            memset(i + b * x->ld + K, 0, (x->ld - K) * sizeof *i);
        }
    }
}

#elif VECTOR == 256
/* The same loops on 8 lanes (AVX2 and FMA: Intel since Haswell, AMD since Zen; most laptops), where AVX-512 is
 * missing. A tail shorter than a vector is read through a mask (maskload: lanes outside it read as 0, never
 * touched). int8: pairs of 16-bit products summed into 32 bits (madd); bfloat16: widened to float32 (a bfloat16 is
 * a float32's upper half), multiplied and summed in float32. */

/* lanes [0, n) of 8 on, the rest off (n >= 8: all) */
static inline __m256i mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* e^x for 8 floats: as exp16, but 2^n is built in the exponent's bits, so below -87.3 (where e^x is under the
 * smallest normal float, 1.2e-38) it gives 0; NaN stays NaN */
static inline __m256 exp8(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x); /* NaN second: max keeps it */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n in two factors: n up to 128 (x <= 88.7) is past one factor's exponent */
    __m256i e = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(e, 1);
    __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, half),
                                                                      _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, a), b));
}

/* erf for 8 floats: as erf16 */
static inline __m256 erf8(__m256 x) {
    __m256 sign = _mm256_set1_ps(-0.0f), a = _mm256_andnot_ps(sign, x);
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(a, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.0f)));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    p = _mm256_mul_ps(p, t);
    __m256 e = _mm256_fnmadd_ps(p, exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, a))), _mm256_set1_ps(1.0f));
    return _mm256_or_ps(e, _mm256_and_ps(x, sign)); /* erf(-x) = -erf(x) */
}

/* act (ACT_*, as torch.nn.functional computes it) of 8 floats */
static inline __m256 activate8(__m256 v, int act) {
    __m256 zero = _mm256_setzero_ps(), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    switch (act) {
    case ACT_RELU: return _mm256_max_ps(zero, v); /* NaN second: kept, as torch's relu keeps it */
    case ACT_RELU2: v = _mm256_max_ps(zero, v); return _mm256_mul_ps(v, v);
    case ACT_GELU:
        return _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, erf8(_mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f)))));
    case ACT_GELU_TANH: { /* tanh(u) = 1 - 2 / (e^(2u) + 1) */
        __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.79788456080286536f),
                                 _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), _mm256_mul_ps(v, v), v));
        __m256 e = exp8(_mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_add_ps(u, u)));
        __m256 th = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
        return _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, th));
    }
    default: return v;
    }
}

/* 8 bfloat16 from p as float32 (each the upper half of its float) */
static inline __m256 widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* The next block of W's rows, asked for a few cache lines at a time while this block is summed: one core streams
 * memory faster with its next reads already asked for (float32 from memory on the EPYC here: 10-15%). Reading
 * past W's end is harmless: a prefetch never faults. Float32 only: int8 weights a quarter the size sit in the
 * cache more often, and there the prefetches cost int8's products a fifth more time. */
typedef struct {
    const char *p;
    long left, per;
} ahead;

static inline ahead ahead_of(const float *w, long n, int nr, long ldw, int steps) {
    long lines = ((long)nr * ldw * (long)sizeof *w + 63) / 64;
    ahead a = {(const char *)(w + (n + nr) * ldw), lines, (lines + steps - 1) / steps};
    return a;
}

static inline void fetch(ahead *a) {
    for (long j = 0; j < a->per && a->left > 0; j++, a->left--, a->p += 64) _mm_prefetch(a->p, _MM_HINT_T0);
}

/* sums[b][r] = x[b] . W[n + r] for b < nb, r < nr, as the AVX-512 dots: W's chunks loaded once for every row of x.
 * W's rows need not be padded: its last chunk of a row shorter than a vector is read through a mask (float32) or
 * copied into zeros (bfloat16, int8); x's rounded rows are padded with zeros to x->ld. */
static inline __attribute__((always_inline)) void dots(const input *x, int nb, const void *w, int kind, long n,
                                                       int nr, int K, long ldw, float sums[XROWS][ROWS]) {
    if (kind == F32) {
        __m256 acc[XROWS][ROWS];
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) acc[b][r] = _mm256_setzero_ps();
        const float *wf = (const float *)w;
        ahead next = ahead_of(wf, n, nr, ldw, K / 8 + 1);
        int k = 0;
        for (; k + 8 <= K; k += 8) {
            fetch(&next);
            __m256 wk[ROWS];
            for (int r = 0; r < nr; r++) wk[r] = _mm256_loadu_ps(wf + (n + r) * ldw + k);
            for (int b = 0; b < nb; b++) {
                __m256 xk = _mm256_loadu_ps(x->f + (long)b * K + k);
                for (int r = 0; r < nr; r++) acc[b][r] = _mm256_fmadd_ps(wk[r], xk, acc[b][r]);
            }
        }
        if (k < K) {
            __m256i in = mask8(K - k);
            __m256 wk[ROWS];
            for (int r = 0; r < nr; r++) wk[r] = _mm256_maskload_ps(wf + (n + r) * ldw + k, in);
            for (int b = 0; b < nb; b++) {
                __m256 xk = _mm256_maskload_ps(x->f + (long)b * K + k, in);
                for (int r = 0; r < nr; r++) acc[b][r] = _mm256_fmadd_ps(wk[r], xk, acc[b][r]);
            }
        }
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) sums[b][r] = hsum8(acc[b][r]);
    } else if (kind == BF16) {
        __m256 acc[XROWS][ROWS];
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) acc[b][r] = _mm256_setzero_ps();
        const uint16_t *wh = (const uint16_t *)w;
        for (int k = 0; k < K; k += 8) {
            __m256 wk[ROWS];
            for (int r = 0; r < nr; r++) {
                const uint16_t *row = wh + (n + r) * ldw + k;
                if (K - k >= 8) wk[r] = widen8(row);
                else {
                    uint16_t tail[8] = {0};
                    memcpy(tail, row, (size_t)(K - k) * sizeof *tail);
                    wk[r] = widen8(tail);
                }
            }
            for (int b = 0; b < nb; b++) {
                __m256 xk = widen8(x->h + b * x->ld + k);
                for (int r = 0; r < nr; r++) acc[b][r] = _mm256_fmadd_ps(wk[r], xk, acc[b][r]);
            }
        }
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) sums[b][r] = hsum8(acc[b][r]);
    } else {
        float total[XROWS][ROWS] = {{0}};
        const int8_t *wi = (const int8_t *)w;
        for (int k0 = 0; k0 < K; k0 += INT_BLOCK) {
            int k1 = K - k0 < INT_BLOCK ? K : k0 + INT_BLOCK;
            __m256i acc[XROWS][ROWS];
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < nr; r++) acc[b][r] = _mm256_setzero_si256();
            for (int k = k0; k < k1; k += 16) {
                __m256i wk[ROWS];
                for (int r = 0; r < nr; r++) {
                    const int8_t *row = wi + (n + r) * ldw + k;
                    if (k1 - k >= 16) wk[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)row));
                    else {
                        int8_t tail[16] = {0};
                        memcpy(tail, row, (size_t)(k1 - k));
                        wk[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)tail));
                    }
                }
                for (int b = 0; b < nb; b++) {
                    __m256i xk = _mm256_loadu_si256((const __m256i *)(x->i + b * x->ld + k));
                    for (int r = 0; r < nr; r++) acc[b][r] = _mm256_add_epi32(acc[b][r], _mm256_madd_epi16(wk[r], xk));
                }
            }
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < nr; r++) total[b][r] += (float)hsum8i(acc[b][r]);
        }
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < nr; r++) sums[b][r] = total[b][r] * x->xscale[b];
    }
}

/* as the AVX-512 finish, 8 at a time */
static void finish(const float *t, int B, const float *scale, const float *bias, const float *residual, float *y,
                   int N, int act, long n0, long n1) {
    long width = n1 - n0;
    for (int b = 0; b < B; b++)
        for (long j = 0; j < width; j += 8) {
            __m256i in = mask8(width - j >= 8 ? 8 : (int)(width - j));
            long i = (long)b * N + n0 + j;
            __m256 v = _mm256_maskload_ps(t + b * width + j, in);
            if (scale) v = _mm256_mul_ps(v, _mm256_maskload_ps(scale + n0 + j, in));
            if (bias) v = _mm256_add_ps(v, _mm256_maskload_ps(bias + n0 + j, in));
            v = activate8(v, act);
            if (residual) v = _mm256_add_ps(v, _mm256_maskload_ps(residual + i, in));
            _mm256_maskstore_ps(y + i, in, v);
        }
}

/* 8 int32 (each within 16 bits) as 8 int16, in order, saturated */
static inline __m128i narrow8(__m256i q) {
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(q, q), 0x08));
}

/* x's rows as kind reads them, as the AVX-512 round_input */
static void round_input(input *x, const float *f, int B, int K, int kind, uint16_t *h, int16_t *i, float *xscale) {
    memset(x, 0, sizeof *x);
    x->f = f;
    x->ld = (K + 31) / 32 * 32;
    if (kind == BF16) {
        x->h = h;
        for (int b = 0; b < B; b++) {
            memset(h + b * x->ld, 0, x->ld * sizeof *h);
            for (int j = 0; j < K; j += 8) {  /* rounded to nearest even, as PyTorch's .bfloat16(); NaN a quiet NaN */
                __m256i in = mask8(K - j);
                __m256 v = _mm256_maskload_ps(f + (long)b * K + j, in);
                __m256i u = _mm256_castps_si256(v);
                __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
                __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
                __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
                r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
                __m128i packed = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
                if (K - j >= 8) _mm_storeu_si128((__m128i *)(h + b * x->ld + j), packed);
                else {
                    uint16_t tail[8];
                    _mm_storeu_si128((__m128i *)tail, packed);
                    memcpy(h + b * x->ld + j, tail, (size_t)(K - j) * sizeof *tail);
                }
            }
        }
    } else if (kind == INT8) {
        x->i = i, x->xscale = xscale;
        for (int b = 0; b < B; b++) {
            const float *row = f + (long)b * K;
            __m256 top = _mm256_setzero_ps(), nan = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
            for (int j = 0; j < K; j += 8) {
                __m256 a = _mm256_andnot_ps(sign, _mm256_maskload_ps(row + j, mask8(K - j)));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
                top = _mm256_max_ps(top, a);
            }
            float amax = hmax8(top), s = amax > 0.0f ? amax / INT16_MAX_X : 1.0f;
            if (_mm256_movemask_ps(nan) || isinf(amax)) s = NAN; /* as the AVX-512 round_input */
            xscale[b] = s;
            memset(i + b * x->ld, 0, x->ld * sizeof *i);
            for (int j = 0; j < K; j += 8) {  /* row / s rounded to nearest even: within [-32767, 32767] */
                __m256i q = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_maskload_ps(row + j, mask8(K - j)), _mm256_set1_ps(s)));
                if (K - j >= 8) _mm_storeu_si128((__m128i *)(i + b * x->ld + j), narrow8(q));
                else {
                    int16_t tail[8];
                    _mm_storeu_si128((__m128i *)tail, narrow8(q));
                    memcpy(i + b * x->ld + j, tail, (size_t)(K - j) * sizeof *tail);
                }
            }
        }
    }
}
#endif

#ifdef VECTOR
/* the rows [n0, n1) of y: dots called with constant counts where it can, so that each call is compiled for
 * them and its accumulators stay in registers; then finish (this instruction set's) */
static int rows(const input *x, int B, const void *w, int kind, const float *scale, const float *bias,
                 const float *residual, float *y, int K, long ldw, int N, int act, long n0, long n1) {
    float sums[XROWS][ROWS], room[2048];
    long width = n1 - n0;
    float *t = (long)B * width <= 2048 ? room : malloc((size_t)B * width * sizeof *t); /* the raw sums (B, width) */
    if (!t) return -1;
    for (long n = n0; n < n1; n += ROWS) {
        int nr = n1 - n < ROWS ? (int)(n1 - n) : ROWS;
        for (int b0 = 0; b0 < B; b0 += XROWS) {
            int nb = B - b0 < XROWS ? B - b0 : XROWS;
            input xb = *x;
            xb.f += (long)b0 * K;
            if (xb.h) xb.h += b0 * x->ld;
            if (xb.i) xb.i += b0 * x->ld, xb.xscale += b0;
            if (nr == ROWS && nb == 1) dots(&xb, 1, w, kind, n, ROWS, K, ldw, sums);
            else if (nr == ROWS && nb == 2 && XROWS > 2) dots(&xb, 2, w, kind, n, ROWS, K, ldw, sums);
            else if (nr == ROWS && nb == 3 && XROWS > 3) dots(&xb, 3, w, kind, n, ROWS, K, ldw, sums);
            else if (nr == ROWS) dots(&xb, XROWS, w, kind, n, ROWS, K, ldw, sums); /* nb == XROWS */
            else
                for (int r = 0; r < nr; r++) {
                    float one[XROWS][ROWS];
                    dots(&xb, nb, w, kind, n + r, 1, K, ldw, one);
                    for (int b = 0; b < nb; b++) sums[b][r] = one[b][0];
                }
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < nr; r++) t[(b0 + b) * width + (n - n0) + r] = sums[b][r];
        }
    }
    finish(t, B, scale, bias, residual, y, N, act, n0, n1);
    if (t != room) free(t);
    return 0;
}

/* the room round_input needs for B rows of K (malloc'd: the caller frees *h, *i and *xscale); 0, or -1 */
static int input_room(int B, int K, uint16_t **h, int16_t **i, float **xscale) {
    size_t n = (size_t)B * ((K + 31) / 32 * 32);
    *h = malloc(n * sizeof **h), *i = malloc(n * sizeof **i), *xscale = malloc((size_t)B * sizeof **xscale);
    return *h && *i && *xscale ? 0 : -1;
}

/* this thread's number in its team, and the team's size */
static inline void member(int *t, int *nt) {
#ifdef _OPENMP
    *t = omp_get_thread_num(), *nt = omp_get_num_threads();
#else
    *t = 0, *nt = 1;
#endif
}

/* the rows of y a thread of nt computes, [*n0, *n1): blocks of ROWS split at cut (nt + 1 fractions of 2^16 from 0
 * to 2^16; NULL: even shares), or all to thread 0 where each thread would have fewer than two. Where a split falls
 * changes no output: each block of ROWS rows is summed alike whichever thread sums it. */
static void share_of(long N, int t, int nt, const unsigned *cut, long *n0, long *n1) {
    long blocks = (N + ROWS - 1) / ROWS;
    if (nt <= 1 || blocks < 2 * nt) {
        *n0 = 0, *n1 = t ? 0 : N;
        return;
    }
    long b0 = cut ? (long)((blocks * (unsigned long)cut[t]) >> 16) : blocks * t / nt;
    long b1 = cut ? (long)((blocks * (unsigned long)cut[t + 1]) >> 16) : blocks * (t + 1) / nt;
    *n0 = b0 * ROWS, *n1 = b1 * ROWS < N ? b1 * ROWS : N;
}

/* Each thread's share of a step's products, in proportion to the rate it read its share of the last step's: the
 * cores a decode runs on need not read at one rate (here one of two read 7-15% slower than the other, whichever
 * thread runs on it; a laptop's efficiency cores; a core another process shares), and with even shares the faster
 * waits for the slower at every product. Kept per process for the team size last seen, each thread's share in
 * fractions of 2^16, read and written with relaxed atomics: a hint, any value of which splits correctly. */
#define TEAM_MAX 64
static unsigned balance_team, balance[TEAM_MAX];

/* cut (nt + 1 entries) from the balance kept for a team of nt, else even */
static void team_cuts(int nt, unsigned *cut) {
    unsigned share[TEAM_MAX], total = 0;
    int kept = nt <= TEAM_MAX && __atomic_load_n(&balance_team, __ATOMIC_RELAXED) == (unsigned)nt;
    for (int t = 0; t < nt && t < TEAM_MAX; t++) total += share[t] = kept ? __atomic_load_n(&balance[t], __ATOMIC_RELAXED) : 1;
    cut[0] = 0;
    for (int t = 0, sum = 0; t < nt && t < TEAM_MAX; t++) {
        sum += share[t];
        cut[t + 1] = total ? (unsigned)(((unsigned long)sum << 16) / total) : (unsigned)(((t + 1UL) << 16) / nt);
    }
}

/* the balance for the next step: each thread's share of this one's (cut) weighed by the rate it read it at (bytes
 * over ticks), half the old and half the new. Where a thread read nothing (its share of every product under a block
 * of ROWS rows: a small model), nothing measures it again, and every share moves halfway back to even instead. */
static void rebalance(int nt, const unsigned *cut, const double *bytes, const unsigned long long *ticks) {
    double rate[TEAM_MAX], total = 0;
    int measured = nt >= 2 && nt <= TEAM_MAX;
    if (!measured) return;
    for (int t = 0; t < nt; t++) {
        measured &= ticks[t] > 0 && bytes[t] > 0;
        total += rate[t] = measured ? bytes[t] / (double)ticks[t] : 0.0;
    }
    for (int t = 0; t < nt; t++) {
        double old = (cut[t + 1] - cut[t]) / 65536.0, now = measured ? rate[t] / total : 1.0 / nt;
        unsigned share = (unsigned)(65536.0 * (old + now) / 2);
        __atomic_store_n(&balance[t], share < 1024 ? 1024 : share, __ATOMIC_RELAXED); /* none below 1/64 */
    }
    __atomic_store_n(&balance_team, (unsigned)nt, __ATOMIC_RELAXED);
}

#endif

/* y (B, N) = act(x (B, K) W[:, :K]^T * scale + bias) + residual, W's rows ldw >= K elements apart, over `threads`
 * threads (rows of W split between them). Returns 0, -1 where memory ran out, -2 in a build
 * without the vector loops (matvec_vector() is 0: native.py does not call it there). */
int matvec(const float *x, int B, const void *w, int kind, const float *scale, const float *bias,
           const float *residual, float *y, int K, int ldw, int N, int act, int threads) {
#ifndef VECTOR
    (void)x, (void)B, (void)w, (void)kind, (void)scale, (void)bias, (void)residual, (void)y, (void)K, (void)ldw;
    (void)N, (void)act, (void)threads;
    return -2;
#else
#ifndef _OPENMP
    (void)threads;
#endif
    uint16_t *h;
    int16_t *i;
    float *xscale;
    int status = input_room(B, K, &h, &i, &xscale);
    if (status == 0) {
        input in;
        round_input(&in, x, B, K, kind, h, i, xscale);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(| : status) if (threads > 1 && (N + ROWS - 1) / ROWS >= 2 * threads)
#endif
        {
            int t, nt;
            member(&t, &nt);
            long n0, n1;
            share_of(N, t, nt, NULL, &n0, &n1);
            if (n1 > n0) status |= rows(&in, B, w, kind, scale, bias, residual, y, K, ldw, N, act, n0, n1);
        }
    }
    free(h), free(i), free(xscale);
    return status;
#endif
}

#if VECTOR == 512
static inline float dot(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 in = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, a + j), _mm512_maskz_loadu_ps(in, b + j), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* y = norm(x) over n values: LayerNorm (rms 0: (x - mean) / sqrt(var + eps) * w + b) or RMSNorm (rms 1:
 * x / sqrt(mean(x^2) + eps) * w); w, b NULL: none */
static void norm(const float *x, float *y, int n, int rms, const float *w, const float *b, float eps) {
    __m512 sum = _mm512_setzero_ps(), squares = _mm512_setzero_ps(); /* 16 lanes: one sum's chain would wait on each add */
    for (int j = 0; j < n && !rms; j += 16) {
        __mmask16 in = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(in, x + j));
    }
    __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(sum) / n);
    for (int j = 0; j < n; j += 16) {
        __mmask16 in = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512 d = _mm512_maskz_sub_ps(in, _mm512_maskz_loadu_ps(in, x + j), mean);
        squares = _mm512_fmadd_ps(d, d, squares);
    }
    __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(squares) / n + eps));
    for (int j = 0; j < n; j += 16) {
        __mmask16 in = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, x + j), mean), inv);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(in, w + j));
        if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(in, b + j));
        _mm512_mask_storeu_ps(y + j, in, v);
    }
}

/* out (hs) = softmax_l(q . K[l] / sqrt(hs)) V[l] over l < L; p: L floats of room */
static void attend_one(const float *q, const float *k, const float *v, long stride, float *out, int L, int hs,
                       float *p) {
    float scale = 1.0f / sqrtf((float)hs), top = -INFINITY, total = 0.0f;
    for (int l = 0; l < L; l++) top = fmaxf(top, p[l] = dot(q, k + l * stride, hs) * scale);
    __m512 sum = _mm512_setzero_ps();
    for (int l = 0; l < L; l += 16) {
        __mmask16 in = L - l >= 16 ? 0xffff : (__mmask16)((1u << (L - l)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, p + l), _mm512_set1_ps(top)));
        e = _mm512_maskz_mov_ps(in, e);
        _mm512_mask_storeu_ps(p + l, in, e);
        sum = _mm512_add_ps(sum, e);
    }
    total = _mm512_reduce_add_ps(sum);
    /* the weighted sum of the values, 64 columns at a time in registers, out written once: a neighbouring head's
     * output, another thread's, may share out's first and last cache lines, and a sum kept in out moved them
     * between the two cores at every position */
    for (int j = 0; j < hs; j += 64) {
        __mmask16 in[4];
        __m512 acc[4];
        for (int c = 0; c < 4; c++) {
            int left = hs - j - 16 * c;
            in[c] = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            acc[c] = _mm512_setzero_ps();
        }
        for (int l = 0; l < L; l++) {
            __m512 weight = _mm512_set1_ps(p[l] / total);
            const float *row = v + l * stride + j;
            for (int c = 0; c < 4; c++)
                acc[c] = _mm512_fmadd_ps(weight, _mm512_maskz_loadu_ps(in[c], row + 16 * c), acc[c]);
        }
        for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(out + j + 16 * c, in[c], acc[c]);
    }
}
#elif VECTOR == 256
/* Whole vectors read as they are, a tail through a mask: a masked load costs several plain ones on AMD's cores, and
 * attention makes these calls once a position a head */
static inline float dot(const float *a, const float *b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(); /* two chains: each add waits on the one before */
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), acc1);
    }
    for (; j < n; j += 8) {
        __m256i in = mask8(n - j);
        acc0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + j, in), _mm256_maskload_ps(b + j, in), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* as the AVX-512 norm, 8 lanes */
static void norm(const float *x, float *y, int n, int rms, const float *w, const float *b, float eps) {
    __m256 sum = _mm256_setzero_ps(), squares = _mm256_setzero_ps();
    for (int j = 0; j < n && !rms; j += 8) sum = _mm256_add_ps(sum, _mm256_maskload_ps(x + j, mask8(n - j)));
    __m256 mean = _mm256_set1_ps(hsum8(sum) / n);
    for (int j = 0; j < n; j += 8) {
        __m256 in = _mm256_castsi256_ps(mask8(n - j));
        __m256 d = _mm256_and_ps(in, _mm256_sub_ps(_mm256_maskload_ps(x + j, mask8(n - j)), mean));
        squares = _mm256_fmadd_ps(d, d, squares);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum8(squares) / n + eps));
    for (int j = 0; j < n; j += 8) {
        __m256i in = mask8(n - j);
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, in), mean), inv);
        if (w) v = _mm256_mul_ps(v, _mm256_maskload_ps(w + j, in));
        if (b) v = _mm256_add_ps(v, _mm256_maskload_ps(b + j, in));
        _mm256_maskstore_ps(y + j, in, v);
    }
}

/* as the AVX-512 attend_one: the values' weighted sum 64 columns at a time in registers, out written once */
static void attend_one(const float *q, const float *k, const float *v, long stride, float *out, int L, int hs,
                       float *p) {
    float scale = 1.0f / sqrtf((float)hs), top = -INFINITY, total = 0.0f;
    for (int l = 0; l < L; l++) top = fmaxf(top, p[l] = dot(q, k + l * stride, hs) * scale);
    __m256 sum = _mm256_setzero_ps();
    for (int l = 0; l < L; l += 8) {
        __m256i in = mask8(L - l);
        __m256 e = _mm256_and_ps(_mm256_castsi256_ps(in),
                                 exp8(_mm256_sub_ps(_mm256_maskload_ps(p + l, in), _mm256_set1_ps(top))));
        _mm256_maskstore_ps(p + l, in, e);
        sum = _mm256_add_ps(sum, e);
    }
    total = hsum8(sum);
    for (int j = 0; j < hs; j += 64) {
        __m256i in[8];
        __m256 acc[8];
        for (int c = 0; c < 8; c++) {
            in[c] = mask8(hs - j - 8 * c); /* none where hs - j - 8c <= 0 */
            acc[c] = _mm256_setzero_ps();
        }
        if (hs - j >= 64) /* every lane: plain loads */
            for (int l = 0; l < L; l++) {
                __m256 weight = _mm256_set1_ps(p[l] / total);
                const float *row = v + l * stride + j;
                for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 8 * c), acc[c]);
            }
        else
            for (int l = 0; l < L; l++) {
                __m256 weight = _mm256_set1_ps(p[l] / total);
                const float *row = v + l * stride + j;
                for (int c = 0; c < 8; c++)
                    acc[c] = _mm256_fmadd_ps(weight, _mm256_maskload_ps(row + 8 * c, in[c]), acc[c]);
            }
        for (int c = 0; c < 8; c++) _mm256_maskstore_ps(out + j + 8 * c, in[c], acc[c]);
    }
}
#endif

/* one linear layer as model_step reads it: matvec's arguments but x, y and the residual */
typedef struct {
    const void *w;
    const float *scale, *bias;
    int kind, K, ldw, N;
} linear;

/* one Block's shape and weights (model.py's names); k, v: the layer's cache (B, nkv, block, hs), contiguous */
typedef struct {
    int C, nh, nkv, hs, hidden, block, rms, act, qk_norm;
    float eps;
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    linear c_attn, c_proj, c_fc, mlp_proj;
} layer;

#ifdef VECTOR
/* what one thread of a step keeps for itself: a norm's output and each product's input as the kernel reads it
 * (each thread computes them, which costs less than the threads meeting once more to share them), and the bytes
 * of weights it read and the ticks it took (rebalance) */
typedef struct {
    float *h;
    uint16_t *xh;
    int16_t *xi;
    float *xscale;
    double bytes;
    unsigned long long ticks;
} own;

/* thread t's rows of y = act(x m^T * scale + bias) + residual, split at cut; 0, or -1 where memory ran out */
static int share(const linear *m, const float *x, int B, const float *residual, float *y, int act, own *me, int t,
                 int nt, const unsigned *cut) {
    long n0, n1;
    share_of(m->N, t, nt, cut, &n0, &n1);
    if (n1 <= n0) return 0;
    unsigned long long start = __rdtsc();
    input in;
    round_input(&in, x, B, m->K, m->kind, me->xh, me->xi, me->xscale);
    int status = rows(&in, B, m->w, m->kind, m->scale, m->bias, residual, y, m->K, m->ldw, m->N, act, n0, n1);
    me->ticks += __rdtsc() - start;
    me->bytes += (double)(n1 - n0) * m->ldw * (m->kind == F32 ? 4 : m->kind == BF16 ? 2 : 1);
    return status;
}

/* head i of row b in the q/k/v product's output (q heads, then k heads, then v heads): q and k heads QK-normed and
 * turned by RoPE at the row's position (rope NULL: none), k and v heads written into the layer's cache (slots, nkv,
 * block, hs) at (slot[b], pos[b]) */
static void place_head(const layer *L, float *qkv, int b, int i, const int *pos, const int *slot, const float *rope,
                       float *k, float *v) {
    int nh = L->nh, nkv = L->nkv, hs = L->hs;
    float *head = qkv + (long)b * (nh + 2 * nkv) * hs + (long)i * hs;
    if (i < nh + nkv) {
        const float *turn = rope ? rope + (long)pos[b] * hs : NULL; /* hs / 2 pairs at this row's position */
        if (L->qk_norm) norm(head, head, hs, 1, NULL, NULL, L->eps);
        for (int j = 0; turn && j < hs / 2; j++) {
            float re = head[2 * j], im = head[2 * j + 1], c = turn[2 * j], s = turn[2 * j + 1];
            head[2 * j] = re * c - im * s;
            head[2 * j + 1] = re * s + im * c;
        }
    }
    if (i >= nh) {
        int g = i < nh + nkv ? i - nh : i - nh - nkv;
        long at = (long)slot[b] * nkv * L->block * hs + (long)g * L->block * hs + (long)pos[b] * hs;
        memcpy((i < nh + nkv ? k : v) + at, head, hs * sizeof *head);
    }
}

/* y's head i of row b: query head i over its group's keys and values at the row's positions 0 .. pos[b]; 0, or -1
 * where memory ran out */
static int attend(const layer *L, const float *qkv, float *y, int b, int i, const int *pos, const int *slot,
                  const float *k, const float *v) {
    int nh = L->nh, nkv = L->nkv, hs = L->hs, seen = pos[b] + 1;
    long at = (long)slot[b] * nkv * L->block * hs + (long)(i / (nh / nkv)) * L->block * hs;
    float room[1024], *scores = seen <= 1024 ? room : malloc((size_t)seen * sizeof *scores);
    if (!scores) return -1;
    attend_one(qkv + (long)b * (nh + 2 * nkv) * hs + (long)i * hs, k + at, v + at, hs, y + ((long)b * nh + i) * hs,
               seen, hs, scores);
    if (scores != room) free(scores);
    return 0;
}
#endif

/* the model around its blocks: the embeddings, the final norm and the output layer */
typedef struct {
    int n_layer, C, vocab, rms;
    float eps;
    const float *wte, *wpe, *rope, *lnf_w, *lnf_b; /* wpe NULL: RoPE's table instead (block, hs / 2, 2) */
    const layer *layers;                          /* n_layer of them */
    linear head;
} model;

/* logits (B, vocab) of tokens (B) at each row's position pos[b] in slot slot[b]: GPT.forward for one new token
 * per row, its blocks' keys and values written into k and v (n_layer, slots, nkv, block, hs), layer_stride
 * floats a layer; the logit softcap is left to the caller. The whole step in one call: between Python's
 * operations the products evict Python's own code and data from the caches, and each then costs several times
 * what it costs alone. Returns 0, -1 where memory ran out, -2 without the vector loops, -3 where a token is not in
 * [0, vocab) (nothing read). */
int model_step(const model *M, const int64_t *tokens, int B, const int *pos, const int *slot, float *k, float *v,
               long layer_stride, float *logits, int threads) {
#ifndef VECTOR
    (void)M, (void)tokens, (void)B, (void)pos, (void)slot, (void)k, (void)v, (void)layer_stride, (void)logits;
    (void)threads;
    return -2;
#else
    int C = M->C, K = M->head.K, width = 0, heads = 0, hidden = 0, status = 0;
    for (int b = 0; b < B; b++)
        if (tokens[b] < 0 || tokens[b] >= M->vocab) return -3;
    threads = threads < 1 ? 1 : threads;
    for (int l = 0; l < M->n_layer; l++) {  /* each buffer as wide as the widest layer needs */
        const layer *L = M->layers + l;
        int ks[4] = {L->c_attn.K, L->c_proj.K, L->c_fc.K, L->mlp_proj.K};
        for (int j = 0; j < 4; j++) K = ks[j] > K ? ks[j] : K;
        width = L->c_attn.N > width ? L->c_attn.N : width;
        heads = L->nh * L->hs > heads ? L->nh * L->hs : heads;
        hidden = L->c_fc.N > hidden ? L->c_fc.N : hidden;
    }
    float *x = malloc((size_t)B * C * sizeof *x), *qkv = malloc((size_t)B * width * sizeof *qkv);
    float *y = malloc((size_t)B * heads * sizeof *y), *a = malloc((size_t)B * hidden * sizeof *a);
    own *owns = calloc(threads, sizeof *owns);
    if (!x || !qkv || !y || !a || !owns) status = -1;
    for (int t = 0; t < threads && !status; t++) {
        owns[t].h = malloc((size_t)B * C * sizeof *owns[t].h);
        status = owns[t].h ? input_room(B, K, &owns[t].xh, &owns[t].xi, &owns[t].xscale) : -1;
    }
    for (int b = 0; b < B && !status; b++)
        for (int j = 0; j < C; j++)
            x[(long)b * C + j] = M->wte[tokens[b] * C + j] + (M->wpe ? M->wpe[(long)pos[b] * C + j] : 0.0f);
    /* One team of threads for the whole step, meeting where a product needs all of the one before: each product's
     * rows split between them, then the heads' RoPE and cache writes, then attention, a row's head at a time. Every
     * thread passes every barrier, whatever failed. */
    int failed = 0, team = 1;
    unsigned cuts[TEAM_MAX + 1];
    if (threads <= TEAM_MAX) team_cuts(threads, cuts);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1 && !status)
#endif
    {
        int t, nt;
        member(&t, &nt);
        if (t == 0) team = nt;
        const unsigned *cut = nt == threads && nt <= TEAM_MAX ? cuts : NULL; /* a smaller team than asked: even */
        own *me = status ? NULL : owns + t;
        int bad = status;
        for (int l = 0; l < M->n_layer && !status; l++) {
            const layer *L = M->layers + l;
            float *kl = k + l * layer_stride, *vl = v + l * layer_stride;
            int nh = L->nh, nkv = L->nkv, per_row = nh + 2 * nkv;
            for (int b = 0; b < B; b++) norm(x + (long)b * C, me->h + (long)b * C, C, L->rms, L->ln1_w, L->ln1_b, L->eps);
            bad |= share(&L->c_attn, me->h, B, NULL, qkv, ACT_NONE, me, t, nt, cut);
            const float *rope = M->wpe ? NULL : M->rope;
#ifdef _OPENMP
#pragma omp barrier
#endif
            if (B * nkv >= nt) { /* a group's keys and values placed, then its queries' attention: no meeting between */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (int u = 0; u < B * nkv; u++) {
                    int b = u / nkv, g = u % nkv, per = nh / nkv;
                    place_head(L, qkv, b, nh + g, pos, slot, rope, kl, vl);
                    place_head(L, qkv, b, nh + nkv + g, pos, slot, rope, kl, vl);
                    for (int i = g * per; i < (g + 1) * per; i++) {
                        place_head(L, qkv, b, i, pos, slot, rope, kl, vl);
                        bad |= attend(L, qkv, y, b, i, pos, slot, kl, vl);
                    }
                }
            } else { /* fewer groups than threads: every head placed, then each query's attention */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (int u = 0; u < B * per_row; u++) place_head(L, qkv, u / per_row, u % per_row, pos, slot, rope, kl, vl);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (int u = 0; u < B * nh; u++) bad |= attend(L, qkv, y, u / nh, u % nh, pos, slot, kl, vl);
            }
            bad |= share(&L->c_proj, y, B, x, x, ACT_NONE, me, t, nt, cut); /* heads concatenated, added */
#ifdef _OPENMP
#pragma omp barrier
#endif
            for (int b = 0; b < B; b++) norm(x + (long)b * C, me->h + (long)b * C, C, L->rms, L->ln2_w, L->ln2_b, L->eps);
            bad |= share(&L->c_fc, me->h, B, NULL, a, L->act, me, t, nt, cut);
#ifdef _OPENMP
#pragma omp barrier
#endif
            bad |= share(&L->mlp_proj, a, B, x, x, ACT_NONE, me, t, nt, cut);
#ifdef _OPENMP
#pragma omp barrier
#endif
        }
        if (!status) {
            for (int b = 0; b < B; b++) norm(x + (long)b * C, me->h + (long)b * C, C, M->rms, M->lnf_w, M->lnf_b, M->eps);
            bad |= share(&M->head, me->h, B, NULL, logits, ACT_NONE, me, t, nt, cut);
        }
        if (bad) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
    }
    if (failed) status = -1;
    if (!status && team == threads && threads <= TEAM_MAX) {
        double bytes[TEAM_MAX];
        unsigned long long ticks[TEAM_MAX];
        for (int t = 0; t < threads; t++) bytes[t] = owns[t].bytes, ticks[t] = owns[t].ticks;
        rebalance(threads, cuts, bytes, ticks);
    }
    for (int t = 0; owns && t < threads; t++) free(owns[t].h), free(owns[t].xh), free(owns[t].xi), free(owns[t].xscale);
    free(owns), free(x), free(qkv), free(y), free(a);
    return status;
#endif
}

/* A row's greedy token from its logits row (N): the first of its largest (the first NaN where there is one:
 * torch.argmax's rule), capped first where softcap > 0 (softcap * tanh(logit / softcap), as GPT.softcap). libm's
 * tanhf can round an ulp away from torch.tanh, and the cap can tie logits that differ: where the two largest capped
 * logits lie within 8 ulps of each other either could be torch's choice, and -1 leaves it to the caller. */
static long greedy_one(const float *row, long N, float softcap) {
    long best = 0;
    float top = -INFINITY, second = -INFINITY;  /* the largest, and the largest of the others */
    for (long j = 0; j < N; j++) {
        float x = softcap > 0 ? softcap * tanhf(row[j] / softcap) : row[j];
        if (isnan(x)) return j;
        if (j == 0 || x > top) {
            if (j > 0) second = top;
            best = j, top = x;
        } else if (x > second) {
            second = x;
        }
    }
    return softcap > 0 && N > 1 && top - second <= 8 * FLT_EPSILON * fabsf(top) ? -1 : best;
}

/* A row's sampled token from its logits row (N), as generate.sample_next takes it at a temperature with no top-k,
 * top-p or penalty: capped where softcap > 0, less their largest, over the temperature, a softmax, then the first
 * token whose cumulative probability passes draw times the total (generate.pick). libm's exp and the sums' order
 * differ from PyTorch's by an ulp or a few, and a capped logit by an ulp of the cap (tanhf), which the temperature
 * then scales: where the draw lies within tolerance (+ 16 ulps of the cap over the temperature, with a cap) of the
 * total from either edge of the token's share, or a logit is NaN, either side could be torch's choice, and -1
 * leaves it to the caller. work: N floats of scratch. */
static long sample_one(const float *row, long N, float softcap, float temperature, float draw, float tolerance,
                       float *work) {
    float top = -INFINITY;
    for (long j = 0; j < N; j++) {
        float x = softcap > 0 ? softcap * tanhf(row[j] / softcap) : row[j];
        if (isnan(x)) return -1;
        work[j] = x;
        if (x > top) top = x;
    }
    double total = 0.0;
    for (long j = 0; j < N; j++) total += work[j] = expf((work[j] - top) / temperature);
    double cumulative = 0.0;
    for (long j = 0; j < N; j++) work[j] = (float)(cumulative += (float)(work[j] / total));
    float last = work[N - 1], target = draw * last;
    float margin = (tolerance + (softcap > 0 ? 16 * FLT_EPSILON * softcap / temperature : 0.0f)) * last;
    for (long j = 0; j < N; j++)
        if (work[j] > target) {
            float below = j ? work[j - 1] : 0.0f;
            return target - below <= margin || work[j] - target <= margin ? -1 : j;
        }
    return -1;
}

/* Up to n decode steps from tokens (B), each row's token chosen by greedy_one (temperature 0) or by sample_one
 * with its draw draws[s * B + b] (uniform in [0, 1), those sample_next would draw) and written to out (n, B), then
 * fed to the next step one position on; pos advances in place, one a step (the caller leaves the cache room for n).
 * A step where a row's choice is left to the caller ends the run: *decided steps are in out, the next one ran and
 * its logits (not capped) are in logits, its positions not advanced. The loop a decode runs, in one call: between
 * steps Python would cost as much as a step's attention. Returns as model_step, *decided the steps done before the
 * one that failed. */
int model_run(const model *M, const int64_t *tokens, int B, int *pos, const int *slot, float *k, float *v,
              long layer_stride, float *logits, int n, int64_t *out, float softcap, float temperature,
              const float *draws, float tolerance, int *decided, int threads) {
    const int64_t *in = tokens;
    long N = M->head.N;
    float *work = temperature > 0 ? malloc((size_t)N * sizeof *work) : NULL;
    int status = temperature > 0 && !work ? -1 : 0;
    *decided = 0;
    for (int s = 0; s < n && !status; s++) {
        int sure = 1;
        status = model_step(M, in, B, pos, slot, k, v, layer_stride, logits, threads);
        for (int b = 0; b < B && sure && !status; b++) {
            const float *row = logits + b * N;
            long j = temperature > 0 ? sample_one(row, N, softcap, temperature, draws[(long)s * B + b], tolerance, work)
                                     : greedy_one(row, N, softcap);
            sure = j >= 0;
            out[(long)s * B + b] = j;
        }
        if (status || !sure) break;  /* failed, or this step's choices are the caller's */
        for (int b = 0; b < B; b++) pos[b]++;
        *decided = s + 1;
        in = out + (long)s * B;
    }
    free(work);
    return status;
}

/* the vector loops this build has: 512 (AVX-512 F, BW, VL, VNNI, BF16), 256 (AVX2 and FMA), 0 (none: native.py
 * does not call it) */
int matvec_vector(void) {
#ifdef VECTOR
    return VECTOR;
#else
    return 0;
#endif
}
