// opbridge: the caller's parallel-for, handed to CPU kernels.
//
// Kernels never start threads of their own: torch passes at::parallel_for (respecting
// torch.set_num_threads), ORT passes its intra-op thread pool (KernelContext_ParallelFor).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace opbridge {

class ParallelFor {
 public:
  // body(body_ctx, begin, end) processes the half-open range [begin, end).
  using Body = void (*)(void* body_ctx, int64_t begin, int64_t end);
  // run(self, n, grain, body, body_ctx) must call body on disjoint ranges covering [0, n),
  // each at least `grain` long except possibly the last, and return when all are done.
  using Runner = void (*)(void* self, int64_t n, int64_t grain, Body body, void* body_ctx);

  // Serial by default: one call covering [0, n).
  ParallelFor() = default;
  ParallelFor(Runner run, void* self) : run_(run), self_(self) {}

  // Calls f(begin, end) over [0, n). `grain` is the smallest range worth a task of its own.
  template <class F>
  void operator()(int64_t n, int64_t grain, F&& f) const {
    if (n <= 0) return;
    using Fn = std::remove_reference_t<F>;
    Body body = [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); };
    if (run_ == nullptr || n <= grain) {
      f(int64_t{0}, n);
    } else {
      run_(self_, n, grain < 1 ? 1 : grain, body, const_cast<void*>(static_cast<const void*>(&f)));
    }
  }

 private:
  Runner run_ = nullptr;
  void* self_ = nullptr;
};

}  // namespace opbridge
