/* kube_json.c - fields of Kubernetes objects by path (kube_json.h). */
#include "kube_json.h"

#include <limits.h>
#include <stdarg.h>

static json_t *walk(json_t *o, va_list ap)
{
    const char *k;
    while (o && (k = va_arg(ap, const char *)))
        o = json_object_get(o, k);
    return o;
}

json_t *kube_json_getv(json_t *o, ...)
{
    va_list ap;
    va_start(ap, o);
    json_t *v = walk(o, ap);
    va_end(ap);
    return v;
}

const char *kube_json_strv(json_t *o, ...)
{
    va_list ap;
    va_start(ap, o);
    json_t *v = walk(o, ap);
    va_end(ap);
    return json_string_value(v);
}

int kube_json_int(json_t *o, const char *k, int def)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v))
        return def;
    json_int_t i = json_integer_value(v);
    return i < INT_MIN || i > INT_MAX ? def : (int)i;
}

double kube_json_num(json_t *o, const char *k, double def)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}
