/* kube_meta.c - an object's controlling owner; see kube_meta.h. */
#include "kube_meta.h"

json_t *kube_controller_ref(json_t *o)
{
    json_t *refs = json_object_get(json_object_get(o, "metadata"), "ownerReferences");
    for (size_t i = 0; i < json_array_size(refs); i++)
        if (json_is_true(json_object_get(json_array_get(refs, i), "controller")))
            return json_array_get(refs, i);
    return NULL;
}

const char *kube_controller_uid(json_t *o)
{
    return json_string_value(json_object_get(kube_controller_ref(o), "uid"));
}
