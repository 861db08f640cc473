/* kube_meta.c - an object's controlling owner; see kube_meta.h. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube_meta.h"

int kube_meta_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > 253 || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1]))
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(islower(c) || isdigit(c) || c == '-' || (c == '.' && s[i + 1] != '.')))
            return 0;
    }
    return 1;
}

json_t *kube_meta_controller_ref(json_t *o)
{
    json_t *refs = json_object_get(json_object_get(o, "metadata"), "ownerReferences");
    for (size_t i = 0; i < json_array_size(refs); i++)
        if (json_is_true(json_object_get(json_array_get(refs, i), "controller")))
            return json_array_get(refs, i);
    return NULL;
}

const char *kube_meta_controller_uid(json_t *o)
{
    return json_string_value(json_object_get(kube_meta_controller_ref(o), "uid"));
}

void kube_meta_hash(json_t *o, char out[17])
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    unsigned long long h = 1469598103934665603ULL;
    for (const char *p = s ? s : ""; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    free(s);
    snprintf(out, 17, "%016llx", h);
}
