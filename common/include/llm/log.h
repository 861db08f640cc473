/* log.h - the programs' log line: "2026-11-30T18:00:00Z PROG: message" on
 * stderr, written with one call so lines from several threads do not mix.
 * Messages longer than 2 KiB are cut. Thread-safe. */
#ifndef LLM_LOG_H
#define LLM_LOG_H

void llm_log(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
