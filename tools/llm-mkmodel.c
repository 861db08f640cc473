/* llm-mkmodel - write a GGUF model of a named shape with seeded random
 * weights (tests, benchmarks, the default model of `make run`).
 *   llm-mkmodel --shape NAME --type Q8_0|Q4_K|Q4_0|Q4_1|Q5_0|Q5_1|Q2_K|Q3_K|Q5_K|Q6_K|F16|BF16|F32 -o FILE.gguf [--seed S]
 * or a LoRA adapter of a model in llama.cpp's format:
 *   llm-mkmodel --lora-of BASE.gguf [--rank 8] [--alpha 16] [--type F32|F16|BF16|Q8_0] -o FILE.gguf [--seed S] */
#include <string.h>

#include "cli.h"
#include "llm/mkmodel.h"

static int usage(void)
{
    fprintf(stderr, "usage: llm-mkmodel --shape NAME --type Q8_0|Q4_K|Q4_0|Q4_1|Q5_0|Q5_1|Q2_K|Q3_K|Q5_K|Q6_K|F16|BF16|F32 -o FILE.gguf [--seed S]\n"
                    "       llm-mkmodel --lora-of BASE.gguf [--rank 8] [--alpha 16] [--type F32|F16|BF16|Q8_0] -o FILE.gguf [--seed S]\nshapes:");
    for (const char *const *n = llm_shape_names(); *n; n++) fprintf(stderr, " %s", *n);
    fprintf(stderr, "\n");
    return 2;
}

static int parse_type(const char *s, quant_type *t)
{
    static const struct { const char *n; quant_type t; } types[] = {
        {"F32", QT_F32}, {"F16", QT_F16}, {"BF16", QT_BF16}, {"Q8_0", QT_Q8_0}, {"Q4_0", QT_Q4_0}, {"Q4_K", QT_Q4_K},
        {"Q4_K_M", QT_Q4_K}, {"Q4_1", QT_Q4_1}, {"Q5_0", QT_Q5_0}, {"Q5_1", QT_Q5_1}, {"Q2_K", QT_Q2_K},
        {"Q3_K", QT_Q3_K}, {"Q5_K", QT_Q5_K}, {"Q6_K", QT_Q6_K},
    };
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (!strcasecmp(s, types[i].n)) {
            *t = types[i].t;
            return 0;
        }
    return -1;
}

int main(int argc, char **argv)
{
    const char *shape = NULL, *type = NULL, *out = NULL, *lora_of = NULL;
    long seed = 42, rank = 8, alpha = 16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) type = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--lora-of") && i + 1 < argc) lora_of = argv[++i];
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) {
            if (cli_int("--rank", argv[++i], 1, 1024, &rank)) return 2;
        } else if (!strcmp(argv[i], "--alpha") && i + 1 < argc) {
            if (cli_int("--alpha", argv[++i], 0, 65536, &alpha)) return 2;
        }
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (cli_int("--seed", argv[++i], 0, 0x7fffffffL, &seed)) return 2;
        } else return usage();
    }
    quant_type t;
    llm_error err = {0};
    if (lora_of) { /* an adapter: F32 unless told */
        if (shape || !out || parse_type(type ? type : "F32", &t))
            return usage();
        if (llm_mklora(lora_of, (int)rank, (float)alpha, t, (uint64_t)seed, out, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 1;
        }
        fprintf(stderr, "wrote %s (LoRA of %s, rank %ld, alpha %ld)\n", out, lora_of, rank, alpha);
        return 0;
    }
    type = type ? type : "Q8_0";
    const llm_shape *s = shape ? llm_shape_find(shape) : NULL;
    if (!s || !out || parse_type(type, &t)) {
        if (shape && !s) fprintf(stderr, "error: unknown shape '%s'\n", shape);
        if (parse_type(type, &t)) fprintf(stderr, "error: unknown type '%s'\n", type);
        return usage();
    }
    double t0 = cli_now();
    if (llm_mkmodel(s, t, (uint64_t)seed, out, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "wrote %s (%s, %s) in %.1f s\n", out, s->name, type, cli_now() - t0);
    return 0;
}
