/* judge_texts.h - the texts a canary's quality is judged on (judge.h):
 * the built-in set, or those of a ConfigMap.
 *
 * The built-in set: varied English prose, code (Python, C, shell, JSON)
 * and chat turns whose system turn decides the answer (a template that
 * drops it is caught there), written for this project; each fits a
 * 1,024-token context, together 1,213 positions on Gemma 3's
 * tokenizer.
 *
 * A ConfigMap's texts: each key of data (in the keys' order), at most
 * JUDGE_TEXTS_MAX; a key ending ".json" holds a chat ({"messages": [...]},
 * rendered by each revision's template), any other plain text.
 *
 * Ownership: both return a new reference. Thread-safety: reentrant. */
#ifndef JUDGE_TEXTS_H
#define JUDGE_TEXTS_H

#include <jansson.h>
#include <stddef.h>

#define JUDGE_TEXTS_MAX 64

/* [{"name", "prompt"} | {"name", "messages"}], or NULL without memory. */
json_t *judge_texts_builtin(void);

/* The texts of configmap (an object as read), or NULL with why. */
json_t *judge_texts_from_configmap(json_t *configmap, char *why, size_t why_n);

#endif
