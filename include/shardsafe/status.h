// Status and Result<T>: how every shardsafe operation reports failure.
//
// I/O failure is an expected outcome in checkpointing (full disk, preempted
// job, torn file), so it is part of every signature that touches storage or
// parses bytes. A Status carries a canonical code and a message; each layer
// that passes a failure up adds its own context in front, so the final
// message reads like a path to the fault:
//
//   loading "layers.3.w1" chunk [0:512, 0:4096] from data-00002-000.safetensors:
//   checksum mismatch
//
// Programming errors (broken invariants) are assertions, not Status.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace shardsafe {

// Canonical error codes, with their usual (abseil / gRPC) meanings.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad caller input or layout
  kNotFound,            // file, checkpoint or tensor missing
  kAlreadyExists,       // target of a save exists
  kFailedPrecondition,  // e.g. checkpoint not committed
  kDataLoss,            // corrupt or truncated data, checksum mismatch
  kResourceExhausted,   // disk full, memory budget exceeded
  kUnavailable,         // retryable I/O failure
  kUnimplemented,       // valid request we do not support
  kInternal,            // our bug
};

std::string_view StatusCodeName(StatusCode code);

// Which failure of its code a status reports, where callers tell them apart
// (the Python package raises ShapeMismatchError / DTypeMismatchError for
// these InvalidArgument statuses, and looks for no other tool's checkpoint
// in a bucket that does not exist). Carried through WithContext and between
// ranks; most statuses have none.
enum class ErrorDetail : uint8_t {
  kNone = 0,
  kShapeMismatch,  // a target's shape differs from the checkpoint's
  kDTypeMismatch,  // a target's dtype differs and cannot (or may not) be converted
  kNoSuchBucket,   // an object-store path's bucket does not exist (NotFound)
};
// The highest value, for decoders of statuses sent between ranks.
inline constexpr ErrorDetail kLastErrorDetail = ErrorDetail::kNoSuchBucket;

std::string_view ErrorDetailName(ErrorDetail detail);  // "", "SHAPE_MISMATCH", ...

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  ErrorDetail detail() const { return detail_; }

  // Returns a copy that reports `detail`.
  Status WithDetail(ErrorDetail detail) const;

  // Returns a copy with "context: " in front of the message. OK stays OK.
  Status WithContext(std::string_view context) const;

  // "DATA_LOSS: message" (or "OK").
  std::string ToString() const;

  // Explicitly discards a status whose failure does not matter (best-effort
  // cleanup). Greppable, unlike a cast to void.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_ && a.detail_ == b.detail_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  ErrorDetail detail_ = ErrorDetail::kNone;
};

// Constructors that read like the code they produce.
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status FailedPreconditionError(std::string message);
Status DataLossError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnavailableError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);

// Maps an errno value from a failed system call to a Status naming the
// operation and path: ENOSPC/EDQUOT -> ResourceExhausted, ENOENT -> NotFound,
// EEXIST -> AlreadyExists, EINTR/EAGAIN/EIO -> Unavailable, EACCES/EINVAL ->
// InvalidArgument/FailedPrecondition, anything else -> Unavailable.
Status ErrnoError(int err, std::string_view operation, std::string_view path);

// Either a value or a non-OK Status. Accessing the value of a failed Result
// is a programming error (asserts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

namespace internal {
inline Status AsStatus(Status s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace shardsafe

#define SS_CONCAT_INNER(a, b) a##b
#define SS_CONCAT(a, b) SS_CONCAT_INNER(a, b)

// Returns the status of `expr` from the enclosing function if it failed.
#define SS_RETURN_IF_ERROR(expr)                                           \
  do {                                                                     \
    ::shardsafe::Status ss_status_ = ::shardsafe::internal::AsStatus(expr); \
    if (!ss_status_.ok()) return ss_status_;                               \
  } while (0)

// Evaluates `rexpr` (a Result<T>); on failure returns its status, else moves
// the value into `lhs` (which may be a declaration: `auto x`).
#define SS_ASSIGN_OR_RETURN(lhs, rexpr) \
  SS_ASSIGN_OR_RETURN_IMPL(SS_CONCAT(ss_result_, __LINE__), lhs, rexpr)
#define SS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                             \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
