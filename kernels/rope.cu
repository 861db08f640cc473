/* rope.cu - rotary position embedding in place, both pair orderings; one
 * thread per (token, head, pair). The frequencies come from the host
 * (the CPU backend's powf of the base, divided by the factors): the
 * device's powf is not correctly rounded, and an error of a few ulps in a
 * frequency moves an angle of thousands of radians by ~1e-3, past the
 * tolerance (the CUDA-on-CPU emulator showed it with powf at the
 * documented error). */
#include "common.cuh"
#include "llm_kernels.h"

__global__ static void rope_kernel(float *x, int n_tok, int n_head, int head_dim, int rot_dim, const int32_t *pos,
                                   const float *freq, float freq_scale, int neox)
{
    int half = rot_dim / 2;
    size_t total = (size_t)n_tok * n_head * half;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(k % half);
        size_t th = k / half; /* token * n_head + head */
        int t = (int)(th / n_head);
        float ang = (float)pos[t] * freq_scale * freq[i], sn, cs;
        sincosf(ang, &sn, &cs);
        float *v = x + th * head_dim;
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cs - x1 * sn;
        v[i1] = x0 * sn + x1 * cs;
    }
}

extern "C" int lk_rope(float *x, int n_tok, int n_head, int head_dim, int rot_dim, const int32_t *pos, const float *freq,
                       float freq_scale, int neox, void *stream)
{
    size_t total = (size_t)n_tok * n_head * (rot_dim / 2);
    if (!total)
        return 0;
    LK_LAUNCH(rope_kernel, lk_blocks(total, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(
        x, n_tok, n_head, head_dim, rot_dim, pos, freq, freq_scale, neox);
    return lk_status();
}
