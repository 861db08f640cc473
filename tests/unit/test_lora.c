/* test_lora.c - LoRA adapters (lora.h): llama.cpp's GGUF format read and
 * checked against the "tiny" base (n_embd 256, n_ff 512, 2 layers, K/V
 * 128 wide), B (A x) against a float64 reference, and every refusal. */
#include <math.h>

#include "llm/gguf_writer.h"
#include "llm/lora.h"
#include "testutil.h"

typedef struct spec {
    const char *arch, *gtype, *atype;
    double alpha;      /* NAN: no key */
    int rank;
    quant_type qt;
    const char *only;  /* write this tensor name alone (with its pair's shape rules ignored) */
    int wide_a;        /* A of attn_q has ne0 128, not 256 */
    int nan;           /* a NaN in the first A */
    int k_rank;        /* rank of attn_k's pair (0: rank) */
    int a_only;        /* attn_q without its lora_b */
} spec;

typedef struct tens {
    char name[96];
    uint64_t ne[2];
    quant_type qt;
    int nan;
} tens;

typedef struct writing {
    tens t[64];
    int n;
} writing;

/* The value of element e of tensor i: the same on reading back. */
static float val(int i, size_t e)
{
    uint64_t s = (uint64_t)i * 1000003u + e;
    return test_randf(&s) * 0.1f;
}

static int fill(void *ctx, int i, void *dst, size_t nbytes)
{
    writing *w = ctx;
    tens *t = &w->t[i];
    size_t cols = (size_t)t->ne[0], rb = quant_row_bytes(t->qt, cols);
    float *row = malloc(cols * sizeof *row);
    if (!row)
        return -1;
    for (size_t r = 0; r < t->ne[1]; r++) {
        for (size_t c = 0; c < cols; c++) row[c] = val(i, r * cols + c);
        if (t->nan && r == 0)
            row[0] = NAN;
        quant_quantize_row(t->qt, row, (char *)dst + r * rb, cols);
    }
    free(row);
    (void)nbytes;
    return 0;
}

static void add(writing *w, gguf_writer *g, const char *name, uint64_t ne0, uint64_t ne1, quant_type qt, int nan)
{
    tens *t = &w->t[w->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ne[0] = ne0, t->ne[1] = ne1, t->qt = qt, t->nan = nan;
    assert_int_equal(gguf_writer_tensor(g, name, qt, 2, t->ne), LLM_OK);
}

static const char *const projs[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
static const int outs[] = {256, 128, 128, 256, 512, 512, 256}, ins[] = {256, 256, 256, 256, 256, 256, 512};

static void write_adapter(const spec *s, const char *path)
{
    gguf_writer *g = gguf_writer_new();
    static writing w;
    memset(&w, 0, sizeof w);
    assert_non_null(g);
    gguf_writer_str(g, "general.architecture", s->arch ? s->arch : "llama");
    gguf_writer_str(g, "general.type", s->gtype ? s->gtype : "adapter");
    gguf_writer_str(g, "adapter.type", s->atype ? s->atype : "lora");
    if (!isnan(s->alpha))
        gguf_writer_f32(g, "adapter.lora.alpha", (float)s->alpha);
    quant_type qt = s->qt ? s->qt : QT_F32;
    char name[96];
    if (s->only) {
        add(&w, g, s->only, 256, (uint64_t)s->rank, qt, 0);
    } else {
        for (int l = 0; l < 2; l++)
            for (int p = 0; p < 7; p++) {
                int r = p == 1 && s->k_rank ? s->k_rank : s->rank;
                snprintf(name, sizeof name, "blk.%d.%s.weight.lora_a", l, projs[p]);
                add(&w, g, name, (uint64_t)(s->wide_a && !p ? 128 : ins[p]), (uint64_t)r, qt, s->nan && !l && !p);
                if (s->a_only && !p)
                    continue;
                snprintf(name, sizeof name, "blk.%d.%s.weight.lora_b", l, projs[p]);
                add(&w, g, name, (uint64_t)r, (uint64_t)outs[p], qt, 0);
            }
    }
    llm_error err = {0};
    assert_int_equal(gguf_writer_write(g, path, fill, &w, &err), LLM_OK);
    gguf_writer_free(g);
}

static test_tiny tiny;

static int setup(void **state)
{
    (void)state;
    quant_init();
    return test_tiny_open(&tiny, "lora-base", QT_F32, 7, 1);
}

static int teardown(void **state)
{
    (void)state;
    test_tiny_close(&tiny);
    return 0;
}

static llm_status load(const spec *s, int max_rank, llm_lora **l, llm_error *err)
{
    char path[256];
    test_tmpfile("lora", path, sizeof path);
    write_adapter(s, path);
    llm_status st = llm_lora_load(path, tiny.m, max_rank, l, err);
    remove(path);
    return st;
}

/* n_rows rows of len values of tensor `tensor` as written (val) and
 * rounded by qt's row format equal at(m, row, col) for every one. */
static void rows_as_written(const llm_lora_mat *m, quant_type qt, int tensor, int n_rows, int len,
                            float (*at)(const llm_lora_mat *, int, int), const char *what)
{
    float row[512], deq[512];
    char q[4096];
    for (int r = 0; r < n_rows; r++) {
        for (int c = 0; c < len; c++) row[c] = val(tensor, (size_t)r * len + c);
        quant_quantize_row(qt, row, q, (size_t)len);
        quant_dequantize_row(qt, q, deq, (size_t)len);
        for (int c = 0; c < len; c++)
            if (at(m, r, c) != deq[c])
                fail_msg("%s: %s(%d, %d) is %g, the file's %g", quant_type_name(qt), what, r, c, at(m, r, c), deq[c]);
    }
}

/* m's values are the file's: A's rows (tensor ia: rank rows of in) and
 * B's (tensor ib: out rows of rank), read back through the accessors. */
static void stored_as_written(const llm_lora_mat *m, quant_type qt, int ia, int ib)
{
    rows_as_written(m, qt, ia, m->rank, m->in, llm_lora_mat_a_at, "A");
    rows_as_written(m, qt, ib, m->out, m->rank, llm_lora_mat_b_at, "B");
}

static void test_loads_and_applies(void **state)
{
    (void)state;
    llm_lora *l;
    llm_error err = {0};
    spec s = {.alpha = 16, .rank = 8};
    assert_int_equal(load(&s, 0, &l, &err), LLM_OK);
    assert_int_equal(l->n_mats, 14);
    assert_int_equal(l->max_rank, 8);
    const llm_lora_mat *m = llm_lora_mat_at(l, 1, LLM_LORA_DOWN);
    assert_int_equal(m->rank, 8);
    assert_int_equal(m->in, 512);
    assert_int_equal(m->out, 256);
    assert_true(fabsf(llm_lora_factor(l, m, 0.5f) - 1.0f) < 1e-7f); /* 0.5 * 16 / 8 */
    assert_null(llm_lora_mat_at(l, 2, LLM_LORA_Q));
    /* three rows of x: y += s B (A x), each row against float64 from the file's values
     * (blk.1.ffn_down's pair is tensors 26 and 27 in writing order) */
    uint64_t seed = 3;
    float x[3 * 512], y[3 * 256] = {0};
    for (int i = 0; i < 3 * 512; i++) x[i] = test_randf(&seed);
    llm_lora_apply(m, 2.0f, x, 3, y);
    for (int r = 0; r < 3; r++)
        for (int o = 0; o < 256; o++) {
            double want = 0;
            for (int k = 0; k < 8; k++) {
                double t = 0;
                for (int i = 0; i < 512; i++) t += (double)val(26, (size_t)k * 512 + i) * x[r * 512 + i];
                want += (double)val(27, (size_t)o * 8 + k) * t;
            }
            assert_true(fabs(y[r * 256 + o] - 2.0 * want) <= 1e-5 * (1 + fabs(2.0 * want)));
        }
    /* a row's answer does not depend on the rows beside it */
    float y1[256] = {0};
    llm_lora_apply(m, 2.0f, x + 512, 1, y1);
    assert_memory_equal(y1, y + 256, sizeof y1);
    llm_lora_free(l);
    /* no alpha: the factor is the request's scale; F16, BF16 and Q8_0 load, each value as the file holds it */
    quant_type types[] = {QT_F16, QT_BF16, QT_Q8_0};
    for (int i = 0; i < 3; i++) {
        spec t = {.alpha = NAN, .rank = 32, .qt = types[i]}; /* Q8_0 rows of B are rank long: 32 a block */
        assert_int_equal(load(&t, 0, &l, &err), LLM_OK);
        assert_true(llm_lora_factor(l, llm_lora_mat_at(l, 0, LLM_LORA_Q), 0.25f) == 0.25f);
        const llm_lora_mat *q = llm_lora_mat_at(l, 0, LLM_LORA_Q);
        assert_int_equal(q->a_type, types[i] == QT_F16 ? QT_F16 : QT_F32);
        assert_int_equal(q->b_type, q->a_type);
        stored_as_written(q, types[i], 0, 1);
        llm_lora_free(l);
    }
}

/* A random (rank x in) A and (rank x out) B transposed, of type t each. */
static llm_lora_mat hand_mat(int rank, int in, int out, quant_type ta, quant_type tb, uint64_t seed)
{
    llm_lora_mat m = {rank, in, out, ta, tb, malloc(quant_row_bytes(ta, (size_t)rank * in)),
                      malloc(quant_row_bytes(tb, (size_t)rank * out))};
    assert_non_null(m.a);
    assert_non_null(m.bt);
    void *p[2] = {m.a, m.bt};
    quant_type t[2] = {ta, tb};
    size_t n[2] = {(size_t)rank * in, (size_t)rank * out};
    for (int h = 0; h < 2; h++)
        for (size_t i = 0; i < n[h]; i++) {
            float v = test_randf(&seed) * 0.1f;
            if (t[h] == QT_F16)
                ((quant_f16 *)p[h])[i] = quant_f32_to_f16(v);
            else
                ((float *)p[h])[i] = v;
        }
    return m;
}

/* The CPU backend's lora op with every kernel set this CPU runs: F16,
 * F32 and mixed segments in one call equal llm_lora_apply on the same
 * matrices within float rounding, and rows alone equal them in the batch
 * bit for bit; in 200 / out 300 (the dot's and the weighted sum's tails)
 * and in 256 / out 700 (two strips, the second 188 wide). An F16 adapter
 * from a file keeps half an F32 one's bytes. */
static void test_backend_op_f32_f16(void **state)
{
    (void)state;
    llm_lora *l32, *l16;
    llm_error err = {0};
    spec a = {.alpha = 16, .rank = 8}, b = {.alpha = 16, .rank = 8, .qt = QT_F16};
    assert_int_equal(load(&a, 0, &l32, &err), LLM_OK);
    assert_int_equal(load(&b, 0, &l16, &err), LLM_OK);
    assert_int_equal(l16->bytes * 2, l32->bytes);
    llm_lora_free(l32);
    llm_lora_free(l16);
    static const char *const sets[] = {"scalar", "avx2", "avx512vnni", "avx512"};
    static const int shapes[2][2] = {{200, 300}, {256, 700}};
    enum { NR = 7 };
    static float x[NR * 256], y[NR * 700], y0[NR * 700], ref[NR * 700], one[700];
    for (int sh = 0; sh < 2; sh++) {
        int in = shapes[sh][0], out = shapes[sh][1];
        llm_lora_mat m[3] = {hand_mat(8, in, out, QT_F16, QT_F16, 1), hand_mat(8, in, out, QT_F32, QT_F32, 2),
                             hand_mat(5, in, out, QT_F16, QT_F32, 3)};
        /* rows 0-1 F16 at 0.5, row 2 none, rows 3-5 F32 at -1, row 6 mixed at 2 */
        llm_lora_seg sg[3] = {{0, 2, m[0].a, m[0].bt, 8, 0.5f, QT_F16, QT_F16},
                              {3, 3, m[1].a, m[1].bt, 8, -1.0f, QT_F32, QT_F32},
                              {6, 1, m[2].a, m[2].bt, 5, 2.0f, QT_F16, QT_F32}};
        for (size_t si = 0; si < sizeof sets / sizeof *sets; si++) {
            llm_backend *be;
            llm_cpu_config cfg = {.n_threads = 2, .kernels = sets[si]};
            if (llm_backend_cpu_new(&cfg, &be, &err))
                continue; /* this CPU lacks the set */
            uint64_t seed = 11 + (uint64_t)sh;
            for (int i = 0; i < NR * in; i++) x[i] = test_randf(&seed);
            for (int i = 0; i < NR * out; i++) y[i] = y0[i] = ref[i] = test_randf(&seed);
            assert_int_equal(llm_backend_lora(be, sg, 3, x, in, y, out), LLM_OK);
            for (int g = 0; g < 3; g++)
                llm_lora_apply(&m[g], sg[g].s, x + (size_t)sg[g].row0 * in, sg[g].n_rows, ref + (size_t)sg[g].row0 * out);
            for (int i = 0; i < NR * out; i++)
                if (fabsf(y[i] - ref[i]) > 1e-5f * (1 + fabsf(ref[i])))
                    fail_msg("%s in %d out %d: y[%d] %g, reference %g", sets[si], in, out, i, y[i], ref[i]);
            for (int g = 0; g < 3; g++) { /* each segment's last row alone, from its starting values */
                int r = sg[g].row0 + sg[g].n_rows - 1;
                llm_lora_seg alone = sg[g];
                alone.row0 = 0, alone.n_rows = 1;
                memcpy(one, y0 + (size_t)r * out, sizeof(float) * (size_t)out);
                assert_int_equal(llm_backend_lora(be, &alone, 1, x + (size_t)r * in, in, one, out), LLM_OK);
                assert_memory_equal(one, y + (size_t)r * out, sizeof(float) * (size_t)out);
            }
            llm_lora_seg bad = sg[0];
            bad.a_type = QT_BF16;
            assert_int_equal(llm_backend_lora(be, &bad, 1, x, in, y, out), LLM_ERR_INVALID_ARG);
            llm_backend_free(be);
        }
        for (int g = 0; g < 3; g++) free(m[g].a), free(m[g].bt);
    }
}

/* The adapter llm-mkmodel --lora-of writes (the one test_llamacpp_peer.py
 * shows llama.cpp loading) loads here too, every projection adapted. */
static void test_mklora_adapter_loads(void **state)
{
    (void)state;
    char path[256];
    llm_error err = {0};
    llm_lora *l;
    test_tmpfile("mklora", path, sizeof path);
    assert_int_equal(llm_mklora(tiny.path, 32, 0, QT_Q8_0, 5, path, &err), LLM_OK);
    llm_status st = llm_lora_load(path, tiny.m, 0, &l, &err);
    remove(path);
    assert_int_equal(st, LLM_OK);
    assert_int_equal(l->n_mats, 14);
    assert_int_equal(l->max_rank, 32);
    assert_true(l->alpha == 0);
    llm_lora_free(l);
}

static void refused(const spec *s, int max_rank, const char *why)
{
    llm_lora *l = (llm_lora *)1;
    llm_error err = {0};
    if (load(s, max_rank, &l, &err) == LLM_OK) {
        llm_lora_free(l);
        fail_msg("loaded; wanted a refusal with '%s'", why);
    }
    assert_null(l);
    if (!strstr(err.msg, why))
        fail_msg("wanted '%s' in: %s", why, err.msg);
}

static void test_refusals(void **state)
{
    (void)state;
    refused(&(spec){.arch = "qwen2", .alpha = 8, .rank = 4}, 0, "another architecture than the base's llama");
    refused(&(spec){.gtype = "model", .alpha = 8, .rank = 4}, 0, "not a LoRA adapter");
    refused(&(spec){.atype = "control_vector", .alpha = 8, .rank = 4}, 0, "not a LoRA adapter");
    double alphas[] = {0, -1, INFINITY, 1e9};
    for (int i = 0; i < 4; i++)
        refused(&(spec){.alpha = alphas[i], .rank = 4}, 0, "adapter.lora.alpha");
    refused(&(spec){.alpha = 8, .rank = 8}, 4, "rank 8 (at least 1, at most 4");
    refused(&(spec){.alpha = 8, .rank = 8, .k_rank = 129}, 0, "attn_k.weight.lora_a: rank 129");
    refused(&(spec){.alpha = 8, .rank = 8, .wide_a = 1}, 0, "blk.0.attn_q.weight.lora_a has shape [128, 8]");
    refused(&(spec){.alpha = 8, .rank = 8, .nan = 1}, 0, "not finite");
    refused(&(spec){.alpha = 8, .rank = 8, .a_only = 1}, 0, "attn_q.weight has lora_a without lora_b");
    refused(&(spec){.alpha = 8, .rank = 32, .qt = QT_Q4_0}, 0, "(F32, F16, BF16 or Q8_0 expected)");
    refused(&(spec){.alpha = 8, .rank = 8, .only = "token_embd.weight.lora_a"}, 0, "not a layer's attention or MLP");
    refused(&(spec){.alpha = 8, .rank = 8, .only = "blk.0.ffn_gate_exps.weight.lora_a"}, 0, "MoE experts");
    refused(&(spec){.alpha = 8, .rank = 8, .only = "blk.5.attn_q.weight.lora_a"}, 0, "the base has 2 layers");
    refused(&(spec){.alpha = 8, .rank = 8, .only = "blk.01.attn_q.weight.lora_a"}, 0, "not a layer's attention");
    refused(&(spec){.alpha = 8, .rank = 8, .only = "blk.0.attn_q.weight"}, 0, "neither NAME.lora_a nor NAME.lora_b");
    refused(&(spec){.alpha = 8, .rank = 8, .only = "blk.0.attn_q.weight.lora_a"}, 0, "without lora_b");
}

/* A file larger than any adapter of the base could be (every projection
 * at the largest rank, in F32, and room for metadata) is refused before
 * it is copied into memory: trailing bytes would otherwise pass. */
static void test_oversized_file_refused(void **state)
{
    (void)state;
    char path[256];
    test_tmpfile("lora-big", path, sizeof path);
    write_adapter(&(spec){.alpha = 8, .rank = 4}, path);
    llm_lora *l;
    llm_error err = {0};
    assert_int_equal(llm_lora_load(path, tiny.m, 4, &l, &err), LLM_OK);
    llm_lora_free(l);
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    static char zeros[1 << 16];
    for (size_t i = 0; i <= LLM_LORA_FILE_SLACK / sizeof zeros; i++) /* the slack alone, and more */
        assert_int_equal(fwrite(zeros, 1, sizeof zeros, f), sizeof zeros);
    assert_int_equal(fclose(f), 0);
    l = (llm_lora *)1;
    assert_int_equal(llm_lora_load(path, tiny.m, 4, &l, &err), LLM_ERR_INVALID_ARG);
    remove(path);
    assert_null(l);
    if (!strstr(err.msg, "allowed"))
        fail_msg("wanted a size refusal, got: %s", err.msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_loads_and_applies), cmocka_unit_test(test_mklora_adapter_loads),
                                       cmocka_unit_test(test_backend_op_f32_f16),
                                       cmocka_unit_test(test_refusals), cmocka_unit_test(test_oversized_file_refused)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
