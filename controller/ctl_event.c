/* ctl_event.c - posting Events; see ctl_event.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl_obs.h"
#include "ctl_event.h"

void ctl_event(kube_client *k, json_t *obj, const char *type, const char *reason, const char *fmt, ...)
{
    json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    if (!ns || !name)
        return;
    char msg[1024], now[32], ename[300], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&ts.tv_sec, &tm));
    /* unique per event, like the client-go recorder's name.<hex nanoseconds> */
    snprintf(ename, sizeof ename, "%.200s.%llx", name, (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec);
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/events", ns);
    json_t *ev = json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:O,s:O,s:s,s:s,s:O,s:O},s:s,s:s,s:s,s:{s:s},s:s,s:s,s:i,s:s}",
                           "apiVersion", "v1", "kind", "Event", "metadata", "name", ename, "namespace", ns,
                           "involvedObject", "apiVersion", json_object_get(obj, "apiVersion"), "kind",
                           json_object_get(obj, "kind"), "name", name, "namespace", ns, "uid", json_object_get(md, "uid"),
                           "resourceVersion", json_object_get(md, "resourceVersion"), "type", type, "reason", reason,
                           "message", msg, "source", "component", "llm-controller", "firstTimestamp", now,
                           "lastTimestamp", now, "count", 1, "reportingComponent", "llm-controller");
    llm_error err = {0};
    if (!ev) {
        ctl_obs_log(CTL_WARN, "cannot build an event", "reason", reason, (const char *)NULL);
        return;
    }
    if (kube_client_request(k, "POST", path, ev, NULL, NULL, &err))
        ctl_obs_log(CTL_WARN, "cannot post an event", "reason", reason, "error", err.msg, (const char *)NULL);
    else
        ctl_obs_count(CTL_M_EVENTS);
    ctl_obs_log(strcmp(type, "Warning") ? CTL_INFO : CTL_WARN, msg, "event", reason, "object", name, "namespace", ns,
            (const char *)NULL);
    json_decref(ev);
}
