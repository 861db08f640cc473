/* fiber.h - cooperative stacks for the emulator's GPU threads (fiber.c).
 * A fiber runs until it switches to another; nothing is preemptive.
 *
 *   fiber_make(f, fn, arg)   f->stack/f->size set by the caller: the next
 *                            switch to f starts fn(arg) there (fn never
 *                            returns: it switches away for good)
 *   fiber_started(sched)     first call of every fn (for AddressSanitizer's
 *                            bookkeeping of stacks; records sched's stack)
 *   fiber_switch(from, to, dies)  saves the current context in from and
 *                            resumes to; dies: from is never resumed
 *
 * The scheduler's own context is a fiber with no stack of its own (the
 * thread's). Thread-safety: a fiber belongs to one OS thread. */
#ifndef CUSIM_FIBER_H
#define CUSIM_FIBER_H

#include <stddef.h>

typedef struct fiber {
    void *sp;       /* saved stack pointer (x86-64) */
    void *stack;    /* lowest address of the stack */
    size_t size;
    void *uc;       /* ucontext_t elsewhere */
} fiber;

void fiber_make(fiber *f, void (*fn)(void *), void *arg);
void fiber_started(fiber *sched);
void fiber_switch(fiber *from, fiber *to, int from_dies);

#endif
