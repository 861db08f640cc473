/* seam_lora.c - what the fuzz targets that link server/srv_api.c take in
 * place of server/srv_lora.c (which needs the engine and a model):
 * adapters are loaded by a running server, never by parsing, so a request's
 * model naming one finds none (the 404 path). */
#include "srv.h"

srv_lora_ent *srv_lora_pin(srv_loras *t, const char *name)
{
    (void)t, (void)name;
    return NULL;
}

void srv_lora_unpin(srv_loras *t, srv_lora_ent *p) { (void)t, (void)p; }
