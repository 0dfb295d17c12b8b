/* decode.c's products alone, back to back in C, against a sum over as many bytes: what the products of one decode
 * step of the GPU recipe's shape (6 x 384, 25 products but the head) cost with nothing between them and no Python
 * around each call (docs/results.md, "Against llama.cpp").
 *
 *     cc -O3 -march=native -fopenmp runs/decode_products.c -o /tmp/decode_products -lm
 *     /tmp/decode_products 2 1        # kind (0 float32, 1 bfloat16, 2 int8), threads
 *
 * Medians and the best of 200 passes. The weights are random bytes: speed does not depend on them. */
#include "../nanogpt/cpu/decode.c"
#include <stdio.h>
#include <time.h>

#define PASSES 200

static volatile float sink; /* each sum is stored here: the compiler may not drop its loop */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int kind = argc > 1 ? atoi(argv[1]) : INT8, threads = argc > 2 ? atoi(argv[2]) : 1;
    enum { LAYERS = 6 };
    const int shape[4][2] = {{1152, 384}, {384, 384}, {1536, 384}, {384, 1536}}; /* (N, K): c_attn .. mlp c_proj */
    size_t item = kind == F32 ? 4 : kind == BF16 ? 2 : 1, bytes = 0;
    void *w[LAYERS][4];
    float *scale[LAYERS][4], x[1536], y[1536];
    double t[PASSES], sums[PASSES];
    srand(0);
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 4; p++) {
            size_t n = (size_t)shape[p][0] * shape[p][1];
            unsigned char *c = w[l][p] = aligned_alloc(64, (n * item + 63) / 64 * 64);
            for (size_t i = 0; i < n * item; i++) /* bfloat16: 1.0 and small values; float32: exact fractions */
                c[i] = kind == BF16 ? (i & 1 ? 0x3c : 0) : (unsigned char)(rand() & 0x7f);
            if (kind == F32)
                for (size_t i = 0; i < n; i++) ((float *)c)[i] = (rand() % 100 - 50) * 0.01f;
            scale[l][p] = malloc(shape[p][0] * sizeof(float));
            for (int i = 0; i < shape[p][0]; i++) scale[l][p][i] = 0.01f;
            bytes += n * item;
        }
    for (int i = 0; i < 1536; i++) x[i] = (rand() % 100 - 50) * 0.01f;
    for (int pass = 0; pass < PASSES; pass++) {
        double t0 = now();
        for (int l = 0; l < LAYERS; l++)
            for (int p = 0; p < 4; p++)
                if (matvec(x, 1, w[l][p], kind, kind == INT8 ? scale[l][p] : NULL, NULL, NULL, y, shape[p][1],
                           shape[p][1], shape[p][0], ACT_NONE, threads))
                    return 1;
        t[pass] = now() - t0;
    }
    size_t n = bytes / 4; /* the sum reads the same bytes as float32, with the same threads */
    float *buffer = aligned_alloc(64, n * sizeof(float));
    for (size_t i = 0; i < n; i++) buffer[i] = 1.0f;
    for (int pass = 0; pass < PASSES; pass++) {
        double t0 = now();
        float s = 0;
#pragma omp parallel for simd num_threads(threads) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += buffer[i];
        sums[pass] = now() - t0;
        sink = s;
    }
    qsort(t, PASSES, sizeof *t, by_value);
    qsort(sums, PASSES, sizeof *sums, by_value);
    printf("%s products, %d thread(s), %.1f MB: median %.0f us (%.1f GB/s), best %.0f us\n",
           kind == F32 ? "float32" : kind == BF16 ? "bfloat16" : "int8", threads, bytes / 1e6, t[PASSES / 2] * 1e6,
           bytes / t[PASSES / 2] / 1e9, t[0] * 1e6);
    printf("a sum over the same bytes: median %.0f us (%.1f GB/s), best %.0f us\n", sums[PASSES / 2] * 1e6,
           bytes / sums[PASSES / 2] / 1e9, sums[0] * 1e6);
    return 0;
}
