/* chat_template.c - spec.chatTemplate's ConfigMap admitted; see chat_template.h. */
#include <stdio.h>
#include <string.h>

#include "chat_template.h"
#include "desired.h"
#include "kube_json.h"

int chat_template_of(json_t *llmd, const char **name, const char **key)
{
    json_t *ct = kube_json_get(llmd, "spec", "chatTemplate");
    *name = json_string_value(json_object_get(ct, "configMap"));
    *key = json_string_value(json_object_get(ct, "key"));
    if (!*key)
        *key = DESIRED_TEMPLATE_KEY;
    return *name != NULL;
}

/* Whether dep's pods mount ConfigMap name's key as the chat template
 * (desired.c's DESIRED_TEMPLATE_VOLUME). */
static int mounts(json_t *dep, const char *name, const char *key)
{
    json_t *vols = kube_json_get(dep, "spec", "template");
    vols = kube_json_get(vols, "spec", "volumes");
    for (size_t i = 0; i < json_array_size(vols); i++) {
        json_t *v = json_array_get(vols, i);
        const char *vn = json_string_value(json_object_get(v, "name"));
        json_t *cm = json_object_get(v, "configMap");
        const char *cn = json_string_value(json_object_get(cm, "name"));
        const char *k = json_string_value(json_object_get(json_array_get(json_object_get(cm, "items"), 0), "key"));
        if (vn && cn && k && !strcmp(vn, DESIRED_TEMPLATE_VOLUME) && !strcmp(cn, name) && !strcmp(k, key))
            return 1;
    }
    return 0;
}

int chat_template_wanted(json_t *llmd, json_t *const *deps, size_t n)
{
    const char *name, *key;
    if (!chat_template_of(llmd, &name, &key))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (deps[i] && mounts(deps[i], name, key))
            return 0;
    return 1;
}

int chat_template_admit(json_t *configmap, const char *name, const char *key, char *why, size_t why_n)
{
    json_t *data = json_object_get(configmap, "data");
    if (!configmap)
        snprintf(why, why_n, "spec.chatTemplate: ConfigMap %.253s not found in this namespace", name);
    else if (!json_is_string(json_object_get(data, key)))
        snprintf(why, why_n, "spec.chatTemplate: ConfigMap %.253s has no key %.253s (in data)", name, key);
    else if (!json_is_true(json_object_get(configmap, "immutable")))
        snprintf(why, why_n, "spec.chatTemplate: ConfigMap %.253s is not immutable: pods read it when they start, so an "
                 "edit would reach new pods with no canary; set immutable: true in it (a new template is a new "
                 "ConfigMap, rolled out as a revision)", name);
    else
        return 0;
    return -1;
}
