/* Vectorizable math shared by the CPU kernels (included by cpu_attention.c and cpu_ops.c;
 * cpu_native.py hashes this header with each source and passes -I for it). */
#ifndef LLMSERVICE_CPU_MATH_H
#define LLMSERVICE_CPU_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0, Cephes' expf: range reduction by ln 2 and a degree-7 polynomial,
 * within 2 ulp of expf. Branch-free so `omp simd` vectorizes the loops that call it
 * (libm's expf is a scalar call per element). */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x; /* exp(-87) ~ 1.6e-38: nothing, still normal */
    const float n = rintf(x * 1.44269504088896341f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
