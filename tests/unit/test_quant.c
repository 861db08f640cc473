/* test_quant.c - tensor types and CPU kernels against float64 references.
 *
 * Dequantization: random blocks (random quant bits, random finite scales)
 * decoded by the engine vs. a float64 decoder written here from the format
 * description; must agree to float32 rounding (rel 1e-6).
 * Dot kernels (scalar and AVX2): vs. the float64 sum of the dequantized
 * operands, on odd sizes (odd block counts for block types). Integer
 * kernels are exact up to the final float scaling: tolerance 1e-5 relative
 * to sum |w*x|. Float kernels reorder float sums: 1e-5 of sum |w*x|.
 * Quantization round trip: RMS error relative to RMS value under a bound
 * per type (bits of precision: Q8 ~ 1/127, Q6 ~ 1/31, Q4 ~ 1/7 of the
 * range), and llm-mkmodel's 8-bit activations use the same code. */
#include <math.h>

#include "testutil.h"

#include "cpu/kernels.h"
#include "llm/backend.h"
#include "llm/model.h"
#include "llm/quant.h"

static uint64_t seed = 12345;

static uint16_t rand_f16_scale(void)
{
    /* positive normal f16 in [2^-10, 2^-2): realistic scales */
    return quant_f32_to_f16(ldexpf(1.0f + (test_randf(&seed) + 1.0f) / 2.0f, -10 + (int)(test_rng(&seed) % 8)));
}

static void rand_bytes(void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) ((uint8_t *)p)[i] = (uint8_t)test_rng(&seed);
}

/* ---- float64 reference decoders ------------------------------------------ */

static double h(uint16_t x) { return (double)quant_f16_to_f32(x); }

static void ref_q8_0(const block_q8_0 *b, double *y)
{
    for (int j = 0; j < 32; j++) y[j] = h(b->d) * b->qs[j];
}

static void ref_q4_0(const block_q4_0 *b, double *y)
{
    for (int j = 0; j < 32; j++) {
        int q = j < 16 ? (b->qs[j] & 15) : (b->qs[j - 16] >> 4);
        y[j] = h(b->d) * (q - 8);
    }
}

/* Q4_K: element e is in sub-block e/32; 8 (scale, min) 6-bit pairs. */
static void ref_q4_K(const block_q4_K *b, double *y)
{
    for (int e = 0; e < 256; e++) {
        int sb = e / 32, sc, m;
        if (sb < 4) {
            sc = b->scales[sb] & 63;
            m = b->scales[sb + 4] & 63;
        } else {
            sc = (b->scales[sb + 4] & 15) | ((b->scales[sb - 4] >> 6) << 4);
            m = (b->scales[sb + 4] >> 4) | ((b->scales[sb] >> 6) << 4);
        }
        int byte = (sb / 2) * 32 + e % 32;
        int q = sb % 2 ? b->qs[byte] >> 4 : b->qs[byte] & 15;
        y[e] = h(b->d) * sc * q - h(b->dmin) * m;
    }
}

/* Q6_K: halves of 128; within a half, quarter k (32 elements) takes low
 * nibbles of ql[0..63] (k = 0, 1) or high nibbles (k = 2, 3) and bits
 * 2k..2k+1 of qh; scales per 16 elements. */
static void ref_q6_K(const block_q6_K *b, double *y)
{
    for (int e = 0; e < 256; e++) {
        int half = e / 128, r = e % 128, k = r / 32, l = r % 32;
        const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
        int lo = k % 2 ? ql[32 + l] : ql[l];
        lo = k < 2 ? lo & 15 : lo >> 4;
        int hi = (qh[l] >> (2 * k)) & 3;
        y[e] = h(b->d) * b->scales[e / 16] * ((lo | (hi << 4)) - 32);
    }
}

/* The 5th bit of element j of a Q5_0/Q5_1 block: bit j of qh read as a
 * little-endian 32-bit integer. */
static int q5_bit(const uint8_t *qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

static int nib32(const uint8_t *qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

static void ref_q4_1(const block_q4_1 *b, double *y)
{
    for (int j = 0; j < 32; j++) y[j] = h(b->d) * nib32(b->qs, j) + h(b->m);
}

static void ref_q5_0(const block_q5_0 *b, double *y)
{
    for (int j = 0; j < 32; j++) y[j] = h(b->d) * ((nib32(b->qs, j) + 16 * q5_bit(b->qh, j)) - 16);
}

static void ref_q5_1(const block_q5_1 *b, double *y)
{
    for (int j = 0; j < 32; j++) y[j] = h(b->d) * (nib32(b->qs, j) + 16 * q5_bit(b->qh, j)) + h(b->m);
}

/* Q2_K/Q3_K: element e sits in byte 32 * (e / 128) + e % 32 of qs, at
 * bits 2k..2k+1 with k = (e % 128) / 32; one scale per 16 elements. */
static int q2_bits(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

static void ref_q2_K(const block_q2_K *b, double *y)
{
    for (int e = 0; e < 256; e++) {
        int sc = b->scales[e / 16];
        y[e] = h(b->d) * (sc % 16) * q2_bits(b->qs, e) - h(b->dmin) * (sc / 16);
    }
}

/* Q3_K scale j: low 4 bits in scales[j % 8] (low nibble for j < 8, high
 * after), high 2 bits at bit 2 * (j / 4) of scales[8 + j % 4]; minus 32.
 * The quant loses 4 unless hmask[e % 32] has bit (e / 32) set. */
static void ref_q3_K(const block_q3_K *b, double *y)
{
    for (int e = 0; e < 256; e++) {
        int j = e / 16;
        int lo = j < 8 ? b->scales[j] % 16 : b->scales[j - 8] / 16, hi = (b->scales[8 + j % 4] >> (2 * (j / 4))) % 4;
        int q = q2_bits(b->qs, e) - ((b->hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
        y[e] = h(b->d) * (lo + 16 * hi - 32) * q;
    }
}

/* Q5_K: Q4_K's scales and nibbles, plus bit (e / 32) of qh[e % 32] as 16. */
static void ref_q5_K(const block_q5_K *b, double *y)
{
    block_q4_K q4;
    double y4[256];
    memcpy(&q4.d, &b->d, 2);
    memcpy(&q4.dmin, &b->dmin, 2);
    memcpy(q4.scales, b->scales, sizeof q4.scales);
    memcpy(q4.qs, b->qs, sizeof q4.qs);
    ref_q4_K(&q4, y4);
    for (int e = 0; e < 256; e++) {
        int sb = e / 32, sc;
        if (sb < 4)
            sc = b->scales[sb] & 63;
        else
            sc = (b->scales[sb + 4] & 15) | ((b->scales[sb - 4] >> 6) << 4);
        y[e] = y4[e] + h(b->d) * sc * 16 * ((b->qh[e % 32] >> (e / 32)) & 1);
    }
}

static void ref_dequant(quant_type t, const void *blk, double *y)
{
    switch (t) {
    case QT_Q8_0: ref_q8_0(blk, y); break;
    case QT_Q4_0: ref_q4_0(blk, y); break;
    case QT_Q4_1: ref_q4_1(blk, y); break;
    case QT_Q5_0: ref_q5_0(blk, y); break;
    case QT_Q5_1: ref_q5_1(blk, y); break;
    case QT_Q2_K: ref_q2_K(blk, y); break;
    case QT_Q3_K: ref_q3_K(blk, y); break;
    case QT_Q4_K: ref_q4_K(blk, y); break;
    case QT_Q5_K: ref_q5_K(blk, y); break;
    case QT_Q6_K: ref_q6_K(blk, y); break;
    default: fail();
    }
}

/* Random quant bits with finite, realistic scales (a min of Q4_1/Q5_1
 * is a signed value). */
/* A block of random bytes with a sane scale; extreme: every quant at its
 * largest magnitude instead (Q8_0 -128, 4-bit 15, 5-bit 31, 6-bit 63,
 * Q4_K/Q5_K scales 63, Q6_K scales -1), where a kernel's narrow
 * intermediate sums would overflow. */
static void make_block(quant_type t, void *blk, int extreme)
{
    if (extreme)
        memset(blk, t == QT_Q8_0 ? 0x80 : 0xff, quant_block_bytes(t));
    else
        rand_bytes(blk, quant_block_bytes(t));
    switch (t) {
    case QT_Q8_0: ((block_q8_0 *)blk)->d = rand_f16_scale(); break;
    case QT_Q4_0: ((block_q4_0 *)blk)->d = rand_f16_scale(); break;
    case QT_Q5_0: ((block_q5_0 *)blk)->d = rand_f16_scale(); break;
    case QT_Q3_K: ((block_q3_K *)blk)->d = rand_f16_scale(); break;
    case QT_Q6_K: ((block_q6_K *)blk)->d = rand_f16_scale(); break;
    case QT_Q4_1:
        ((block_q4_1 *)blk)->d = rand_f16_scale();
        ((block_q4_1 *)blk)->m = (uint16_t)(rand_f16_scale() | (test_rng(&seed) & 1) << 15);
        break;
    case QT_Q5_1:
        ((block_q5_1 *)blk)->d = rand_f16_scale();
        ((block_q5_1 *)blk)->m = (uint16_t)(rand_f16_scale() | (test_rng(&seed) & 1) << 15);
        break;
    case QT_Q2_K: ((block_q2_K *)blk)->d = rand_f16_scale(); ((block_q2_K *)blk)->dmin = rand_f16_scale(); break;
    case QT_Q4_K: ((block_q4_K *)blk)->d = rand_f16_scale(); ((block_q4_K *)blk)->dmin = rand_f16_scale(); break;
    case QT_Q5_K: ((block_q5_K *)blk)->d = rand_f16_scale(); ((block_q5_K *)blk)->dmin = rand_f16_scale(); break;
    default: break;
    }
}

static void random_block(quant_type t, void *blk) { make_block(t, blk, 0); }

static const quant_type qtypes[] = {QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                                    QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K};
#define N_QTYPES (sizeof qtypes / sizeof *qtypes)

static void test_dequant_vs_f64(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        quant_type t = qtypes[ti];
        size_t be = quant_block_elems(t);
        uint8_t blk[512];
        float y[256];
        double r[256];
        for (int rep = 0; rep < 200; rep++) {
            random_block(t, blk);
            quant_dequantize_row(t, blk, y, be);
            ref_dequant(t, blk, r);
            for (size_t i = 0; i < be; i++)
                if (fabs(y[i] - r[i]) > 1e-6 * fabs(r[i]) + 1e-30)
                    fail_msg("%s elem %zu: %g vs %g", quant_type_name(t), i, y[i], r[i]);
        }
    }
}

static void test_f16_bf16(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) { /* every finite f16 round-trips */
        float f = quant_f16_to_f32((uint16_t)i);
        if (isfinite(f))
            assert_int_equal(quant_f32_to_f16(f), i);
    }
    assert_true(quant_f16_to_f32(quant_f32_to_f16(1e6f)) == INFINITY);
    assert_true(quant_f16_to_f32(0x3c00) == 1.0f);
    assert_true(quant_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_true(quant_f16_to_f32(quant_f32_to_f16(1.0f + ldexpf(1, -11))) == 1.0f); /* ties to even */
    assert_true(quant_bf16_to_f32(quant_f32_to_bf16(3.0f)) == 3.0f);
    assert_true(isnan(quant_bf16_to_f32(quant_f32_to_bf16(NAN))));
}

static void test_quant_roundtrip(void **state)
{
    (void)state;
    static const struct { quant_type t; double bound; } cases[] = {
        {QT_Q8_0, 0.01}, {QT_Q6_K, 0.04}, {QT_Q4_0, 0.12}, {QT_Q4_K, 0.12}, {QT_F16, 1e-3}, {QT_BF16, 5e-3},
        {QT_Q5_0, 0.06}, {QT_Q5_1, 0.06}, {QT_Q5_K, 0.06}, {QT_Q4_1, 0.12}, {QT_Q3_K, 0.25}, {QT_Q2_K, 0.5},
    };
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int i = 0; i < N; i++) x[i] = test_randf(&seed) * (i % 97 == 0 ? 4.0f : 1.0f);
        quant_quantize_row(cases[c].t, x, q, N);
        quant_dequantize_row(cases[c].t, q, y, N);
        double e = 0, s = 0;
        for (int i = 0; i < N; i++) { e += (x[i] - y[i]) * (double)(x[i] - y[i]); s += (double)x[i] * x[i]; }
        double rel = sqrt(e / s);
        if (rel > cases[c].bound)
            fail_msg("%s: relative RMS error %g > %g", quant_type_name(cases[c].t), rel, cases[c].bound);
    }
}

/* ---- kernels ------------------------------------------------------------- */

static void check_dot(const cpu_kernels *k, quant_type wt, int n)
{
    const cpu_act *act = k->act[wt];
    size_t wb = quant_row_bytes(wt, (size_t)n), ab = act->row_bytes(n);
    uint8_t *w = malloc(wb), *a = malloc(ab);
    float *x = malloc(sizeof(float) * (size_t)n), *wf = malloc(sizeof(float) * (size_t)n),
          *af = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) x[i] = test_randf(&seed);
    if (quant_block_elems(wt) > 1) {
        for (size_t b = 0; b < (size_t)n / quant_block_elems(wt); b++)
            random_block(wt, w + b * quant_block_bytes(wt));
    } else {
        float *tmp = malloc(sizeof(float) * (size_t)n);
        for (int i = 0; i < n; i++) tmp[i] = test_randf(&seed);
        quant_quantize_row(wt, tmp, w, (size_t)n);
        free(tmp);
    }
    act->quantize(x, a, n);
    quant_dequantize_row(wt, w, wf, (size_t)n);
    act->dequant(a, af, n);
    double ref = 0, mag = 0;
    for (int i = 0; i < n; i++) { ref += (double)wf[i] * af[i]; mag += fabs((double)wf[i] * af[i]); }
    float got = k->dot[wt](w, a, n);
    if (fabs(got - ref) > 1e-5 * mag + 1e-30)
        fail_msg("%s kernels, %s dot n=%d: %.9g vs float64 %.9g (sum|wx| %g)", k->name, quant_type_name(wt), n, got,
                 ref, mag);
    /* the activation format holds x to 8 bits per block: |x - x'| <= half a
     * step, plus up to 127 times the rounding of an f16-stored step */
    int blk = (int)quant_block_elems(wt);
    for (int b0 = 0; act->kind && b0 < n; b0 += blk) {
        float amax = 0;
        for (int i = b0; i < b0 + blk && i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int i = b0; i < b0 + blk && i < n; i++)
            if (fabsf(af[i] - x[i]) > amax * (0.5001f / 127.f + 5e-4f) + 1e-7f)
                fail_msg("%s activations for %s, elem %d: %g for %g", k->name, quant_type_name(wt), i, af[i], x[i]);
    }
    for (int width = 4; width <= 16; width *= 2) { /* tile kernels vs float64, per row */
        cpu_dot4_fn fn = width == 4 ? k->dot4[wt] : width == 8 ? k->dot8[wt] : k->dot16[wt];
        if (!fn)
            continue;
        uint8_t *rows = malloc(16 * ab), *tile = malloc(16 * ab);
        float out[16], *x8 = malloc(sizeof(float) * 16 * (size_t)n);
        for (int i = 0; i < 16 * n; i++) x8[i] = test_randf(&seed);
        for (int t = 0; t < width; t++) act->quantize(x8 + (size_t)t * n, rows + (size_t)t * ab, n);
        if (width >= 8 && act->quantize8) /* each tile holds the same values, reordered */
            for (int t0 = 0; t0 < width; t0 += 8) act->quantize8(x8 + (size_t)t0 * n, (size_t)n, 8, tile + (size_t)t0 * ab, n);
        else
            memcpy(tile, rows, 16 * ab);
        fn(w, tile, ab, n, out);
        for (int t = 0; t < width; t++) {
            double r4 = 0, m4 = 0;
            act->dequant(rows + (size_t)t * ab, af, n);
            for (int i = 0; i < n; i++) { r4 += (double)wf[i] * af[i]; m4 += fabs((double)wf[i] * af[i]); }
            if (fabs(out[t] - r4) > 1e-5 * m4 + 1e-30)
                fail_msg("%s %s dot%d row %d: %.9g vs float64 %.9g", k->name, quant_type_name(wt), width, t, out[t], r4);
            /* batch invariance: a token's result must not depend on whether
             * it went through a tile or alone (the engine relies on it) */
            float one = k->dot[wt](w, rows + (size_t)t * ab, n);
            if (memcmp(&one, &out[t], sizeof one))
                fail_msg("%s %s dot%d row %d: %.9g differs from the one-row kernel's %.9g", k->name,
                         quant_type_name(wt), width, t, out[t], one);
        }
        if (width == 8 && act->quantize8) { /* a zero-padded tile of 5 rows: same 5 results */
            act->quantize8(x8, (size_t)n, 5, tile, n);
            fn(w, tile, ab, n, out);
            for (int t = 0; t < 5; t++) {
                float one = k->dot[wt](w, rows + (size_t)t * ab, n);
                if (memcmp(&one, &out[t], sizeof one))
                    fail_msg("%s %s padded dot8 row %d: %.9g vs one-row %.9g", k->name, quant_type_name(wt), t, out[t], one);
            }
        }
        free(rows);
        free(tile);
        free(x8);
    }
    free(w); free(a); free(x); free(wf); free(af);
}

/* The gated MLP kernels vs float64 on the curved middle, the tails, tiny
 * and huge inputs: geglu within 3e-6 of |x u| / 2 (its tanh form's
 * error is relative to that, not to the tiny negative tail), swiglu
 * within 1e-6 of its own value (1e-35 absolute: the AVX2 set's 0 below
 * -87 is within 4e-36 of the truth, exp8's clamped e^88 is not); a NaN
 * in g or u, or swiglu's inf times 0, gives NaN as in the scalar set;
 * neither result depends on where a call starts or on writing over g. */
static void check_gated(const cpu_kernels *k)
{
    enum { NG = 203 };
    static float g[NG], u[NG], o[NG], o2[NG];
    for (int i = 0; i < NG; i++) {
        g[i] = i < 180 ? -12.0f + 24.0f * (float)i / 179.0f : (float[]){1e-8f, -1e-8f, 0.0f, 40.0f, -40.0f, 1e4f, -1e4f,
                                                                        1e30f, -1e30f, 3e-3f, -3e-3f, 0.5f, -60.0f, -80.0f, -87.5f, -88.5f}[i % 16];
        u[i] = test_randf(&seed) + 1.5f;
    }
    for (int swi = 0; swi < 2; swi++) {
        cpu_gated_fn fn = swi ? k->swiglu : k->geglu;
        const char *name = swi ? "swiglu" : "geglu";
        fn(g, u, o, NG);
        for (int off = 1; off < 8; off++) { /* a value's result does not depend on where its call starts */
            fn(g + off, u + off, o2, NG - off);
            if (memcmp(o2, o + off, sizeof(float) * (size_t)(NG - off)))
                fail_msg("%s %s: results depend on the call's start (offset %d)", k->name, name, off);
        }
        for (int i = 0; i < NG; i++) {
            double x = g[i], v = 0.7978845608028654 * (x + 0.044715 * x * x * x);
            double ref = swi ? x / (1 + exp(-x)) * u[i] : 0.5 * x * (1 + tanh(v)) * u[i];
            double tol = swi ? 1e-6 * fabs(ref) + 1e-35 : 3e-6 * fabs(0.5 * x * u[i]) + 1e-37;
            if (!(fabs(o[i] - ref) <= tol))
                fail_msg("%s %s(%g) * %g = %.9g, float64 %.9g", k->name, name, g[i], u[i], o[i], ref);
        }
        memcpy(o2, g, sizeof g); /* the forward pass writes the result over its gate */
        fn(o2, u, o2, NG);
        if (memcmp(o2, o, sizeof o))
            fail_msg("%s %s: writing over g changes the result", k->name, name);
        /* NaN in: NaN out (a fault upstream must show); swiglu far in its negative tail times inf, or at
         * -inf: NaN, as the scalar set's expf overflow gives */
        float bg[5] = {NAN, 1.0f, -100.0f, -100.0f, -INFINITY}, bu[5] = {1.0f, NAN, NAN, INFINITY, 1.0f}, bo[5];
        fn(bg, bu, bo, swi ? 5 : 2);
        for (int i = 0; i < (swi ? 5 : 2); i++)
            if (!isnan(bo[i]))
                fail_msg("%s %s(%g) * %g = %g, not NaN", k->name, name, bg[i], bu[i], bo[i]);
    }
}

/* A set's packed tiles for weight type wt, rows x cols, against float64
 * sums of the same decoded operands, on every token count up to 19
 * (extreme: make_block's extreme weights, every activation +-127); a
 * token's results equal, bit for bit, those it gets alone and those of a
 * call for part of the groups (batch invariance: the engine relies on
 * it), and no row past the weight's is written. */
static void check_packed(const cpu_kernels *k, quant_type wt, int rows, int cols, int extreme)
{
    enum { MAXT = 19 };
    const cpu_pack *pk = k->pack[wt];
    const cpu_act *act = pk->act;
    size_t wb = quant_row_bytes(wt, (size_t)cols), ab = act->row_bytes(cols), ys = (size_t)rows + 3;
    long groups = (rows + pk->group - 1) / pk->group;
    uint8_t *w = malloc(wb * (size_t)rows), *a = malloc(ab * (MAXT + 8)), *pw = malloc(pk->bytes(rows, cols));
    float *x = malloc(sizeof(float) * (size_t)cols * MAXT), *wf = malloc(sizeof(float) * (size_t)cols * (size_t)rows),
          *af = malloc(sizeof(float) * (size_t)cols), *y = malloc(sizeof(float) * ys * MAXT),
          *y1 = malloc(sizeof(float) * ys * MAXT);
    for (size_t b = 0; b < wb * (size_t)rows / quant_block_bytes(wt); b++)
        make_block(wt, w + b * quant_block_bytes(wt), extreme);
    for (int r = 0; r < rows; r++) quant_dequantize_row(wt, w + (size_t)r * wb, wf + (size_t)r * cols, (size_t)cols);
    for (int i = 0; i < cols * MAXT; i++)
        x[i] = extreme ? (i / cols % 2 ? -1.0f : 1.0f) : test_randf(&seed) * (i % 37 == 0 ? 30.0f : 1.0f);
    uint8_t *ar = malloc(ab * MAXT); /* each token in row format: what it is alone */
    for (int t = 0; t < MAXT; t++) act->quantize(x + (size_t)t * cols, ar + (size_t)t * ab, cols);
    for (int t = 0; t < MAXT; t++) { /* the tiles' format holds x to half a step of its block's scale */
        act->dequant(ar + (size_t)t * ab, af, cols);
        for (int b0 = 0; b0 < cols; b0 += 32) {
            float amax = 0;
            for (int i = b0; i < b0 + 32; i++) amax = fmaxf(amax, fabsf(x[(size_t)t * cols + i]));
            for (int i = b0; i < b0 + 32; i++)
                if (fabsf(af[i] - x[(size_t)t * cols + i]) > amax * (0.5001f / 127.f) + 1e-7f)
                    fail_msg("%s packed %s activations, token %d elem %d: %g for %g", k->name, quant_type_name(wt), t,
                             i, af[i], x[(size_t)t * cols + i]);
        }
    }
    size_t pbytes = pk->bytes(rows, cols);
    memset(pw, 0xa5, pbytes);
    pk->pack(w, wb, rows, cols, 0, groups / 2, pw); /* in two calls, as threads do */
    for (size_t i = pbytes * (size_t)(groups / 2) / (size_t)groups; i < pbytes; i++)
        if (pw[i] != 0xa5)
            fail_msg("%s packed %s: packing groups [0, %ld) wrote byte %zu of %zu", k->name, quant_type_name(wt),
                     groups / 2, i, pbytes);
    pk->pack(w, wb, rows, cols, groups / 2, groups, pw);
    for (int n = 1; n <= MAXT; n += n < 9 ? 1 : 5) {
        int tiled = cpu_act_tiled(act, n); /* the backend's conversion: 8-row tiles, then rows */
        for (int t = 0; t < tiled; t += 8)
            act->quantize8(x + (size_t)t * cols, (size_t)cols, n - t < 8 ? n - t : 8, a + (size_t)t * ab, cols);
        memcpy(a + (size_t)tiled * ab, ar + (size_t)tiled * ab, (size_t)(n > tiled ? n - tiled : 0) * ab);
        for (size_t i = 0; i < ys * MAXT; i++) y[i] = y1[i] = -7.0f;
        pk->gemm(pw, rows, cols, 0, groups, a, ab, n, y, ys);
        for (int t = 0; t < n; t++) {
            act->dequant(ar + (size_t)t * ab, af, cols);
            for (int r = 0; r < rows; r++) {
                double ref = 0, mag = 0;
                for (int i = 0; i < cols; i++) {
                    ref += (double)wf[(size_t)r * cols + i] * af[i];
                    mag += fabs((double)wf[(size_t)r * cols + i] * af[i]);
                }
                if (fabs(y[(size_t)t * ys + (size_t)r] - ref) > 1e-5 * mag + 1e-30)
                    fail_msg("%s packed %s %dx%d, %d tokens, token %d row %d: %.9g vs float64 %.9g", k->name,
                             quant_type_name(wt), rows, cols, n, t, r, y[(size_t)t * ys + (size_t)r], ref);
            }
            for (size_t r = (size_t)rows; r < ys; r++)
                if (y[(size_t)t * ys + r] != -7.0f)
                    fail_msg("%s packed %s: row %zu written past the weight's %d rows", k->name, quant_type_name(wt), r, rows);
        }
        for (size_t i = (size_t)n * ys; i < ys * MAXT; i++)
            if (y[i] != -7.0f)
                fail_msg("%s packed %s: %d tokens wrote token %zu", k->name, quant_type_name(wt), n, i / ys);
        for (int t = 0; t < n; t++) /* alone, in two group ranges */
            for (long g = 0; g < groups; g += (groups + 1) / 2) {
                long g1 = g + (groups + 1) / 2 < groups ? g + (groups + 1) / 2 : groups;
                pk->gemm(pw, rows, cols, g, g1, ar + (size_t)t * ab, ab, 1, y1 + (size_t)t * ys, ys);
            }
        if (memcmp(y, y1, sizeof(float) * ys * (size_t)n))
            fail_msg("%s packed %s %dx%d: %d tokens together differ from each alone", k->name, quant_type_name(wt), rows,
                     cols, n);
    }
    free(w); free(a); free(ar); free(pw); free(x); free(wf); free(af); free(y); free(y1);
}

/* K/V rows read in place in their stored type (F16, Q8_0) round exactly
 * like the floats the set's to_f32 conversion gives: a row's attention must
 * not depend on whether its batch converted the block. Rows are whole KV
 * rows of several heads; the head read starts one block in (unaligned). */
static void check_attn_kv(const cpu_kernels *k, quant_type t, int hd)
{
    enum { ROWS = 19, ELEMS = 192, HEAD0 = 32 };
    static float q[ELEMS], src[ELEMS], conv[ROWS * ELEMS], w[ROWS], o0[ELEMS], o1[ELEMS], o2[ELEMS], d1[ROWS], d2[ROWS];
    static char raw[ROWS * ELEMS * sizeof(float)];
    assert_true(HEAD0 + hd <= ELEMS);
    /* the scalar set has both for every K/V type that can be read in place; a SIMD set fills both or neither */
    assert_true(k != cpu_kernels_scalar() || (k->attn_dots_kv[t] && k->attn_wsum_kv[t]));
    assert_true(!k->attn_dots_kv[t] == !k->attn_wsum_kv[t]);
    if (!k->attn_dots_kv[t])
        return;
    size_t rb = quant_row_bytes(t, ELEMS), off = quant_row_bytes(t, HEAD0);
    for (int i = 0; i < ELEMS; i++) { q[i] = test_randf(&seed); o0[i] = test_randf(&seed); }
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < ELEMS; i++) src[i] = test_randf(&seed) * (r == 3 ? 1e-3f : 4.0f);
        quant_quantize_row(t, src, raw + (size_t)r * rb, ELEMS);
        k->to_f32[t](raw + (size_t)r * rb, conv + (size_t)r * ELEMS, ELEMS);
        w[r] = test_randf(&seed);
    }
    memcpy(o1, o0, sizeof o1);
    memcpy(o2, o0, sizeof o2);
    k->attn_dots(q, conv + HEAD0, ELEMS, ROWS, hd, 0.125f, d1);
    k->attn_dots_kv[t](q, raw + off, rb, ROWS, hd, 0.125f, d2);
    k->attn_wsum(o1, w, conv + HEAD0, ELEMS, ROWS, hd);
    k->attn_wsum_kv[t](o2, w, raw + off, rb, ROWS, hd);
    if (memcmp(d1, d2, sizeof d1) || memcmp(o1, o2, sizeof o1))
        fail_msg("%s: %s attention kernels differ from float ones on the same values (hd=%d)", k->name,
                 quant_type_name(t), hd);
}

/* The query's rounding for integer scores (cpu_q8q_quantize): each value
 * within d / 2 of d * qs, |qs| <= 127, the largest at +-127; scales past
 * f16's range both ways kept; a block with a NaN or an infinity gets d NaN
 * (its scores NaN, as float scores would be); zeros give d 0. */
static void test_q8q_quantize(void **state)
{
    (void)state;
    static const float mags[] = {1.0f, 3e9f, 1e-9f, 1e-39f /* subnormal */, 0.0f};
    float x[2 * QK8_0];
    cpu_q8q b[2];
    for (size_t m = 0; m < sizeof mags / sizeof *mags; m++) {
        for (int i = 0; i < 2 * QK8_0; i++) x[i] = test_randf(&seed) * mags[m];
        cpu_q8q_quantize(x, b, 2 * QK8_0);
        for (int k = 0; k < 2; k++) {
            int top = 0;
            for (int i = 0; i < QK8_0; i++) {
                float v = x[k * QK8_0 + i];
                top |= b[k].qs[i] == 127 || b[k].qs[i] == -127;
                if (b[k].qs[i] < -127 || fabs((double)b[k].d * b[k].qs[i] - v) > 0.5000001 * b[k].d + 1e-45)
                    fail_msg("cpu_q8q_quantize: %g as %g * %d", (double)v, (double)b[k].d, b[k].qs[i]);
            }
            if (mags[m] > 0 && !top)
                fail_msg("cpu_q8q_quantize: block %d at scale %g never reaches 127", k, (double)mags[m]);
            if (mags[m] == 0 && b[k].d != 0)
                fail_msg("cpu_q8q_quantize: zeros get d %g", (double)b[k].d);
        }
    }
    x[5] = NAN;
    x[QK8_0 + 3] = INFINITY;
    cpu_q8q_quantize(x, b, 2 * QK8_0);
    if (!isnan(b[0].d) || !isnan(b[1].d))
        fail_msg("cpu_q8q_quantize: a block with NaN or inf gets d %g, %g (want NaN)", (double)b[0].d, (double)b[1].d);
}

/* Q8_0 K scored in integers (attn_dots_q8q) against float64 sums of the
 * same decoded operands (the query rounded by cpu_q8q_quantize, as
 * cpu_attention rounds it): per block d_q d_k (q . k), exact in float64.
 * Every score alone (one head, one row) equals it among 19 rows and 5
 * heads bit for bit: a row's score must not depend on its tile or group.
 * Rows are whole KV rows of 3 heads, the one read starting a head in, in
 * a buffer of exactly the 19 rows (a row read past them is ASan's); head
 * sizes up to CPU_ATTN_Q8Q_HD, odd block counts included. One head's
 * query is far past f16's range (its scores must stay finite), one holds
 * a NaN (its scores must be NaN). */
static void check_attn_q8q(const cpu_kernels *k)
{
    enum { ROWS = 19, NH = 5, OS = ROWS + 3, HUGE_H = 2, NAN_H = 4 };
    const float unset = -7.0f; /* in the gap between heads' score rows: must stay */
    static float x[3 * CPU_ATTN_Q8Q_HD], qf[NH * CPU_ATTN_Q8Q_HD];
    static float dkf[ROWS][CPU_ATTN_Q8Q_HD], outs[NH * OS], one[1];
    static cpu_q8q q8[NH * CPU_ATTN_Q8Q_HD / QK8_0];
    if (!k->attn_dots_q8q)
        return;
    for (int hd = 32; hd <= CPU_ATTN_Q8Q_HD; hd += 32) {
        int nb = hd / QK8_0;
        size_t rb = quant_row_bytes(QT_Q8_0, (size_t)(3 * hd));
        char *kr = malloc((size_t)ROWS * rb);
        assert_non_null(kr);
        for (int r = 0; r < ROWS; r++) {
            for (int i = 0; i < 3 * hd; i++) x[i] = test_randf(&seed) * (r == 5 ? 1e-3f : 3.0f) * (i % 37 == 0 ? 8.0f : 1.0f);
            quant_quantize_row(QT_Q8_0, x, kr + (size_t)r * rb, (size_t)(3 * hd));
            quant_dequantize_row(QT_Q8_0, kr + (size_t)r * rb + quant_row_bytes(QT_Q8_0, (size_t)hd), dkf[r], (size_t)hd);
        }
        for (int i = 0; i < NH * hd; i++)
            qf[i] = test_randf(&seed) * (i % 29 == 0 ? 6.0f : 1.0f) * (i / hd == HUGE_H ? 1e12f : 1.0f);
        qf[NAN_H * hd + hd / 2] = NAN;
        cpu_q8q_quantize(qf, q8, NH * hd);
        for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) outs[i] = unset;
        const char *k0 = kr + quant_row_bytes(QT_Q8_0, (size_t)hd);
        k->attn_dots_q8q(q8, NH, k0, rb, ROWS, hd, 0.125f, outs, OS);
        for (int h = 0; h < NH; h++)
            for (int r = 0; r < ROWS; r++) {
                double ref = 0, mag = 0;
                for (int d = 0; d < hd; d++) {
                    const cpu_q8q *b = &q8[(h * hd + d) / QK8_0];
                    double p = (double)b->d * b->qs[d % QK8_0] * dkf[r][d];
                    ref += p;
                    mag += fabs(p);
                }
                float got = outs[h * OS + r];
                if (h == NAN_H ? !isnan(got) : !(fabs(got - 0.125 * ref) <= 1e-6 * 0.125 * mag))
                    fail_msg("%s attn_dots_q8q hd=%d head %d row %d: %.9g vs float64 %.9g", k->name, hd, h, r, got,
                             0.125 * ref);
                k->attn_dots_q8q(q8 + h * nb, 1, k0 + (size_t)r * rb, rb, 1, hd, 0.125f, one, 1);
                if (memcmp(one, &got, sizeof got))
                    fail_msg("%s attn_dots_q8q hd=%d head %d row %d: %.9g alone, %.9g among others", k->name, hd, h, r,
                             one[0], got);
            }
        for (int h = 0; h < NH; h++)
            for (int i = ROWS; i < OS; i++)
                if (outs[h * OS + i] != unset)
                    fail_msg("%s attn_dots_q8q hd=%d wrote past its %d rows", k->name, hd, ROWS);
        free(kr);
    }
}

/* attn_wsum_heads over 1 to 7 heads (tiles of 4, 2 and 1) equals
 * attn_wsum head by head bit for bit, and writes no dimension >= hd. */
static void check_wsum_heads(const cpu_kernels *k, int hd)
{
    enum { ROWS = 19, STRIDE = 150, NH = 7, OS = 160, WS = 23 };
    static float v[ROWS * STRIDE], w[NH * WS], o1[NH * OS], o2[NH * OS];
    if (!k->attn_wsum_heads)
        return;
    for (int i = 0; i < ROWS * STRIDE; i++) v[i] = test_randf(&seed);
    for (int i = 0; i < NH * WS; i++) w[i] = test_randf(&seed);
    for (int nh = 1; nh <= NH; nh++) {
        for (int i = 0; i < NH * OS; i++) o1[i] = o2[i] = test_randf(&seed);
        for (int h = 0; h < nh; h++) k->attn_wsum(o1 + h * OS, w + h * WS, v, STRIDE, ROWS, hd);
        k->attn_wsum_heads(o2, OS, w, WS, nh, v, STRIDE, ROWS, hd);
        if (memcmp(o1, o2, sizeof o1))
            fail_msg("%s attn_wsum_heads hd=%d heads=%d differs from attn_wsum head by head", k->name, hd, nh);
    }
}

static void run_kernel_set(const cpu_kernels *k)
{
    static const quant_type all[] = {QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                                     QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        /* every loadable type has a scalar kernel; a SIMD set may leave one
         * to it (the backend then uses the scalar set's kernel and format) */
        if (!k->dot[all[i]]) {
            assert_ptr_not_equal(k, cpu_kernels_scalar());
            continue;
        }
        int be = (int)quant_block_elems(all[i]);
        int sizes_f[] = {1, 7, 33, 257, 1031}, sizes_b[] = {1, 3, 7, 11};
        for (int s = 0; s < (be == 1 ? 5 : 4); s++) check_dot(k, all[i], be == 1 ? sizes_f[s] : sizes_b[s] * be);
        /* (rows, blocks): partial, single and odd groups; > 4096 columns (the tile conversion's chunks) */
        static const int shapes[][2] = {{1, 1}, {15, 3}, {16, 1}, {17, 9}, {50, 2}, {64, 40}, {5, 130}};
        for (size_t s = 0; k->pack[all[i]] && s < sizeof shapes / sizeof *shapes; s++)
            check_packed(k, all[i], shapes[s][0], shapes[s][1] * be, 0);
        if (k->pack[all[i]])
            check_packed(k, all[i], 17, 9 * be, 1);
    }
    for (int hd = 4; hd <= 136; hd += 12) { /* attention helpers over a block of rows */
        enum { ROWS = 19, STRIDE = 150 };
        static float q[STRIDE], kv[ROWS * STRIDE], w[ROWS], o[STRIDE], o0[STRIDE], dots[ROWS];
        for (int i = 0; i < STRIDE; i++) { q[i] = test_randf(&seed); o[i] = o0[i] = test_randf(&seed); }
        for (int i = 0; i < ROWS * STRIDE; i++) kv[i] = test_randf(&seed);
        for (int i = 0; i < ROWS; i++) w[i] = test_randf(&seed);
        k->attn_dots(q, kv, STRIDE, ROWS, hd, 0.125f, dots);
        k->attn_wsum(o, w, kv, STRIDE, ROWS, hd);
        check_attn_kv(k, QT_F16, hd);
        check_wsum_heads(k, hd);
        for (int i = 0; i < ROWS; i++) {
            double ref = 0, mag = 0;
            for (int d = 0; d < hd; d++) { ref += (double)q[d] * kv[i * STRIDE + d]; mag += fabs((double)q[d] * kv[i * STRIDE + d]); }
            if (fabs(dots[i] - 0.125 * ref) > 1e-6 * mag)
                fail_msg("%s attn_dots hd=%d row %d: %g vs %g", k->name, hd, i, dots[i], 0.125 * ref);
        }
        for (int d = 0; d < STRIDE; d++) {
            double ref = o0[d], mag = fabs(o0[d]);
            for (int i = 0; d < hd && i < ROWS; i++) { ref += (double)w[i] * kv[i * STRIDE + d]; mag += fabs((double)w[i] * kv[i * STRIDE + d]); }
            if (fabs(o[d] - ref) > 1e-6 * mag)
                fail_msg("%s attn_wsum hd=%d dim %d: %g vs %g (must not touch dims >= hd)", k->name, hd, d, o[d], ref);
        }
    }
    for (int hd = 32; hd <= 128; hd += 32) /* Q8_0 K/V: whole blocks; 128: two 64-wide register passes */
        check_attn_kv(k, QT_Q8_0, hd);
    check_attn_q8q(k);
    check_gated(k);
    { /* attention's softmax vs float64: short and long rows, spread scores, one far above the rest */
        static const int lens[] = {1, 2, 7, 8, 9, 33, 1000, 1031};
        static float x[1031], x0[1031];
        for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
            int len = lens[l];
            for (int i = 0; i < len; i++) x[i] = x0[i] = 12.0f * test_randf(&seed) + (i == len / 3 ? 40.0f : 0.0f);
            k->softmax(x, len);
            double mx = -INFINITY, sum = 0, total = 0;
            for (int i = 0; i < len; i++) mx = x0[i] > mx ? x0[i] : mx;
            for (int i = 0; i < len; i++) sum += exp((double)x0[i] - mx);
            for (int i = 0; i < len; i++) {
                double ref = exp((double)x0[i] - mx) / sum;
                total += x[i];
                if (!(fabs(x[i] - ref) <= 1e-5 * ref + 1e-30))
                    fail_msg("%s softmax n=%d [%d]: %.9g, float64 %.9g", k->name, len, i, x[i], ref);
            }
            if (fabs(total - 1.0) > 1e-5)
                fail_msg("%s softmax n=%d sums to %.9g", k->name, len, total);
        }
    }
    for (int n = 1; n < 70; n += 3) { /* float helpers */
        float a[80], b[80], y[80], y0[80];
        double ref = 0, mag = 0;
        for (int i = 0; i < n; i++) { a[i] = test_randf(&seed); b[i] = test_randf(&seed); y[i] = y0[i] = test_randf(&seed); }
        for (int i = 0; i < n; i++) { ref += (double)a[i] * b[i]; mag += fabs((double)a[i] * b[i]); }
        assert_true(fabs(k->dot_f32(a, b, n) - ref) <= 1e-6 * mag + 1e-30);
        k->axpy(y, 0.5f, a, n);
        for (int i = 0; i < n; i++) assert_true(fabs(y[i] - (y0[i] + 0.5 * a[i])) < 1e-6);
    }
}

static void test_kernels_scalar(void **state)
{
    (void)state;
    run_kernel_set(cpu_kernels_scalar());
}

static void run_simd(const cpu_kernels *k, const char *what)
{
    if (!k) {
        print_message("skipped: this CPU or build has no %s\n", what);
        skip();
    }
    run_kernel_set(k);
}

/* A matmul group whose weights need different activation formats (a
 * Q4_K_M file's Q4_K next to a Q8_0 or Q5_0 fallback) equals the same
 * matmuls made one by one, bit for bit, on every kernel set and batch size.
 * Regression: the second format's conversion could move the buffer that
 * held the first (a use after free that gave NaN logits on Gemma 3). */
static void test_mixed_group(void **state)
{
    (void)state;
    enum { COLS = 512, ROWS = 40, MAXT = 17 };
    static const quant_type groups[][3] = {{QT_Q4_K, QT_Q8_0, QT_Q8_0}, {QT_Q5_0, QT_Q5_0, QT_Q8_0},
                                           {QT_Q8_0, QT_Q4_K, QT_Q5_1}, {QT_Q5_0, QT_Q4_K, QT_Q8_0}};
    static float x[MAXT * COLS], w[ROWS * COLS], yg[3][MAXT * ROWS], y1[MAXT * ROWS];
    static uint8_t q[3][ROWS * COLS * 2];
    for (int i = 0; i < MAXT * COLS; i++) x[i] = test_randf(&seed) * (i % 61 == 0 ? 50.0f : 1.0f);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = test_randf(&seed);
    for (const cpu_kernels *const *ks = cpu_kernels_all(); *ks; ks++) {
        llm_backend *b;
        llm_error err = {0};
        assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2, .kernels = (*ks)->name}, &b, &err), 0);
        for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
            llm_weight wt[3];
            for (int k = 0; k < 3; k++) {
                size_t rb = quant_row_bytes(groups[g][k], COLS);
                for (int r = 0; r < ROWS; r++) quant_quantize_row(groups[g][k], w + (size_t)r * COLS, q[k] + r * rb, COLS);
                wt[k] = (llm_weight){groups[g][k], ROWS, COLS, rb, q[k], NULL};
            }
            for (int n = 1; n <= MAXT; n += 4) {
                llm_matmul ops[3] = {{&wt[0], yg[0]}, {&wt[1], yg[1]}, {&wt[2], yg[2]}};
                assert_int_equal(llm_backend_matmul_group(b, ops, 3, x, n), 0);
                for (int k = 0; k < 3; k++) {
                    assert_int_equal(llm_backend_matmul(b, &wt[k], x, n, y1), 0);
                    if (memcmp(y1, yg[k], sizeof(float) * (size_t)n * ROWS))
                        fail_msg("%s kernels, group %zu (%s), %d tokens: weight %d differs from its matmul alone",
                                 (*ks)->name, g, quant_type_name(groups[g][k]), n, k);
                }
            }
        }
        llm_backend_free(b);
    }
}

/* The backend's copy of a model (model_upload) on the avx512 set: a
 * matrix repeated in every layer (a tied or hostile file's shared tensor)
 * is packed once and the copies are counted in `used` until release; a
 * file whose matrices' bytes overlap without being equal runs unpacked
 * (no copy: a small file must not cost the memory of a large one); a
 * packed matmul gives the same rows as the unpacked one within 1e-5 of
 * their magnitude. */
static void test_packed_upload(void **state)
{
    (void)state;
    if (!cpu_kernels_avx512()) {
        print_message("skipped: this CPU or build has no avx512 kernel set\n");
        skip();
    }
    enum { ROWS = 48, COLS = 256, LAYERS = 6, NT = 5 };
    size_t rb = quant_row_bytes(QT_Q8_0, COLS);
    static uint8_t q[(ROWS + 1) * COLS * 2], out_q[ROWS * COLS * 2];
    static float wf[ROWS * COLS], x[NT * COLS], y_packed[NT * ROWS], y_plain[NT * ROWS];
    for (int i = 0; i < ROWS * COLS; i++) wf[i] = test_randf(&seed);
    for (int i = 0; i < NT * COLS; i++) x[i] = test_randf(&seed);
    for (int r = 0; r < ROWS; r++) {
        quant_quantize_row(QT_Q8_0, wf + (size_t)r * COLS, q + r * rb, COLS);
        quant_quantize_row(QT_Q8_0, wf + (size_t)r * COLS, out_q + r * rb, COLS);
    }
    llm_weight w = {QT_Q8_0, ROWS, COLS, rb, q, NULL};
    llm_layer layers[LAYERS];
    memset(layers, 0, sizeof layers);
    for (int l = 0; l < LAYERS; l++) layers[l].wq = layers[l].wk = layers[l].wv = layers[l].wo = w;
    llm_model m;
    memset(&m, 0, sizeof m);
    m.hp.n_layer = LAYERS;
    m.layers = layers;
    m.output = (llm_weight){QT_Q8_0, ROWS, COLS, rb, out_q, NULL};
    m.tok_embd = (llm_weight){QT_Q8_0, ROWS, COLS, rb, out_q, NULL}; /* tied */
    snprintf(m.name, sizeof m.name, "shared-tensors");
    llm_backend *b;
    llm_error err = {0};
    assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2, .kernels = "avx512"}, &b, &err), 0);
    llm_backend_mem before, after;
    llm_backend_mem_stats(b, &before);
    llm_model *dev = NULL;
    assert_int_equal(b->iface->model_upload(b, &m, &dev, &err), 0);
    assert_non_null(dev);
    llm_backend_mem_stats(b, &after);
    size_t one = (cpu_kernels_avx512()->pack[QT_Q8_0]->bytes(ROWS, COLS) + 63) / 64 * 64;
    if (after.used - before.used != 2 * one) /* the repeated matrix once, the output once */
        fail_msg("packed copies take %zu bytes; want %zu (one per distinct matrix)", after.used - before.used, 2 * one);
    assert_ptr_equal(dev->layers[LAYERS - 1].wo.packed, dev->layers[0].wq.packed);
    assert_null(m.layers[0].wq.packed); /* the host model is not written */
    assert_int_equal(llm_backend_matmul(b, &dev->layers[3].wv, x, NT, y_packed), 0);
    assert_int_equal(llm_backend_matmul(b, &w, x, NT, y_plain), 0);
    for (int i = 0; i < NT * ROWS; i++)
        if (fabsf(y_packed[i] - y_plain[i]) > 1e-5f * (fabsf(y_plain[i]) + 1.0f))
            fail_msg("packed row %d: %g vs unpacked %g", i, y_packed[i], y_plain[i]);
    b->iface->model_release(b, dev);
    llm_backend_mem_stats(b, &after);
    assert_int_equal(after.used, before.used);
    layers[2].wk.data = q + rb; /* overlaps layer 0's rows 1.. without being the same matrix */
    assert_int_equal(b->iface->model_upload(b, &m, &dev, &err), 0);
    assert_null(dev);
    llm_backend_mem_stats(b, &after);
    assert_int_equal(after.used, before.used);
    llm_backend_free(b);
    /* cpu_pack on: what would run unpacked fails the load instead, naming why */
    assert_int_equal(
        llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2, .kernels = "avx512", .pack = LLM_CPU_PACK_ON}, &b, &err), 0);
    assert_int_equal(b->iface->model_upload(b, &m, &dev, &err), LLM_ERR_NOMEM);
    assert_null(dev);
    assert_non_null(strstr(err.msg, "overlap"));
    layers[2].wk.data = q;
    assert_int_equal(b->iface->model_upload(b, &m, &dev, &err), 0);
    assert_non_null(dev);
    b->iface->model_release(b, dev);
    llm_backend_free(b);
    /* off: never packed */
    assert_int_equal(
        llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2, .kernels = "avx512", .pack = LLM_CPU_PACK_OFF}, &b, &err), 0);
    assert_int_equal(b->iface->model_upload(b, &m, &dev, &err), 0);
    assert_null(dev);
    llm_backend_free(b);
    assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.pack = (llm_cpu_pack)7}, &b, &err), LLM_ERR_INVALID_ARG);
}

static void test_kernels_avx2(void **state) { (void)state; run_simd(cpu_kernels_avx2(), "AVX2/FMA"); }
static void test_kernels_avxvnni(void **state) { (void)state; run_simd(cpu_kernels_avxvnni(), "AVX-VNNI"); }
static void test_kernels_vnni(void **state) { (void)state; run_simd(cpu_kernels_vnni(), "AVX512-VNNI"); }
static void test_kernels_avx512(void **state)
{
    (void)state;
    run_simd(cpu_kernels_avx512(), "AVX-512 F/BW/VL/VNNI");
}

int main(void)
{
    quant_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_bf16),
        cmocka_unit_test(test_dequant_vs_f64),
        cmocka_unit_test(test_quant_roundtrip),
        cmocka_unit_test(test_q8q_quantize),
        cmocka_unit_test(test_kernels_scalar),
        cmocka_unit_test(test_kernels_avx2),
        cmocka_unit_test(test_kernels_avxvnni),
        cmocka_unit_test(test_kernels_vnni),
        cmocka_unit_test(test_kernels_avx512),
        cmocka_unit_test(test_mixed_group),
        cmocka_unit_test(test_packed_upload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
