/* jinja_render.c - renders a chat template with llm-server's converter
 * and the engine's Jinja interpreter, for the Python oracle test
 * (tests/integration/test_jinja_oracle.py) that holds the output to
 * jinja2's. Usage: jinja_render TEMPLATE [NOW] < cases.jsonl
 * Each input line: {"messages": [...], "tools": [...] (optional),
 * "add_generation_prompt": bool, "bos_token": s, "eos_token": s, and any
 * other variables}. Each output line: {"ok": true, "text": ..., "spans":
 * [[start, end], ...]} (byte offsets) or {"ok": false, "error": ...}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_chat.h"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, len = 0, got;
    do {
        if (cap - len < 65536) {
            char *nb = realloc(buf, cap += 65536);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    *n = len;
    return buf;
}

static json_t *render(const llm_jinja *t, json_t *in, double now)
{
    llm_jinja_limits lim = {.now = now};
    llm_jctx *c = llm_jctx_new(&lim);
    llm_error err = {0};
    json_t *kw = json_deep_copy(in);
    static const char *known[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) json_object_del(kw, known[i]);
    llm_jv *vars = c ? srv_chat_vars(c, json_object_get(in, "messages"), json_object_get(in, "tools"),
                                     json_is_true(json_object_get(in, "add_generation_prompt")),
                                     json_string_value(json_object_get(in, "bos_token")),
                                     json_string_value(json_object_get(in, "eos_token")), kw, &err)
                     : NULL;
    json_decref(kw);
    size_t len = 0;
    llm_span *sp = NULL;
    int n_sp = 0;
    char *text = vars ? llm_jinja_render(t, c, vars, &len, &sp, &n_sp, &err) : NULL;
    json_t *out;
    if (!text)
        out = json_pack("{s:b,s:s}", "ok", 0, "error", err.msg);
    else {
        json_t *spans = json_array();
        for (int i = 0; i < n_sp; i++) json_array_append_new(spans, json_pack("[I,I]", (json_int_t)sp[i].start, (json_int_t)sp[i].end));
        out = json_pack("{s:b,s:s%,s:o}", "ok", 1, "text", text, len, "spans", spans);
    }
    free(text);
    free(sp);
    llm_jctx_free(c);
    return out;
}

/* --each: every line carries its own template ({"template": ..., and the variables}). */
static json_t *render_each(json_t *in, double now)
{
    json_t *src = json_object_get(in, "template");
    llm_jinja *t = NULL;
    llm_error err = {0};
    if (!json_is_string(src))
        return json_pack("{s:b,s:s}", "ok", 0, "error", "no template");
    if (llm_jinja_compile(json_string_value(src), json_string_length(src), &t, &err))
        return json_pack("{s:b,s:b,s:s}", "ok", 0, "compile", 1, "error", err.msg);
    json_object_del(in, "template");
    json_t *out = render(t, in, now);
    llm_jinja_free(t);
    return out;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: jinja_render TEMPLATE|--each [NOW] < cases.jsonl\n");
        return 2;
    }
    int each = !strcmp(argv[1], "--each");
    llm_jinja *t = NULL;
    if (!each) {
        size_t n = 0;
        char *src = slurp(argv[1], &n);
        if (!src) {
            fprintf(stderr, "jinja_render: cannot read %s\n", argv[1]);
            return 2;
        }
        llm_error err = {0};
        if (llm_jinja_compile(src, n, &t, &err)) {
            json_t *o = json_pack("{s:s}", "compile_error", err.msg);
            char *s = json_dumps(o, JSON_COMPACT);
            puts(s ? s : "{}");
            free(s);
            json_decref(o);
            free(src);
            return 3;
        }
        free(src);
    }
    double now = argc > 2 ? atof(argv[2]) : 0;
    json_error_t je;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        json_t *in = json_loadb(line, (size_t)got, 0, &je);
        json_t *out = !in ? json_pack("{s:b,s:s}", "ok", 0, "error", je.text)
                      : each ? render_each(in, now) : render(t, in, now);
        char *s = json_dumps(out, JSON_COMPACT | JSON_ENSURE_ASCII);
        puts(s ? s : "{\"ok\": false, \"error\": \"no memory\"}");
        fflush(stdout);
        free(s);
        json_decref(out);
        json_decref(in);
    }
    free(line);
    llm_jinja_free(t);
    return 0;
}
