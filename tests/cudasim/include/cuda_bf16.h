/* cuda_bf16.h (cudasim) - half types come with the emulator's device dialect. */
#ifndef CUSIM_CUDA_BF16_H
#define CUSIM_CUDA_BF16_H
#include "cuda_runtime.h"
#endif
