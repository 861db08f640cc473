/* kube_json.h - reading fields of Kubernetes objects (jansson trees) by
 * path: the one helper the controller and the Kubernetes library use, so a
 * missing object anywhere on the way reads as absent, never as a crash.
 *
 *   kube_json_get(dep, "spec", "template", "metadata")   -> json_t * or NULL
 *   kube_json_str(pod, "status", "phase")                 -> const char * or NULL
 *
 * A NULL key ends the path early (kube_json_get(o, "spec", NULL) is o.spec).
 * The results are borrowed from o. Thread-safety: pure reads; o must not be
 * changed meanwhile. */
#ifndef KUBE_JSON_H
#define KUBE_JSON_H

#include <jansson.h>

/* o[k1][k2]...: the value, or NULL where any step is missing or not an object. */
json_t *kube_json_getv(json_t *o, ...);
#define kube_json_get(o, ...) kube_json_getv((o), __VA_ARGS__, (const char *)NULL)
/* The same when the value is a string; NULL otherwise. */
const char *kube_json_strv(json_t *o, ...);
#define kube_json_str(o, ...) kube_json_strv((o), __VA_ARGS__, (const char *)NULL)
/* o[k] as an int when it is an integer within int's range, else def. */
int kube_json_int(json_t *o, const char *k, int def);
/* o[k] as a double when it is a number, else def. */
double kube_json_num(json_t *o, const char *k, double def);

#endif
