/* srv_fields.h - which fields of an OpenAI request body llm-server knows,
 * so that none is silently ignored: a field whose effect is not built
 * (an answer would differ from what the client asked for) is refused with
 * a 400 naming it; a field never heard of is logged once per name (vLLM
 * does the same) and otherwise ignored, because clients send extensions
 * of other servers freely.
 * Thread-safety: may be called from any thread (the set of names already
 * logged is under a mutex). */
#ifndef SRV_FIELDS_H
#define SRV_FIELDS_H

#include <jansson.h>

struct srv_err;

/* The endpoints whose fields are known. */
enum { SRV_FIELDS_COMPLETIONS = 0, SRV_FIELDS_CHAT = 1, SRV_FIELDS_GENERATE = 2, SRV_FIELDS_EMBED = 3 };

/* Checks body's field names for a request to endpoint kind (SRV_FIELDS_*):
 * 0, or -1 with e set (400 naming the refused field). Values of known
 * fields are checked by the parser, not here. A field never heard of is
 * logged (once per name) and taken out of body: the request keeps its
 * tree for its whole life, and what it does not read should not stay. */
int srv_fields_check(json_t *body, int kind, struct srv_err *e);

#endif
