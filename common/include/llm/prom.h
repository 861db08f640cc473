/* prom.h - the Prometheus text exposition (format 0.0.4), written one way
 * by llm-server, llm-router and llm-controller: a family's # HELP and
 * # TYPE lines, samples with their labels, counters, gauges, histograms.
 *
 * labels are "" (or NULL) or `k="v",k2="v2"` with each value already in
 * the exposition's escaping (llm_prom_label writes one pair so). Numbers go
 * out with 17 significant digits (every double exactly; integers below
 * 2^53 as integers). Counters are named as their samples are, with the
 * `_total` the caller gives (the # TYPE line names the sample, as Go's
 * expfmt and prometheus_client both read it).
 *
 * Thread-safety: one buffer per thread (llm/strbuf.h). */
#ifndef LLM_PROM_H
#define LLM_PROM_H

#include <stdint.h>

#include "llm/strbuf.h"

/* # HELP name help, # TYPE name type ("counter", "gauge", "histogram"). */
void llm_prom_head(llm_strbuf *b, const char *name, const char *type, const char *help);
/* name{labels} v */
void llm_prom_sample(llm_strbuf *b, const char *name, const char *labels, double v);
/* A family of one sample: head and sample. */
void llm_prom_gauge(llm_strbuf *b, const char *name, const char *help, const char *labels, double v);
void llm_prom_counter(llm_strbuf *b, const char *name, const char *help, const char *labels, double v);
/* One histogram series (no head): name_bucket for each of the n upper
 * bounds le (counts[i]: observations in bucket i alone, not cumulative),
 * then +Inf (count in all), name_sum and name_count. */
void llm_prom_hist_series(llm_strbuf *b, const char *name, const char *labels, const double *le, int n,
                          const uint64_t *counts, uint64_t count, double sum);
/* A histogram family of one series. */
void llm_prom_hist(llm_strbuf *b, const char *name, const char *help, const char *labels, const double *le, int n,
                   const uint64_t *counts, uint64_t count, double sum);
/* Appends `key="value"` to a label list (a comma first when it is not
 * empty), with value's backslashes, quotes and line breaks escaped. */
void llm_prom_label(llm_strbuf *labels, const char *key, const char *value);

#endif
