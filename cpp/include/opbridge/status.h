// opbridge: framework-free status type returned by every kernel and check.
#pragma once

#include <string>
#include <utility>

namespace opbridge {

// What went wrong, coarse enough for both torch (exception type) and ORT (OrtErrorCode).
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad shape, attribute or value supplied by the caller
  kTypeError,        // an argument of the wrong element type (torch: TypeError)
  kNotImplemented,   // a dtype or configuration this build does not support
  kRuntimeError,     // a failure while computing (e.g. a CUDA error)
  kLinAlgError,      // a matrix the computation needs to invert is singular (torch:
                     // torch.linalg.LinAlgError; ORT and opbridge._core: a runtime error)
};

// Result of a kernel or a check. Kernels never throw; adapters translate a non-ok Status into
// a torch exception or an OrtStatus.
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status TypeError(std::string m) { return {StatusCode::kTypeError, std::move(m)}; }
  static Status NotImplemented(std::string m) { return {StatusCode::kNotImplemented, std::move(m)}; }
  static Status RuntimeError(std::string m) { return {StatusCode::kRuntimeError, std::move(m)}; }
  static Status LinAlgError(std::string m) { return {StatusCode::kLinAlgError, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace opbridge

// Returns early from the enclosing function when `expr` yields a non-ok Status.
#define OPBRIDGE_RETURN_IF_ERROR(expr)          \
  do {                                          \
    ::opbridge::Status _opbridge_st = (expr);   \
    if (!_opbridge_st.ok()) return _opbridge_st; \
  } while (0)
