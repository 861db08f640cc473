/* cuda_fp16.h (cudasim) - half types come with the emulator's device dialect. */
#ifndef CUSIM_CUDA_FP16_H
#define CUSIM_CUDA_FP16_H
#include "cuda_runtime.h"
#endif
