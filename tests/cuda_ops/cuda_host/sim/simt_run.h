// simt::run_grid: runs one launch of the host emulation (see simt.h).
#pragma once

namespace simt {

// Fiber stacks: kernels' frames are small; AddressSanitizer's redzones make them larger.
inline constexpr size_t kFiberStack = size_t{256} << 10;
inline constexpr size_t kGuard = 4096;

struct Launch {
  std::function<void()> body;
  dim3 grid, block;
};

inline thread_local const Launch* t_launch = nullptr;

// A fiber's entry point (from simt_trampoline): runs the kernel as thread `f`, then exits the
// thread.
[[noreturn]] inline void fiber_main(Fiber& f) {
  Block& b = *f.block;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &b.runner_stack, &b.runner_stack_bytes);
#endif
  t_launch->body();
  // The thread exits: barriers stop waiting for it (as a GPU's do for exited threads).
  f.state = Fiber::kDone;
  --b.live;
  --b.warps[static_cast<size_t>(f.warp)].live;
  release_after_exit(b, f);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(nullptr, b.runner_stack, b.runner_stack_bytes);  // this stack is done
#endif
  void* dead = nullptr;
  simt_switch(&dead, b.runner_sp);
  __builtin_unreachable();
}

// A new stack whose first switch enters simt_trampoline with `f` in r12: six saved registers
// (r15, r14, r13, r12, rbx, rbp, popped in that order) below the return address, placed so that
// the trampoline's call sees the 16-byte alignment the ABI asks for.
inline void* start_stack(Fiber& f) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + f.stack_bytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uintptr_t*>(top - 64 - 8);
  sp[0] = 0;                                      // r15
  sp[1] = 0;                                      // r14
  sp[2] = 0;                                      // r13
  sp[3] = reinterpret_cast<uintptr_t>(&f);        // r12
  sp[4] = 0;                                      // rbx
  sp[5] = 0;                                      // rbp
  sp[6] = reinterpret_cast<uintptr_t>(&simt_trampoline);  // returned to
  return sp;
}

[[noreturn]] inline void report_deadlock(const Block& b) {
  std::fprintf(stderr, "simt: block %u can make no progress: %d live threads, none runnable\n", b.index, b.live);
  int shown = 0;
  for (const Fiber& f : b.fibers) {
    if (f.state != Fiber::kWaiting) continue;
    if (shown++ < 64) {
      std::fprintf(stderr, "  thread %d waits at %s", f.linear, f.waits_at);
      if (std::strcmp(f.waits_at, "__syncthreads") == 0) std::fprintf(stderr, " (line %d)", f.line);
      std::fprintf(stderr, "\n");
    }
  }
  std::fflush(stderr);
  std::abort();
}

// Runs every thread of `b` to completion on this OS thread.
inline void run_block(const Launch& L, Block& b) {
  t_block = &b;
  t_launch = &L;
  const unsigned bx = L.block.x, by = L.block.y, gx = L.grid.x, gy = L.grid.y;
  const uint3 bid{b.index % gx, (b.index / gx) % gy, b.index / (gx * gy)};
  for (int i = 0; i < b.threads; ++i) {
    Fiber& f = b.fibers[static_cast<size_t>(i)];
    f.block = &b;
    f.linear = i;
    f.warp = i / 32;
    f.lane = i % 32;
    const unsigned t = static_cast<unsigned>(i);
    f.tid = uint3{t % bx, (t / bx) % by, t / (bx * by)};
    f.stack_bytes = kFiberStack;
    f.stack = mmap(nullptr, kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (f.stack == MAP_FAILED) fail("cannot map a fiber stack");
    mprotect(f.stack, kGuard, PROT_NONE);  // a stack overflow faults instead of corrupting memory
    f.sp = start_stack(f);
  }
  // Round robin over the runnable threads; each runs until it blocks or exits.
  size_t next = 0;
  while (b.live > 0) {
    Fiber* run = nullptr;
    for (size_t k = 0; k < b.fibers.size(); ++k) {
      Fiber& f = b.fibers[(next + k) % b.fibers.size()];
      if (f.state == Fiber::kRunnable) {
        run = &f;
        next = (next + k + 1) % b.fibers.size();
        break;
      }
    }
    if (run == nullptr) report_deadlock(b);
    b.current = run;
    threadIdx = run->tid;
    blockIdx = bid;
    blockDim = L.block;
    gridDim = L.grid;
    switch_context(&b.runner_sp, run->sp, run->stack, run->stack_bytes);
  }
  b.current = nullptr;
  for (Fiber& f : b.fibers) {
#if defined(__SANITIZE_ADDRESS__)
    // A thread's last frames never returned (it switched away for good), so their redzones are
    // still poisoned: clear them, or a later stack mapped at the same address would inherit them.
    __asan_unpoison_memory_region(f.stack, f.stack_bytes);
#endif
    munmap(f.stack, f.stack_bytes);
  }
  if (b.cluster->blocks.size() > 1) b.cluster->bar.arrive_and_drop();
  t_block = nullptr;
  t_launch = nullptr;
}

inline void* runner_main(void* p) {
  auto* a = static_cast<std::pair<const Launch*, Block*>*>(p);
  run_block(*a->first, *a->second);
  return nullptr;
}

inline cudaError_t run_grid(const cudaLaunchConfig_t& cfg, std::function<void()> body) {
  const dim3 g = cfg.gridDim, b = cfg.blockDim;
  const int64_t threads = int64_t{b.x} * b.y * b.z;
  const int64_t blocks = int64_t{g.x} * g.y * g.z;
  const unsigned k = simt_cluster_size(cfg);
  // What a GPU refuses at launch.
  if (threads < 1 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) return cudaErrorInvalidConfiguration;
  if (blocks < 1 || g.x > 2147483647u || g.y > 65535u || g.z > 65535u) return cudaErrorInvalidConfiguration;
  if (cfg.dynamicSmemBytes > config().shared_limit) return cudaErrorInvalidValue;
  if (k < 1 || k > config().max_cluster || g.x % k != 0 || (k > 1 && config().cc_major < 9)) {
    return cudaErrorInvalidConfiguration;
  }
  stats().launches += 1;
  stats().threads += blocks * threads;

  Launch L{std::move(body), g, b};
  // One cluster at a time; a cluster's blocks run on OS threads of their own, together.
  for (int64_t c = 0; c < blocks / k; ++c) {
    Cluster cl(static_cast<int>(k));
    for (unsigned r = 0; r < k; ++r) {
      cl.blocks.push_back(std::make_unique<Block>(static_cast<unsigned>(c * k + r), r, static_cast<int>(threads),
                                                  cfg.dynamicSmemBytes, &cl));
    }
    if (k == 1) {
      run_block(L, *cl.blocks[0]);
      continue;
    }
    std::vector<std::pair<const Launch*, Block*>> args;
    for (auto& blk : cl.blocks) args.emplace_back(&L, blk.get());
    std::vector<pthread_t> tids(k);
    for (unsigned r = 0; r < k; ++r) {
      if (pthread_create(&tids[r], nullptr, runner_main, &args[r]) != 0) fail("cannot start a thread");
    }
    for (unsigned r = 0; r < k; ++r) pthread_join(tids[r], nullptr);
  }
  return cudaSuccess;
}

}  // namespace simt
