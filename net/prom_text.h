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

#endif
