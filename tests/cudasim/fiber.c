/* fiber.c - the context switch under the emulator's GPU threads: a few
 * instructions of x86-64 assembly that save the callee-saved registers,
 * MXCSR and the x87 control word on the current stack and continue on
 * another (swapcontext would make a system call per switch, and a block
 * of 1,024 threads switches at every barrier and shuffle). x86-64 only,
 * like the rest of the emulator's build.
 *
 * Under AddressSanitizer every switch is announced
 * (__sanitizer_start_switch_fiber), so it knows which stack is in use. */
#include <stdint.h>
#include <stdlib.h>

#include "fiber.h"

#if defined(__SANITIZE_ADDRESS__)
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
#define ASAN_FIBERS 1
#else
#define ASAN_FIBERS 0
#endif

#if defined(__x86_64__)

/* fiber_swap(save, to): pushes rbp, rbx, r12-r15 and an 8-byte slot with
 * MXCSR and the x87 control word, stores rsp in *save, loads `to` and pops
 * the same from there. A new fiber's stack holds such a frame whose return
 * address is fiber_entry, with the entry function in r12 and its argument
 * in r13. */
void fiber_swap(void **save, void *to);
void fiber_entry(void);
__asm__(".text\n"
        ".globl fiber_swap\n"
        ".type fiber_swap,@function\n"
        "fiber_swap:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size fiber_swap, .-fiber_swap\n"
        ".globl fiber_entry\n"
        ".type fiber_entry,@function\n"
        "fiber_entry:\n"
        "    movq %r13, %rdi\n"
        "    callq *%r12\n"
        "    ud2\n"
        ".size fiber_entry, .-fiber_entry\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");

void fiber_make(fiber *f, void (*fn)(void *), void *arg)
{
    uintptr_t top = ((uintptr_t)f->stack + f->size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 64);
    uint32_t ctl[2] = {0x1f80u, 0x037fu}; /* MXCSR and x87 control word at their defaults */
    sp[0] = (uint64_t)ctl[0] | ((uint64_t)ctl[1] << 32);
    sp[1] = 0;                  /* r15 */
    sp[2] = 0;                  /* r14 */
    sp[3] = (uint64_t)arg;      /* r13 */
    sp[4] = (uint64_t)fn;       /* r12 */
    sp[5] = 0;                  /* rbx */
    sp[6] = 0;                  /* rbp */
    sp[7] = (uint64_t)(uintptr_t)fiber_entry;
    f->sp = sp;
}

static void swap_raw(fiber *from, fiber *to) { fiber_swap(&from->sp, to->sp); }

#else
#error "cudasim's fibers are written for x86-64 (the kernels are built with -mfma there too)"
#endif

void fiber_started(fiber *sched)
{
#if ASAN_FIBERS
    const void *bottom = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
    if (!sched->stack) { /* the scheduler's stack is the OS thread's */
        sched->stack = (void *)bottom;
        sched->size = size;
    }
#else
    (void)sched;
#endif
}

void fiber_switch(fiber *from, fiber *to, int from_dies)
{
#if ASAN_FIBERS
    void *fake = NULL;
    __sanitizer_start_switch_fiber(from_dies ? NULL : &fake, to->stack, to->size);
    swap_raw(from, to);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    (void)from_dies;
    swap_raw(from, to);
#endif
}
