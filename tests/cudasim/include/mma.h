/* mma.h (cudasim) - nvcuda::wmma at the matrix level for the emulator:
 * 16x16x16 fragments of half (a, b) and float (accumulator), loads and
 * stores with both layouts, fill, and mma_sync with FP32 accumulation.
 *
 * A fragment's elements are spread over the warp by one fixed mapping:
 * lane l holds elements [8l, 8l + 8) of the tile in row-major order (A
 * m x k, B k x n, C m x n). Real devices use another, undocumented one,
 * so code that reads fragment elements by index (x[i]) is only right for
 * element-wise work, as the Programming Guide says. Every operation is
 * warp-collective: all 32 lanes must reach it (cusim_warp checks), and
 * each lane loads and stores its own elements, so the emulator's checks
 * see every access. Pointers must be 256-bit aligned and ldm a multiple
 * of 8 halves or 4 floats (the documented rules). */
#ifndef CUSIM_MMA_H
#define CUSIM_MMA_H

#include "cusim_device.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cudasim: only the m16n16k16 shape");
    enum { num_elements = 8 };
    T x[8];
};

static inline void cusim_wmma_rules(const char *site, const void *p, unsigned ldm, unsigned elem, const char *what)
{
    if ((uintptr_t)p % 32)
        cusim_device_fault(site, "wmma::%s: pointer %p is not 256-bit aligned", what, p);
    if ((ldm * elem) % 16)
        cusim_device_fault(site, "wmma::%s: ldm %u is not a multiple of %u elements", what, ldm, 16 / elem);
}

/* Element e of lane l: (row, column) of the row-major tile. */
static inline int cusim_row(int e) { return ((int)(cusim_r.tid.x % 32) * 8 + e) / 16; }
static inline int cusim_col(int e) { return ((int)(cusim_r.tid.x % 32) * 8 + e) % 16; }

template <class Use, class L>
static inline void cusim_load(const char *site, fragment<Use, 16, 16, 16, __half, L> &f, const __half *p, unsigned ldm)
{
    cusim_wmma_rules(site, p, ldm, 2, "load_matrix_sync");
    (void)cusim_warp(site, CUSIM_W_WMMA, 0xffffffffu, 0, 0, 32, NULL);
    const bool rowm = std::is_same<L, row_major>::value;
    for (int e = 0; e < 8; e++) {
        int r = cusim_row(e), c = cusim_col(e);
        f.x[e] = rowm ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}

static inline void cusim_load_acc(const char *site, fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                  unsigned ldm, layout_t l)
{
    cusim_wmma_rules(site, p, ldm, 4, "load_matrix_sync");
    (void)cusim_warp(site, CUSIM_W_WMMA, 0xffffffffu, 0, 0, 32, NULL);
    for (int e = 0; e < 8; e++) {
        int r = cusim_row(e), c = cusim_col(e);
        f.x[e] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}

static inline void cusim_store(const char *site, float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                               unsigned ldm, layout_t l)
{
    cusim_wmma_rules(site, p, ldm, 4, "store_matrix_sync");
    (void)cusim_warp(site, CUSIM_W_WMMA, 0xffffffffu, 0, 0, 32, NULL);
    for (int e = 0; e < 8; e++) {
        int r = cusim_row(e), c = cusim_col(e);
        if (l == mem_row_major)
            p[(size_t)r * ldm + c] = f.x[e];
        else
            p[(size_t)c * ldm + r] = f.x[e];
    }
}

template <class Use, class T, class L>
static inline void cusim_fill(const char *site, fragment<Use, 16, 16, 16, T, L> &f, T v)
{
    (void)cusim_warp(site, CUSIM_W_WMMA, 0xffffffffu, 0, 0, 32, NULL);
    for (int e = 0; e < 8; e++) f.x[e] = v;
}

template <class LA, class LB>
static inline void cusim_mma(const char *site, fragment<accumulator, 16, 16, 16, float> &d,
                             const fragment<matrix_a, 16, 16, 16, __half, LA> &a,
                             const fragment<matrix_b, 16, 16, 16, __half, LB> &b,
                             const fragment<accumulator, 16, 16, 16, float> &c)
{
    cusim_mma_args m = {(const uint16_t *)a.x, (const uint16_t *)b.x, c.x, d.x};
    (void)cusim_warp(site, CUSIM_W_MMA, 0xffffffffu, 0, 0, 32, &m);
}

#define load_matrix_sync(f, ...) cusim_load_any(CUSIM_SITE, f, __VA_ARGS__)
#define store_matrix_sync(p, f, ldm, l) cusim_store(CUSIM_SITE, p, f, ldm, l)
#define fill_fragment(f, v) cusim_fill(CUSIM_SITE, f, v)
#define mma_sync(d, a, b, c) cusim_mma(CUSIM_SITE, d, a, b, c)

template <class Use, class L>
static inline void cusim_load_any(const char *site, fragment<Use, 16, 16, 16, __half, L> &f, const __half *p,
                                  unsigned ldm)
{
    cusim_load(site, f, p, ldm);
}
static inline void cusim_load_any(const char *site, fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                  unsigned ldm, layout_t l)
{
    cusim_load_acc(site, f, p, ldm, l);
}

} // namespace wmma
} // namespace nvcuda

#endif
