// The host emulation's context switch (see simt.h): x86-64 System V, callee-saved registers
// only (the switch is a function call, so the caller has saved the rest). A stack not yet run
// starts in simt_trampoline with its Fiber* in r12.
#if !defined(__x86_64__)
#error "the CUDA host emulation's context switch is written for x86-64"
#endif

#include "simt.h"

// Where simt_trampoline enters a new fiber.
extern "C" [[noreturn]] void simt_fiber_entry(simt::Fiber* f) { simt::fiber_main(*f); }

// void simt_switch(void** save_sp, void* load_sp)
__asm__(R"(
  .text
  .globl simt_switch
  .type simt_switch, @function
simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simt_switch, .-simt_switch

  .globl simt_trampoline
  .type simt_trampoline, @function
simt_trampoline:
  movq %r12, %rdi
  call simt_fiber_entry
  ud2
  .size simt_trampoline, .-simt_trampoline
  .section .note.GNU-stack,"",@progbits
)");
