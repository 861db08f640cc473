/* split_name.h - llama.cpp's names for the parts of a split GGUF
 * (gguf-split, convert_hf_to_gguf --split-max-size): PREFIX-00001-of-00003.gguf,
 * PREFIX-00002-of-00003.gguf, ... Shared by the GGUF reader, which maps a
 * set's parts, and the fetch module, which downloads them.
 * Thread-safe (no state). */
#ifndef LLM_SPLIT_NAME_H
#define LLM_SPLIT_NAME_H

#include <stddef.h>
#include <stdint.h>

/* When path ends in -KKKKK-of-NNNNN.gguf (1 <= K <= N) returns N and, when
 * buf is not NULL, writes part k's (1-based) path into buf (0 when k is
 * out of range or buf too small); else 0. */
int llm_split_path(const char *path, uint32_t k, char *buf, size_t n);

#endif
