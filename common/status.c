/* status.c - status names and the error-detail formatter. */
#include "llm/status.h"

#include <stdarg.h>

const char *llm_status_str(llm_status s)
{
    switch (s) {
    case LLM_OK: return "ok";
    case LLM_ERR_NOMEM: return "out of memory";
    case LLM_ERR_IO: return "i/o error";
    case LLM_ERR_FORMAT: return "format error";
    case LLM_ERR_UNSUPPORTED: return "unsupported";
    case LLM_ERR_INVALID_ARG: return "invalid argument";
    case LLM_ERR_KV_FULL: return "kv cache full";
    case LLM_ERR_QUEUE_FULL: return "queue full";
    case LLM_ERR_CANCELLED: return "cancelled";
    case LLM_ERR_BACKEND: return "backend error";
    case LLM_ERR_INTERNAL: return "internal error";
    case LLM_ERR_TOO_LONG: return "too long";
    case LLM_ERR_NOT_FOUND: return "not found";
    case LLM_ERR_TIMEOUT: return "timeout";
    case LLM_ERR_SHUTDOWN: return "shutting down";
    case LLM_ERR_NUMERIC: return "non-finite number";
    case LLM_ERR_GRAMMAR: return "grammar error";
    case LLM_ERR_TEMPLATE: return "template error";
    case LLM_STATUS_HELD_15: /* another layer's: its message says what */
    case LLM_STATUS_HELD_16:
    case LLM_STATUS_HELD_17:
    case LLM_STATUS_HELD_19: return "held for another layer's status";
    }
    return "unknown status"; /* a layer's own (KUBE_ERR_*): its message says what */
}

static void errf_v(llm_error *err, llm_status code, const char *field, const char *fmt, va_list ap)
{
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    snprintf(err->field, sizeof err->field, "%s", field);
    err->code = code;
}

llm_status llm_errf(llm_error *err, llm_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        errf_v(err, code, "", fmt, ap);
        va_end(ap);
    }
    return code;
}

llm_status llm_errf_at(llm_error *err, llm_status code, const char *field, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        errf_v(err, code, field ? field : "", fmt, ap);
        va_end(ap);
    }
    return code;
}
