/* grammar_match.c - the engine's grammar matcher for the Python oracle
 * tests (tests/integration/test_grammar_oracle.py), which hold its verdicts
 * against Python's `re`/`regex` and `json` on the same strings.
 * Usage: grammar_match GRAMMAR_FILE < lines   (or @json / @jsonobject: the
 * engine's JSON grammar from that start rule)
 * Each input line is the hex of a string's bytes; each output line is
 * "full" (a whole string of the language), "prefix" (it can still become
 * one) or "no". A grammar that does not compile: "error: MESSAGE", exit 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/gmatch.h"

static size_t unhex(const char *line, char *out)
{
    size_t n = 0;
    for (const char *p = line; p[0] && p[1] && p[0] != '\n'; p += 2) {
        unsigned v;
        if (sscanf(p, "%2x", &v) != 1)
            break;
        out[n++] = (char)v;
    }
    return n;
}

static const char *verdict(const llm_grammar *g, const char *s, size_t n)
{
    llm_gmatch *m;
    llm_error err = {0};
    if (llm_gmatch_new(g, NULL, NULL, 0, &m, &err))
        return "no";
    const char *v = llm_gmatch_feed(m, s, n, &err) ? "no" : llm_gmatch_complete(m) ? "full" : "prefix";
    llm_gmatch_free(m);
    return v;
}

int main(int argc, char **argv)
{
    static char text[1 << 20], line[1 << 16], bytes[1 << 15];
    if (argc != 2)
        return 2;
    const char *root = argv[1][0] == '@' ? argv[1] + 1 : NULL;
    size_t len = strlen(llm_gbnf_json);
    FILE *f = root ? NULL : fopen(argv[1], "rb");
    if (!root && !f)
        return 2;
    if (f) {
        len = fread(text, 1, sizeof text, f);
        fclose(f);
    }
    llm_grammar *g;
    llm_error err = {0};
    if (llm_grammar_compile(root ? llm_gbnf_json : text, len, root, &g, &err)) {
        printf("error: %s\n", err.msg);
        return 2;
    }
    while (fgets(line, sizeof line, stdin)) {
        size_t n = unhex(line, bytes);
        printf("%s\n", verdict(g, bytes, n));
    }
    llm_grammar_free(g);
    return 0;
}
