/* prom.c - the Prometheus text exposition (llm/prom.h). */
#include "llm/prom.h"

#include <string.h>

void llm_prom_head(llm_strbuf *b, const char *name, const char *type, const char *help)
{
    llm_strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void llm_prom_sample(llm_strbuf *b, const char *name, const char *labels, double v)
{
    const char *l = labels ? labels : "";
    int any = *l != 0;
    llm_strbuf_printf(b, "%s%s%s%s %.17g\n", name, any ? "{" : "", l, any ? "}" : "", v);
}

void llm_prom_gauge(llm_strbuf *b, const char *name, const char *help, const char *labels, double v)
{
    llm_prom_head(b, name, "gauge", help);
    llm_prom_sample(b, name, labels, v);
}

void llm_prom_counter(llm_strbuf *b, const char *name, const char *help, const char *labels, double v)
{
    llm_prom_head(b, name, "counter", help);
    llm_prom_sample(b, name, labels, v);
}

void llm_prom_hist_series(llm_strbuf *b, const char *name, const char *labels, const double *le, int n,
                          const uint64_t *counts, uint64_t count, double sum)
{
    const char *l = labels ? labels : "";
    int any = *l != 0;
    uint64_t acc = 0;
    for (int i = 0; i < n; i++) {
        acc += counts[i];
        llm_strbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, l, any ? "," : "", le[i], (unsigned long long)acc);
    }
    llm_strbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, l, any ? "," : "", (unsigned long long)count);
    llm_strbuf_printf(b, "%s_sum%s%s%s %.17g\n", name, any ? "{" : "", l, any ? "}" : "", sum);
    llm_strbuf_printf(b, "%s_count%s%s%s %llu\n", name, any ? "{" : "", l, any ? "}" : "", (unsigned long long)count);
}

void llm_prom_hist(llm_strbuf *b, const char *name, const char *help, const char *labels, const double *le, int n,
                   const uint64_t *counts, uint64_t count, double sum)
{
    llm_prom_head(b, name, "histogram", help);
    llm_prom_hist_series(b, name, labels, le, n, counts, count, sum);
}

void llm_prom_label(llm_strbuf *labels, const char *key, const char *value)
{
    llm_strbuf_printf(labels, "%s%s=\"", labels->len ? "," : "", key);
    for (const char *p = value; p && *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        llm_strbuf_append(labels, esc ? esc : p, esc ? strlen(esc) : 1);
    }
    llm_strbuf_append(labels, "\"", 1);
}
