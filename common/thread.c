/* thread.c - threads with a stated stack; see llm/thread.h. */
#include "llm/thread.h"


int llm_thread_create(pthread_t *t, size_t stack, void *(*fn)(void *), void *arg)
{
    pthread_attr_t a;
    int rc = pthread_attr_init(&a);
    if (rc)
        return rc;
    rc = pthread_attr_setstacksize(&a, stack);
    if (!rc)
        rc = pthread_create(t, &a, fn, arg);
    pthread_attr_destroy(&a);
    return rc;
}
