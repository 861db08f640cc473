/* hash.c - SipHash with a per-process key (see hash.h). */
#include "llm/hash.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static uint64_t load64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void sip_round(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = ROTL(v[1], 13);
    v[1] ^= v[0];
    v[0] = ROTL(v[0], 32);
    v[2] += v[3];
    v[3] = ROTL(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = ROTL(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = ROTL(v[1], 17);
    v[1] ^= v[2];
    v[2] = ROTL(v[2], 32);
}

uint64_t llm_siphash(const uint8_t key[16], const void *data, size_t n, int c_rounds, int d_rounds)
{
    const uint8_t *p = data;
    uint64_t k0 = load64(key), k1 = load64(key + 8);
    uint64_t v[4] = {k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull, k0 ^ 0x6c7967656e657261ull,
                     k1 ^ 0x7465646279746573ull};
    size_t whole = n - n % 8;
    for (size_t i = 0; i < whole; i += 8) {
        uint64_t m = load64(p + i);
        v[3] ^= m;
        for (int r = 0; r < c_rounds; r++) sip_round(v);
        v[0] ^= m;
    }
    uint64_t last = (uint64_t)n << 56;
    for (size_t i = 0; i < n % 8; i++) last |= (uint64_t)p[whole + i] << (8 * i);
    v[3] ^= last;
    for (int r = 0; r < c_rounds; r++) sip_round(v);
    v[0] ^= last;
    v[2] ^= 0xff;
    for (int r = 0; r < d_rounds; r++) sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

static uint8_t g_key[16];

static void make_key(void)
{
    if (getentropy(g_key, sizeof g_key)) { /* no entropy source: the clock and addresses, still unknown outside */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t a = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32), b = (uint64_t)(uintptr_t)&ts ^ (uint64_t)getpid();
        memcpy(g_key, &a, 8);
        memcpy(g_key + 8, &b, 8);
    }
}

uint64_t llm_hash(const void *p, size_t n)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_key);
    return llm_siphash(g_key, p, n, 1, 3);
}
