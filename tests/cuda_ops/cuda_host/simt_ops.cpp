// Runs opbridge's CUDA launchers on the CPU: the kernel files themselves (ops/*/*_kernel.cu,
// compiled with the host compiler against the runtime emulation in tests/cuda_ops/cuda_host/sim/), called
// directly, or through the ops' CUDA compute functions as the generic torch and ORT kernels call
// them (OP_compute: a KernelCall of the checked call, opbridge/kernel.h), for
// tests/cuda_ops/test_cuda_host.py. Built with AddressSanitizer and UndefinedBehaviorSanitizer under
// OPBRIDGE_CUDA_HOST_SANITIZE=1.
//
//   simt_ops OP TYPE SMS CC IN OUT
//     OP    inverse | group_norm | ms_deform_attn, or the same with _compute (same IN; OUT starts
//           with the compute functions' status codes instead of the launchers' errors), or any
//           other declared op's name (run_declared: its compute function, TYPE unused)
//     TYPE  float | double | half | bfloat16 (inverse: float | double)
//     SMS   the emulated device's SM count (small counts make the grid-stride loops wrap)
//     CC    its compute capability as major * 10 + minor (>= 90: thread-block clusters)
// Every "device" buffer has exactly the size the launcher may touch (outputs pre-filled with
// 0xff bytes, so an element never written reads NaN). Values travel as float64 in both files;
// inputs must be exactly representable in TYPE.
//
// inverse         IN:  int64 batch, n, nan_on_singular, in_place; float64 a[batch * n * n]
//                 OUT: int64 error, int64 info, float64 out[batch * n * n]
// group_norm      IN:  int64 N, C, S, G, channels_last, activation, has_weight, has_bias,
//                      offset (elements x and y start past a 16-byte boundary); float64 eps,
//                      x[N * C * S] (memory order), weight[C], bias[C]
//                 OUT: int64 error, float64 y[N * C * S]
// ms_deform_attn  IN:  int64 N, S, M, D, Lq, L, P, spatial_shapes[L][2], level_start_index[L],
//                      own_workspace (1: the caller passes the backward's workspace, 0: the
//                      launcher allocates it); float64 value, sampling_locations,
//                      attention_weights, grad_output
//                 OUT: int64 forward error, backward error; float64 output, grad_value,
//                      grad_sampling_locations, grad_attention_weights
// Prints "launches=K threads=T" (what the emulation ran) and a line "kernel=OFFSET" per kernel
// launched (its address in this executable) on stderr.
#include <dlfcn.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/launch.cuh"
#include "opbridge/dtype.h"
#include "opbridge/kernel.h"
#include "ops/group_norm/group_norm.cuh"
#include "ops/inverse/inverse.cuh"
#include "ops/inverse/inverse.h"
#include "ops/ms_deform_attn/ms_deform_attn.cuh"

namespace {

using opbridge::BFloat16;
using opbridge::Half;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "simt_ops: %s\n", what);
  std::exit(2);
}

// Device memory: exactly `count` elements after `offset` slack elements.
template <class T>
struct Buffer {
  void* mem = nullptr;
  T* p = nullptr;
  size_t n = 0;
  Buffer(size_t count, size_t offset = 0, bool poison = true) : n(count) {
    if (posix_memalign(&mem, 64, (count + offset) * sizeof(T) + (count + offset == 0 ? 1 : 0)) != 0) die("oom");
    p = static_cast<T*>(mem) + offset;
    std::memset(mem, poison ? 0xff : 0, (count + offset) * sizeof(T));
  }
  ~Buffer() { std::free(mem); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{opbridge::float_to_half(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{opbridge::float_to_bf16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half>) {
    return opbridge::half_to_float(v.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return opbridge::bf16_to_float(v.bits);
  } else {
    return static_cast<double>(v);
  }
}

struct Io {
  FILE* in;
  FILE* out;
  std::vector<int64_t> ints(size_t n) {
    std::vector<int64_t> v(n);
    if (n && std::fread(v.data(), 8, n, in) != n) die("short input");
    return v;
  }
  std::vector<double> doubles(size_t n) {
    std::vector<double> v(n);
    if (n && std::fread(v.data(), 8, n, in) != n) die("short input");
    return v;
  }
  template <class T>
  void read(Buffer<T>& b) {
    const std::vector<double> v = doubles(b.n);
    for (size_t i = 0; i < b.n; ++i) b.p[i] = from_double<T>(v[i]);
  }
  void put(int64_t v) { std::fwrite(&v, 8, 1, out); }
  template <class T>
  void write(const Buffer<T>& b) {
    for (size_t i = 0; i < b.n; ++i) {
      const double d = to_double(b.p[i]);
      std::fwrite(&d, 8, 1, out);
    }
  }
};

cudaStream_t the_stream() {
  // Any non-null handle: the emulation runs every stream in order.
  static char s;
  return reinterpret_cast<cudaStream_t>(&s);
}

// ---- the CUDA compute functions, as the generic adapters call them -----------------------------

// Scratch "device" memory: exactly the bytes asked for (so that an overrun is an ASan error).
class Scratch final : public opbridge::KernelHost {
 public:
  void* scratch(size_t bytes) override {
    blocks_.push_back(std::make_unique<Buffer<unsigned char>>(bytes));
    return blocks_.back()->p;
  }
  void* output(size_t, const std::vector<int64_t>&) override {
    throw std::logic_error("no op emulated here sizes its outputs itself");
  }

 private:
  std::vector<std::unique_ptr<Buffer<unsigned char>>> blocks_;
};

// Checks the call with its declaration, then runs the op's registered CUDA compute function on
// the emulated stream; returns the status code (its message on stderr).
int64_t run_compute(const opbridge::OpCall& call, const std::vector<const void*>& in, const std::vector<void*>& out,
                    bool channels_last) {
  opbridge::ComputeFn fn = nullptr;
  for (const opbridge::OpKernel& k : opbridge::registered_kernels()) {
    if (&k.decl() == &call.decl() && k.device == opbridge::Device::kCuda) fn = k.compute;
  }
  if (fn == nullptr) die("no CUDA compute function registered for the op");
  opbridge::Status st = opbridge::check_call(call);
  if (st.ok()) {
    Scratch scratch;
    opbridge::KernelCall::Services s;
    s.stream = the_stream();
    s.channels_last = channels_last;
    s.host = &scratch;
    st = fn(opbridge::KernelCall(call, opbridge::Device::kCuda, in.data(), out.data(), s));
  }
  if (!st.ok()) std::fprintf(stderr, "status %d: %s\n", static_cast<int>(st.code()), st.message().c_str());
  return static_cast<int64_t>(st.code());
}

template <class T>
opbridge::TensorArg tensor(std::vector<int64_t> shape, const void* host_data = nullptr) {
  opbridge::TensorArg t;
  t.present = true;
  t.type = opbridge::elem_type_of<T>();
  t.shape = std::move(shape);
  t.data = host_data;
  return t;
}

template <class T>
int run_inverse(Io& io, bool compute) {
  const std::vector<int64_t> h = io.ints(4);
  const int64_t batch = h[0], n = h[1];
  const bool nan_on_singular = h[2] != 0, in_place = h[3] != 0;
  const size_t count = static_cast<size_t>(batch * n * n);
  Buffer<T> a(count), out(in_place ? 0 : count);
  io.read(a);
  if (compute) {
    if (in_place) die("inverse_compute: the adapters never run in place");
    opbridge::OpCall call(opbridge::inverse_decl());
    call.in("x") = tensor<T>({batch, n, n});
    call.set_string("on_singular", nan_on_singular ? "nan" : "raise");
    io.put(run_compute(call, {a.p}, {out.p}, false));
    io.put(0);
    io.write(out);
    return 0;
  }
  Buffer<uint64_t> info(1);
  const size_t ws_bytes = opbridge::cuda::inverse_workspace_bytes<T>(batch, n);
  Buffer<unsigned char> ws(ws_bytes);
  T* dst = in_place ? a.p : out.p;
  const cudaError_t e = opbridge::cuda::launch_inverse<T>(the_stream(), a.p, dst, batch, n, info.p,
                                                          ws_bytes > 0 ? ws.p : nullptr, ws_bytes, nan_on_singular);
  io.put(e);
  io.put(static_cast<int64_t>(*info.p));
  io.write(in_place ? a : out);
  return 0;
}

template <class T>
int run_group_norm(Io& io, bool compute) {
  const std::vector<int64_t> h = io.ints(9);
  opbridge::GroupNormDims d;
  d.N = h[0];
  d.C = h[1];
  d.S = h[2];
  d.G = h[3];
  d.channels_last = h[4] != 0;
  const auto act = static_cast<opbridge::Activation>(h[5]);
  const bool has_w = h[6] != 0, has_b = h[7] != 0;
  const size_t offset = static_cast<size_t>(h[8]);
  const double eps = io.doubles(1)[0];
  const size_t count = static_cast<size_t>(d.N * d.C * d.S);
  Buffer<T> x(count, offset), y(count, offset), w(static_cast<size_t>(d.C)), b(static_cast<size_t>(d.C));
  io.read(x);
  io.read(w);
  io.read(b);
  if (compute) {
    // x's logical shape (N, C, S); channels_last: its memory is (N, S, C).
    opbridge::OpCall call(opbridge::group_norm_decl());
    call.in("x") = tensor<T>({d.N, d.C, d.S});
    if (has_w) call.in("weight") = tensor<T>({d.C});
    if (has_b) call.in("bias") = tensor<T>({d.C});
    call.set_int("num_groups", d.G);
    call.set_float("eps", eps);
    call.set_string("activation", opbridge::activation_name(act));
    io.put(run_compute(call, {x.p, has_w ? w.p : nullptr, has_b ? b.p : nullptr}, {y.p}, d.channels_last));
    io.write(y);
    return 0;
  }
  const size_t ws_bytes = opbridge::cuda::group_norm_workspace_bytes<T>(d);
  Buffer<unsigned char> ws(ws_bytes);
  opbridge::GroupNormParams p;
  p.d = d;
  p.eps = eps;
  p.act = act;
  const cudaError_t e = opbridge::cuda::launch_group_norm<T>(the_stream(), x.p, has_w ? w.p : nullptr,
                                                             has_b ? b.p : nullptr, y.p, p,
                                                             ws_bytes > 0 ? ws.p : nullptr, ws_bytes);
  io.put(e);
  io.write(y);
  return 0;
}

template <class T>
int run_ms_deform_attn(Io& io, bool compute) {
  const std::vector<int64_t> h = io.ints(7);
  opbridge::MsDeformAttnDims d;
  d.N = h[0];
  d.S = h[1];
  d.M = h[2];
  d.D = h[3];
  d.Lq = h[4];
  d.L = h[5];
  d.P = h[6];
  const std::vector<int64_t> shapes = io.ints(static_cast<size_t>(2 * d.L));
  const std::vector<int64_t> starts = io.ints(static_cast<size_t>(d.L));
  const bool own_workspace = io.ints(1)[0] != 0;
  const size_t nv = static_cast<size_t>(d.N * d.S * d.M * d.D);
  const size_t nw = static_cast<size_t>(d.N * d.Lq * d.M * d.L * d.P);
  const size_t no = static_cast<size_t>(d.N * d.Lq * d.M * d.D);
  Buffer<T> value(nv), loc(2 * nw), attn(nw), grad_out(no), out(no), gv(nv), gloc(2 * nw), gattn(nw);
  io.read(value);
  io.read(loc);
  io.read(attn);
  io.read(grad_out);
  if (compute) {
    // The forward's and the backward's compute functions (the backward's workspace from the
    // adapter's scratch, own_workspace or not).
    opbridge::OpCall fwd(opbridge::ms_deform_attn_decl());
    fwd.in("value") = tensor<T>({d.N, d.S, d.M, d.D});
    fwd.in("spatial_shapes") = tensor<int64_t>({d.L, 2}, shapes.data());
    fwd.in("level_start_index") = tensor<int64_t>({d.L}, starts.data());
    fwd.in("sampling_locations") = tensor<T>({d.N, d.Lq, d.M, d.L, d.P, 2});
    fwd.in("attention_weights") = tensor<T>({d.N, d.Lq, d.M, d.L, d.P});
    opbridge::OpCall bwd(opbridge::ms_deform_attn_backward_decl());
    for (const char* name : {"value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"}) {
      bwd.in(name) = fwd.in(name);
    }
    bwd.in("grad_output") = tensor<T>({d.N, d.Lq, d.M * d.D});
    io.put(run_compute(fwd, {value.p, shapes.data(), starts.data(), loc.p, attn.p}, {out.p}, false));
    io.put(run_compute(bwd, {grad_out.p, value.p, shapes.data(), starts.data(), loc.p, attn.p}, {gv.p, gloc.p, gattn.p},
                       false));
    io.write(out);
    io.write(gv);
    io.write(gloc);
    io.write(gattn);
    return 0;
  }
  const cudaError_t ef = opbridge::cuda::launch_ms_deform_attn<T>(the_stream(), value.p, shapes.data(), starts.data(),
                                                                  loc.p, attn.p, out.p, d);
  cudaError_t eb;
  if (own_workspace) {
    const size_t ws_bytes = opbridge::cuda::ms_deform_attn_backward_workspace_bytes<T>(d);
    Buffer<unsigned char> ws(ws_bytes);
    eb = opbridge::cuda::launch_ms_deform_attn_backward<T>(the_stream(), grad_out.p, value.p, shapes.data(),
                                                           starts.data(), loc.p, attn.p, gv.p, gloc.p, gattn.p, d,
                                                           ws_bytes > 0 ? ws.p : nullptr, ws_bytes);
  } else {
    eb = opbridge::cuda::launch_ms_deform_attn_backward<T>(the_stream(), grad_out.p, value.p, shapes.data(),
                                                           starts.data(), loc.p, attn.p, gv.p, gloc.p, gattn.p, d);
  }
  io.put(ef);
  io.put(eb);
  io.write(out);
  io.write(gv);
  io.write(gloc);
  io.write(gattn);
  return 0;
}

// Any other declared op with a CUDA compute function (the point-cloud ops), generically:
//   IN:  int64 inputs; per input: int64 elem_type (ONNX number), rank, dims[rank], then
//        float64 data[numel]; int64 attrs; per attribute (declaration order): float64 value
//   OUT: int64 status; per output: float64 data[numel]
// Index inputs travel as float64 too (exact below 2^53).
size_t elem_size(opbridge::ElemType t) {
  switch (t) {
    case opbridge::ElemType::kFloat32: case opbridge::ElemType::kInt32: return 4;
    case opbridge::ElemType::kFloat64: case opbridge::ElemType::kInt64: return 8;
    case opbridge::ElemType::kFloat16: case opbridge::ElemType::kBFloat16: return 2;
    default: die("unsupported element type");
  }
}

void store(opbridge::ElemType t, void* p, size_t i, double v) {
  switch (t) {
    case opbridge::ElemType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case opbridge::ElemType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case opbridge::ElemType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case opbridge::ElemType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case opbridge::ElemType::kFloat16: static_cast<Half*>(p)[i] = from_double<Half>(v); break;
    case opbridge::ElemType::kBFloat16: static_cast<BFloat16*>(p)[i] = from_double<BFloat16>(v); break;
    default: die("unsupported element type");
  }
}

double load(opbridge::ElemType t, const void* p, size_t i) {
  switch (t) {
    case opbridge::ElemType::kFloat32: return static_cast<const float*>(p)[i];
    case opbridge::ElemType::kFloat64: return static_cast<const double*>(p)[i];
    case opbridge::ElemType::kInt32: return static_cast<const int32_t*>(p)[i];
    case opbridge::ElemType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case opbridge::ElemType::kFloat16: return to_double(static_cast<const Half*>(p)[i]);
    case opbridge::ElemType::kBFloat16: return to_double(static_cast<const BFloat16*>(p)[i]);
    default: die("unsupported element type");
  }
}

int run_declared(const std::string& op, Io& io) {
  const opbridge::OpDecl* decl = nullptr;
  for (const opbridge::OpKernel& k : opbridge::registered_kernels()) {
    if (k.device == opbridge::Device::kCuda && k.decl().name() == op) decl = &k.decl();
  }
  if (decl == nullptr) die("unknown OP");
  opbridge::OpCall call(*decl);
  const int64_t n_in = io.ints(1)[0];
  if (n_in != static_cast<int64_t>(call.input_count())) die("wrong number of inputs");
  std::vector<std::unique_ptr<Buffer<unsigned char>>> bufs;
  std::vector<const void*> in;
  for (int64_t i = 0; i < n_in; ++i) {
    const std::vector<int64_t> h = io.ints(2);
    opbridge::TensorArg& t = call.input(static_cast<size_t>(i));
    t.present = true;
    t.type = static_cast<opbridge::ElemType>(h[0]);
    t.shape = io.ints(static_cast<size_t>(h[1]));
    const size_t n = static_cast<size_t>(t.numel());
    bufs.push_back(std::make_unique<Buffer<unsigned char>>(n * elem_size(t.type)));
    const std::vector<double> v = io.doubles(n);
    for (size_t e = 0; e < n; ++e) store(t.type, bufs.back()->p, e, v[e]);
    in.push_back(bufs.back()->p);
  }
  const int64_t n_attr = io.ints(1)[0];
  if (n_attr != static_cast<int64_t>(call.attr_count())) die("wrong number of attributes");
  for (int64_t a = 0; a < n_attr; ++a) {
    const double v = io.doubles(1)[0];
    opbridge::AttrValue& av = call.attr(static_cast<size_t>(a));
    if (av.type == opbridge::AttrType::kFloat) av.f = v; else av.i = static_cast<int64_t>(v);
  }
  std::vector<void*> out;
  std::vector<std::vector<int64_t>> shapes;
  const opbridge::Status st = opbridge::check_call(call);
  if (!st.ok()) {
    std::fprintf(stderr, "status %d: %s\n", static_cast<int>(st.code()), st.message().c_str());
    io.put(static_cast<int64_t>(st.code()));
    return 0;
  }
  for (size_t o = 0; o < decl->outputs().size(); ++o) {
    shapes.push_back(opbridge::output_shape(call, o));
    size_t n = 1;
    for (int64_t d : shapes.back()) n *= static_cast<size_t>(d);
    bufs.push_back(std::make_unique<Buffer<unsigned char>>(n * elem_size(opbridge::output_type(call, o))));
    out.push_back(bufs.back()->p);
  }
  io.put(run_compute(call, in, out, false));
  for (size_t o = 0; o < out.size(); ++o) {
    size_t n = 1;
    for (int64_t d : shapes[o]) n *= static_cast<size_t>(d);
    for (size_t e = 0; e < n; ++e) {
      const double d = load(opbridge::output_type(call, o), out[o], e);
      std::fwrite(&d, 8, 1, io.out);
    }
  }
  return 0;
}

template <template <class> class Run, bool kHalfTypes>
int dispatch(const std::string& type, Io& io, bool compute) {
  if (type == "float") return Run<float>::go(io, compute);
  if (type == "double") return Run<double>::go(io, compute);
  if constexpr (kHalfTypes) {
    if (type == "half") return Run<Half>::go(io, compute);
    if (type == "bfloat16") return Run<BFloat16>::go(io, compute);
  }
  die("unknown TYPE");
}

template <class T> struct Inverse { static int go(Io& io, bool c) { return run_inverse<T>(io, c); } };
template <class T> struct GroupNorm { static int go(Io& io, bool c) { return run_group_norm<T>(io, c); } };
template <class T> struct MsDeformAttn { static int go(Io& io, bool c) { return run_ms_deform_attn<T>(io, c); } };

void on_alarm(int) {
  const char msg[] = "simt_ops: no result within the time limit (a barrier that not every thread reaches?)\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) die("usage: simt_ops OP TYPE SMS CC IN OUT");
  std::string op = argv[1];
  const std::string type = argv[2];
  const std::string suffix = "_compute";
  const bool compute = op.size() > suffix.size() && op.compare(op.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (compute) op.resize(op.size() - suffix.size());
  simt::config().sm_count = std::atoi(argv[3]);
  simt::config().cc_major = std::atoi(argv[4]) / 10;
  simt::config().cc_minor = std::atoi(argv[4]) % 10;
  std::signal(SIGALRM, on_alarm);
  alarm(600);
  Io io{std::fopen(argv[5], "rb"), std::fopen(argv[6], "wb")};
  if (io.in == nullptr || io.out == nullptr) die("cannot open IN or OUT");
  int rc;
  if (op == "inverse") {
    rc = dispatch<Inverse, false>(type, io, compute);
  } else if (op == "group_norm") {
    rc = dispatch<GroupNorm, true>(type, io, compute);
  } else if (op == "ms_deform_attn") {
    rc = dispatch<MsDeformAttn, true>(type, io, compute);
  } else {
    rc = run_declared(op, io);
  }
  std::fclose(io.in);
  std::fclose(io.out);
  std::fprintf(stderr, "launches=%lld threads=%lld\n", static_cast<long long>(simt::stats().launches.load()),
               static_cast<long long>(simt::stats().threads.load()));
  // The kernels that ran, as offsets into this executable (the test names them with nm).
  for (const void* k : simt::stats().kernels) {
    Dl_info info;
    if (dladdr(k, &info) != 0) {
      std::fprintf(stderr, "kernel=%#llx\n", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(k) -
                                                                           reinterpret_cast<uintptr_t>(info.dli_fbase)));
    }
  }
  return rc;
}
