/* blas.c - the cuBLAS calls engine/backend/cuda/backend_cuda.c makes, on the emulator:
 * a handle bound to a stream and a workspace, and cublasGemmEx.
 *
 * GemmEx follows cuBLAS's column-major definition, C (m x n) = alpha
 * op(A) op(B) + beta C, with op(A) m x k; argument errors are the ones
 * cuBLAS documents (INVALID_VALUE for negative sizes and leading
 * dimensions too small for the operation, NOT_SUPPORTED for a type
 * combination outside F32, F16 and BF16 inputs with F32 output, compute
 * COMPUTE_32F, or COMPUTE_32F_FAST_TF32 for F32 inputs, which are rounded
 * to TF32 first). Products and sums are FP32 in k order (cuBLAS's order
 * is its own: results agree within rounding, not bit for bit). It is
 * queued on the handle's stream like the kernels cuBLAS would launch;
 * when it runs, each matrix's extent must lie in one device allocation of
 * that stream's device, else it is an illegal-address fault, as a cuBLAS
 * kernel reading past an allocation would be. beta 0 does not read C
 * (NaN there is ignored, as documented). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_v2.h"
#include "sim.h"

struct cublasContext {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
    int dev;
};

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    if (!h)
        return CUBLAS_STATUS_INVALID_VALUE;
    sim_lock();
    cudaError_t e = sim_prologue();
    int dev = sim_cur_dev();
    sim_unlock();
    if (e)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = calloc(1, sizeof **h);
    if (!*h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    (*h)->dev = dev;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    sim_lock();
    int bad = bytes && sim_device_ptr(ws, bytes, h->dev, "cublasSetWorkspace workspace");
    sim_unlock();
    if (bad)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    }
    return "unknown error";
}

typedef struct gemm_op {
    int ta, tb, m, n, k, lda, ldb, ldc, dt, tf32;
    float alpha, beta;
    const void *A, *B;
    float *C;
} gemm_op;

static float elem(int dt, const void *p, size_t i)
{
    if (dt == CUDA_R_32F)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == CUDA_R_16F ? cusim_half_to_float(h) : cusim_bf16_to_float(h);
}

/* An F32 input as the tensor cores read it under FAST_TF32: 10 mantissa
 * bits, rounded to nearest (ties away, as the hardware's conversion). */
static float tf32(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7f800000u) != 0x7f800000u)
        x = (x + 0x1000u) & 0xffffe000u;
    memcpy(&f, &x, 4);
    return f;
}

static size_t extent(int trans, int rows, int cols, int ld) /* elements a column-major op(X) rows x cols spans */
{
    return trans ? (size_t)(rows - 1) * (size_t)ld + (size_t)cols : (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
}

static void gemm_run(sim_op *op)
{
    gemm_op *g = SIM_PAYLOAD(op, gemm_op);
    if (!g->m || !g->n)
        return;
    size_t es = g->dt == CUDA_R_32F ? 4 : 2, ea = g->k ? extent(g->ta, g->m, g->k, g->lda) : 0,
           eb = g->k ? extent(g->tb, g->k, g->n, g->ldb) : 0, ec = (size_t)(g->n - 1) * (size_t)g->ldc + (size_t)g->m;
    int dev = op->stream->dev;
    if ((ea && sim_device_ptr(g->A, ea * es, dev, "cublasGemmEx A")) ||
        (eb && sim_device_ptr(g->B, eb * es, dev, "cublasGemmEx B")) ||
        sim_device_ptr(g->C, ec * 4, dev, "cublasGemmEx C")) {
        sim_fault(cudaErrorIllegalAddress, "cublasGemmEx (m %d n %d k %d, lda %d ldb %d ldc %d): a matrix is not in device memory of device %d",
                  g->m, g->n, g->k, g->lda, g->ldb, g->ldc, dev);
        return;
    }
    float *a = malloc(sizeof *a * (size_t)g->m * (size_t)(g->k ? g->k : 1)),
          *b = malloc(sizeof *b * (size_t)(g->k ? g->k : 1) * (size_t)g->n);
    if (!a || !b) {
        free(a), free(b);
        sim_fault(cudaErrorMemoryAllocation, "cublasGemmEx: no host memory to emulate it");
        return;
    }
    for (int i = 0; i < g->m; i++) /* op(A) as row i, k contiguous */
        for (int l = 0; l < g->k; l++) {
            float v = elem(g->dt, g->A, g->ta ? (size_t)l + (size_t)i * g->lda : (size_t)i + (size_t)l * g->lda);
            a[(size_t)i * g->k + l] = g->tf32 ? tf32(v) : v;
        }
    for (int j = 0; j < g->n; j++) /* op(B) as column j */
        for (int l = 0; l < g->k; l++) {
            float v = elem(g->dt, g->B, g->tb ? (size_t)j + (size_t)l * g->ldb : (size_t)l + (size_t)j * g->ldb);
            b[(size_t)j * g->k + l] = g->tf32 ? tf32(v) : v;
        }
    for (int j = 0; j < g->n; j++)
        for (int i = 0; i < g->m; i++) {
            float acc = 0.f;
            const float *ar = a + (size_t)i * g->k, *bc = b + (size_t)j * g->k;
            for (int l = 0; l < g->k; l++) acc += ar[l] * bc[l];
            float *c = g->C + (size_t)i + (size_t)j * g->ldc;
            *c = g->beta == 0.f ? g->alpha * acc : g->alpha * acc + g->beta * *c;
        }
    free(a);
    free(b);
}

static const sim_op_kind gemm_kind = {"cublasGemmEx", gemm_run, NULL, NULL, NULL};

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int tra = ta != CUBLAS_OP_N, trb = tb != CUBLAS_OP_N;
    if (m < 0 || n < 0 || k < 0 || !alpha || !beta || lda < (tra ? (k > 1 ? k : 1) : (m > 1 ? m : 1)) ||
        ldb < (trb ? (n > 1 ? n : 1) : (k > 1 ? k : 1)) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (at != bt || ct != CUDA_R_32F || (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
        (at != CUDA_R_32F && at != CUDA_R_16F && at != CUDA_R_16BF) || (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && at != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    sim_lock();
    cudaError_t e = sim_prologue();
    if (!e)
        e = sim_injected("cublasGemmEx");
    sim_op *op = e ? NULL : sim_op_new(&gemm_kind, sizeof(gemm_op));
    if (op) {
        *SIM_PAYLOAD(op, gemm_op) = (gemm_op){tra, trb, m, n, k, lda, ldb, ldc, (int)at,
                                             compute == CUBLAS_COMPUTE_32F_FAST_TF32, *(const float *)alpha,
                                             *(const float *)beta, A, B, C};
        sim_enqueue(sim_stream_of(h->stream), op);
    }
    sim_unlock();
    return e ? CUBLAS_STATUS_EXECUTION_FAILED : op ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
