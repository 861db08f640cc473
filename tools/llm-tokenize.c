/* llm-tokenize - print the token ids of a text (or a file) for a GGUF
 * vocab, like llama.cpp's llama-tokenize, so the two can be compared.
 *   llm-tokenize -m MODEL.gguf [--pieces] [--no-bos] [--parse-special] (TEXT | --file F)
 * --words prints the pre-tokenizer's words instead, one per line in hex
 * (for comparing the split with the reference regular expressions).
 * --time prints "tokenize: N ids in T ms" (the tokenization alone) to
 * stderr. */
#include <string.h>
#include <time.h>

#include "cli.h"
#include "llm/gguf.h"
#include "llm/tokenizer.h"

static int usage(void)
{
    fprintf(stderr, "usage: llm-tokenize -m MODEL.gguf [--pieces | --words] [--no-bos] [--parse-special] [--time] "
                    "(TEXT | --file F)\n");
    return 2;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap && n < LLM_TOKENIZE_MAX_BYTES) {
            char *p = realloc(buf, cap *= 2);
            if (!p) { free(buf); buf = NULL; }
            buf = p;
        } else if (n == cap) {
            break;
        }
    }
    fclose(f);
    if (!buf)
        fprintf(stderr, "error: %s: out of memory\n", path);
    *len = n;
    return buf;
}

static void print_word(void *ctx, const char *w, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)w[i]);
    printf("\n");
}

static void print_piece(const llm_vocab *v, int32_t id)
{
    char buf[256];
    int n = llm_token_to_piece(v, id, 1, buf, sizeof buf);
    printf("%6d -> '%.*s'\n", id, n > (int)sizeof buf ? (int)sizeof buf : n, buf);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *text = NULL;
    int pieces = 0, bos = 1, special = 0, words = 0, timed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(argv[i], "--pieces")) pieces = 1;
        else if (!strcmp(argv[i], "--words")) words = 1;
        else if (!strcmp(argv[i], "--no-bos")) bos = 0;
        else if (!strcmp(argv[i], "--parse-special")) special = 1;
        else if (!strcmp(argv[i], "--time")) timed = 1;
        else if (argv[i][0] == '-' && argv[i][1]) return usage();
        else text = argv[i];
    }
    if (!model || (!file == !text))
        return usage();
    llm_error err = {0};
    gguf_file *g;
    llm_vocab *v;
    if (gguf_open(model, &g, &err) || llm_vocab_load(g, &v, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    size_t len = text ? strlen(text) : 0;
    char *owned = file ? read_file(file, &len) : NULL;
    int32_t *ids = NULL;
    int n = 0, rc = 0;
    if (words && !(file && !owned)) {
        rc = llm_vocab_pretokenize(v, file ? owned : text, len, print_word, NULL, &err) ? 1 : 0;
        if (rc)
            fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if ((file && !owned) || llm_tokenize(v, file ? owned : text, len, bos, special, &ids, &n, &err)) {
        if (!file || owned)
            fprintf(stderr, "error: %s\n", err.msg);
        rc = 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (timed && !rc)
        fprintf(stderr, "tokenize: %d ids in %.3f ms\n", n,
                (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    for (int i = 0; i < n; i++) {
        if (pieces) print_piece(v, ids[i]);
        else printf(i ? " %d" : "%d", ids[i]);
    }
    if (!pieces && !rc)
        printf("\n");
done:
    free(ids);
    free(owned);
    llm_vocab_free(v);
    gguf_close(g);
    return rc;
}
