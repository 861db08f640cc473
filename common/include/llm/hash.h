/* hash.h - a keyed hash for tables whose keys come from outside (request
 * JSON, grammar rule names): SipHash-1-3 under a per-process random key,
 * so nobody can choose keys that all land in one slot and turn lookups
 * quadratic (FNV, even seeded, lets an attacker build colliding keys
 * offline). Written here because the engine links no crypto library; the
 * algorithm is Aumasson and Bernstein's, checked against their reference
 * vectors in tests/unit/test_hash.c.
 * Thread-safety: the key is made once (pthread_once); calls are reentrant. */
#ifndef LLM_HASH_H
#define LLM_HASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-1-3 of n bytes under the process's key. */
uint64_t llm_hash(const void *p, size_t n);
/* SipHash-c-d under an explicit 16-byte key (the tests' reference vectors). */
uint64_t llm_siphash(const uint8_t key[16], const void *p, size_t n, int c_rounds, int d_rounds);

#endif
