/* prom_text.h - one reading of a Prometheus text exposition (the /metrics
 * of llm-server and llm-router pods), for the controller's autoscaler and
 * canary analysis and llm-router's load poller.
 *
 * The text is the pods' - anyone's words: a line is read within itself
 * (linear in the page), a value must be a finite number, anything else is
 * skipped. Thread-safety: pure. */
#ifndef PROM_TEXT_H
#define PROM_TEXT_H

/* The sum of every series of name (any labels) in text; 0 with *found 0
 * when there is none. */
double prom_text_value(const char *text, const char *name, int *found);
/* The same over the series whose labels hold key="value" (a gateway's
 * page: one route's). */
double prom_text_value_where(const char *text, const char *name, const char *key, const char *value, int *found);

/* For each series of name in text whose value is above 0 and whose labels
 * hold key="VALUE" (VALUE without a backslash or quote inside, at most 255
 * bytes), fn(ctx, VALUE, its length); at most max calls. The count. */
int prom_text_labels(const char *text, const char *name, const char *key, int max,
                     void (*fn)(void *ctx, const char *value, size_t n), void *ctx);

#endif
