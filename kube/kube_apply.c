/* kube_apply.c - server-side apply, ownership and deletion of children; see kube_apply.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube_apply.h"
#include "kube_json.h"
#include "kube_meta.h"
#include "kube_cache.h"

/* Sets want's hash annotation (out: the hash) and path (coll/name). */
static void stamp(const char *coll, json_t *want, char hash[17], char path[1024])
{
    json_object_del(kube_json_get(want, "metadata", "annotations"), KUBE_HASH_ANN); /* not part of its own hash */
    kube_meta_hash(want, hash);
    json_object_set_new(kube_json_get(want, "metadata", "annotations"), KUBE_HASH_ANN, json_string(hash));
    snprintf(path, 1024, "%s/%s", coll, json_string_value(kube_json_get(want, "metadata", "name")));
}

static int same_hash(json_t *cur, const char *hash)
{
    const char *have = json_string_value(json_object_get(kube_json_get(cur, "metadata", "annotations"), KUBE_HASH_ANN));
    return have && !strcmp(have, hash);
}

/* o's controlling ownerReference (the API server allows one), or NULL. */
/* ---- kube_apply_covers --------------------------------------------------------------- */

/* A quantity ("1Gi", "500m", "2", "1e3") as a number; 0 when it is not one. */
static int quantity(const char *s, double *out)
{
    static const struct { const char *sfx; double mul; } units[] = {
        {"Ki", 0x1p10}, {"Mi", 0x1p20}, {"Gi", 0x1p30}, {"Ti", 0x1p40}, {"Pi", 0x1p50}, {"Ei", 0x1p60},
        {"m", 1e-3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18}, {"", 1}};
    char *end;
    if (!s || !*s || strchr(" \t\n+", *s))
        return 0;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v))
        return 0;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(end, units[i].sfx))
            return *out = v * units[i].mul, 1;
    return 0;
}

static int same_scalar(json_t *a, json_t *b, int amounts)
{
    if (json_equal(a, b))
        return 1;
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    /* the API server writes quantities in its canonical form, as strings ("1024Mi" comes back "1Gi",
     * cpu: 1 comes back "1") */
    double x, y;
    char na[32], nb[32];
    const char *sa = json_is_number(a) && snprintf(na, sizeof na, "%.17g", json_number_value(a)) > 0 ? na : json_string_value(a);
    const char *sb = json_is_number(b) && snprintf(nb, sizeof nb, "%.17g", json_number_value(b)) > 0 ? nb : json_string_value(b);
    if (amounts && sa && sb && quantity(sa, &x) && quantity(sb, &y))
        return fabs(x - y) <= 1e-9 * fmax(fabs(x), fabs(y));
    return 0;
}

static int covers(json_t *want, json_t *cur, int amounts);

/* The merge key of a list item: the field that names it. */
static const char *item_key(json_t *item)
{
    /* the API server's merge keys: a volumeMount by mountPath (its name is the volume's, and one volume
     * may be mounted twice), ports by number, the rest by name */
    static const char *const keys[] = {"mountPath", "containerPort", "port", "name", "type", "uid"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (json_object_get(item, keys[i]))
            return keys[i];
    return NULL;
}

static int covers_list(json_t *want, json_t *cur, int amounts)
{
    size_t i;
    json_t *w;
    const char *key = json_array_size(want) ? item_key(json_array_get(want, 0)) : NULL;
    if (!key && json_array_size(want) != json_array_size(cur))
        return 0; /* an atomic list: ours, whole */
    json_array_foreach(want, i, w) {
        if (!key) {
            if (!covers(w, json_array_get(cur, i), amounts))
                return 0;
            continue;
        }
        json_t *id = json_object_get(w, key), *match = NULL;
        for (size_t j = 0; !match && j < json_array_size(cur); j++)
            if (id && json_equal(json_object_get(json_array_get(cur, j), key), id))
                match = json_array_get(cur, j);
        if (!match || !covers(w, match, amounts))
            return 0;
    }
    return 1;
}

static int covers(json_t *want, json_t *cur, int amounts)
{
    if (json_is_object(want)) {
        const char *k;
        json_t *v;
        if (!json_is_object(cur))
            return 0;
        json_object_foreach(want, k, v)
            if (!covers(v, json_object_get(cur, k), amounts || !strcmp(k, "resources")))
                return 0;
        return 1;
    }
    if (json_is_array(want))
        return json_is_array(cur) && covers_list(want, cur, amounts);
    return cur && same_scalar(want, cur, amounts);
}

int kube_apply_covers(json_t *want, json_t *cur)
{
    return covers(want, cur, 0);
}

/* ---- apply --------------------------------------------------------------------- */

/* The error for an object with a child's name that is not ours: whose it is. */
static llm_status foreign(json_t *cur, json_t *want, const char *uid, llm_error *err)
{
    json_t *by = kube_meta_controller_ref(cur), *mf = kube_json_get(cur, "metadata", "managedFields");
    const char *writer = json_string_value(json_object_get(json_array_get(mf, 0), "manager"));
    char whose[400];
    if (by)
        snprintf(whose, sizeof whose, "it is controlled by %s %s (uid %s)",
                 json_string_value(json_object_get(by, "kind")) ?: "?", json_string_value(json_object_get(by, "name")) ?: "?",
                 json_string_value(json_object_get(by, "uid")) ?: "?");
    else
        snprintf(whose, sizeof whose, "it has no controlling owner%s%s", writer ? "; written by " : "", writer ? writer : "");
    return llm_errf(err, KUBE_ERR_EXISTS, "%s %s exists and is not this LLMDeployment's (uid %s): %s; rename or delete it",
                    json_string_value(json_object_get(want, "kind")) ?: "object",
                    json_string_value(kube_json_get(want, "metadata", "name")) ?: "?", uid ? uid : "?", whose);
}

/* Applies want; *taken set when other managers held fields of it (a hand
 * edit, another controller): they were taken back with force, and err->msg
 * says from whom (the API server's words). */
static llm_status server_apply(kube_client *k, const char *path, json_t *want, json_t **now, int *taken, llm_error *err)
{
    char url[1200];
    llm_error first = {0};
    *taken = 0;
    snprintf(url, sizeof url, "%s?fieldManager=" KUBE_FIELD_MANAGER, path);
    /* JSON is YAML: the apply body needs no YAML writer */
    llm_status st = kube_client_request(k, "PATCH", url, want, "application/apply-patch+yaml", now, &first);
    /* the API server's words: "Apply failed with 1 conflict: conflict with "M" using apps/v1: .spec...",
     * or "... with N conflicts: conflicts with "M" ...:\n- .spec...\n- ..." */
    const char *said = st == KUBE_ERR_CONFLICT ? strstr(first.msg, "Apply failed with") : NULL;
    if (!said) /* not other managers' fields */
        return st ? llm_errf(err, st, "%s", first.msg) : LLM_OK;
    /* every field we apply is ours by design (the spec says it): taken back, and said */
    snprintf(url, sizeof url, "%s?fieldManager=" KUBE_FIELD_MANAGER "&force=true", path);
    if ((st = kube_client_request(k, "PATCH", url, want, "application/apply-patch+yaml", now, err)))
        return st;
    *taken = 1;
    llm_errf(err, LLM_OK, "%s", said);
    return LLM_OK;
}

/* ns, plural and name of an object path (".../namespaces/NS/PLURAL/NAME",
 * nothing after); -1 when it is not one. */
static int parse_path(const char *path, char *ns, char *plural, char *name, size_t n)
{
    const char *p = strstr(path, "/namespaces/");
    if (!p)
        return -1;
    p += strlen("/namespaces/");
    const char *parts[3] = {p, NULL, NULL};
    for (int i = 1; i < 3; i++) {
        const char *slash = strchr(parts[i - 1], '/');
        if (!slash)
            return -1;
        parts[i] = slash + 1;
    }
    char *outs[3] = {ns, plural, name};
    for (int i = 0; i < 3; i++) {
        size_t len = i < 2 ? (size_t)(strchr(parts[i], '/') - parts[i]) : strlen(parts[i]);
        if (!len || len >= n || (i == 2 && strchr(parts[i], '/')))
            return -1;
        memcpy(outs[i], parts[i], len);
        outs[i][len] = 0;
    }
    return 0;
}

/* The informers' view of path: HIT (*out set), ABSENT, or UNKNOWN;
 * *complete (may be NULL): whether that cache sees every object. */
static kube_cached cached(kube_client *k, const char *path, json_t **out, int *complete)
{
    char ns[256], plural[256], name[256];
    kube_cache *c = parse_path(path, ns, plural, name, sizeof ns) ? NULL
                    : kube_cache_find(kube_client_caches(k), plural);
    *out = NULL;
    if (complete)
        *complete = c && kube_cache_is_complete(c);
    return c ? kube_cache_get(c, ns, name, out) : KUBE_CACHE_UNKNOWN;
}

llm_status kube_apply_read(kube_client *k, const char *path, json_t **out, llm_error *err)
{
    int complete;
    kube_cached r = cached(k, path, out, &complete);
    if (r == KUBE_CACHE_HIT)
        return LLM_OK;
    if (r == KUBE_CACHE_ABSENT && complete)
        return llm_errf(err, LLM_ERR_NOT_FOUND, "%s: not there", path);
    return kube_client_request(k, "GET", path, NULL, NULL, out, err); /* not cached, not listed yet, or maybe not ours */
}

llm_status kube_apply_over(kube_client *k, const char *coll, json_t *want, json_t *cur, kube_applied *did, json_t **now,
                           llm_error *err)
{
    char hash[17], path[1024];
    json_t *read = NULL;
    if (now)
        *now = NULL;
    *did = KUBE_SAME;
    stamp(coll, want, hash, path);
    if (!cur) {
        llm_status st = kube_apply_read(k, path, &read, err);
        if (st && st != LLM_ERR_NOT_FOUND)
            return st;
        cur = read;
    }
    const char *uid = json_string_value(json_object_get(json_array_get(kube_json_get(want, "metadata", "ownerReferences"), 0), "uid"));
    const char *has = kube_meta_controller_uid(cur);
    llm_status st = LLM_OK;
    if (cur && (!uid || !has || strcmp(uid, has))) {
        st = foreign(cur, want, uid, err); /* never adopted: its owner may be anyone */
    } else if (cur && same_hash(cur, hash) && kube_apply_covers(want, cur)) { /* at rest: nothing to write */
        if (now)
            *now = json_incref(cur);
    } else {
        *did = cur ? KUBE_UPDATED : KUBE_CREATED;
        /* the object we judged ours, no other: one deleted and made again by someone else meanwhile has
         * another uid, and the API server refuses the write */
        if (cur)
            json_object_set(json_object_get(want, "metadata"), "uid", kube_json_get(cur, "metadata", "uid"));
        int taken = 0;
        st = server_apply(k, path, want, now, &taken, err);
        if (!st && taken)
            *did = KUBE_TAKEN_BACK;
        json_object_del(json_object_get(want, "metadata"), "uid");
        if (st == LLM_ERR_INVALID_ARG && err && strstr(err->msg, "metadata.uid")) /* (422: the API server's words) */
            st = llm_errf(err, KUBE_ERR_CONFLICT, "%s: the object was replaced meanwhile; looking again", path);
    }
    json_decref(read);
    return st;
}

llm_status kube_apply(kube_client *k, const char *coll, json_t *want, kube_applied *did, llm_error *err)
{
    return kube_apply_over(k, coll, want, NULL, did, NULL, err);
}

llm_status kube_apply_remove_ours(kube_client *k, const char *path, const char *owner_uid, llm_error *err)
{
    json_t *cur = NULL;
    kube_cached r = cached(k, path, &cur, NULL);
    if (r == KUBE_CACHE_ABSENT) /* ours carry the managed-by label: even an ours-only cache knows them all */
        return LLM_OK;
    llm_status st = r == KUBE_CACHE_HIT ? LLM_OK : kube_client_request(k, "GET", path, NULL, NULL, &cur, err);
    if (!st) {
        const char *uid = kube_meta_controller_uid(cur);
        if (uid && owner_uid && !strcmp(uid, owner_uid))
            st = kube_client_request(k, "DELETE", path, NULL, NULL, NULL, err);
    }
    json_decref(cur);
    return st == LLM_ERR_NOT_FOUND ? LLM_OK : st;
}
