/* nccl.h (cudasim) - the NCCL calls engine/backend/cuda/backend_cuda.c makes, for the
 * CUDA-on-CPU emulator (tests/cudasim/nccl.c): communicators over the
 * emulated devices of one process and a float sum all-reduce, enqueued on
 * each rank's stream. Numeric values as in NCCL 2's header. */
#ifndef CUSIM_NCCL_H
#define CUSIM_NCCL_H

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;

typedef enum { ncclFloat32 = 7, ncclFloat = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct ncclComm *ncclComm_t;

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s);
const char *ncclGetErrorString(ncclResult_t r);

#ifdef __cplusplus
}
#endif

#endif
