/* fiber.h - cooperative stacks for the emulator's GPU threads (fiber.c).
 * A fiber runs until it switches to another; nothing is preemptive. The
 * scheduler's own context is a fiber whose stack is the OS thread's
 * (stack NULL until fiber_started records it). Thread-safety: a fiber is
 * run by one OS thread at a time; nothing here locks. */
#ifndef CUSIM_FIBER_H
#define CUSIM_FIBER_H

#include <stddef.h>

typedef struct fiber {
    void *sp;       /* saved stack pointer */
    void *stack;    /* lowest address of the stack */
    size_t size;
} fiber;

/* Prepares f (f->stack and f->size set by the caller, 16-byte aligned
 * top) so that the next switch to it starts fn(arg) there. fn never
 * returns: it switches away for good. Cannot fail. */
void fiber_make(fiber *f, void (*fn)(void *), void *arg);
/* The first call of every fn: tells AddressSanitizer the switch ended,
 * and records the scheduler's stack in sched when it is not yet known. */
void fiber_started(fiber *sched);
/* Saves the running context in from and resumes to; from_dies: from is
 * never resumed (AddressSanitizer forgets its stack). */
void fiber_switch(fiber *from, fiber *to, int from_dies);

#endif
