#include "shardsafe/status.h"

#include <cerrno>
#include <cstring>

namespace shardsafe {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string_view ErrorDetailName(ErrorDetail detail) {
  switch (detail) {
    case ErrorDetail::kNone: return "";
    case ErrorDetail::kShapeMismatch: return "SHAPE_MISMATCH";
    case ErrorDetail::kDTypeMismatch: return "DTYPE_MISMATCH";
    case ErrorDetail::kNoSuchBucket: return "NO_SUCH_BUCKET";
  }
  return "";
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  Status s(code_, std::move(msg));
  s.detail_ = detail_;
  return s;
}

Status Status::WithDetail(ErrorDetail detail) const {
  Status s = *this;
  if (!ok()) s.detail_ = detail;
  return s;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status AlreadyExistsError(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
Status ResourceExhaustedError(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status UnimplementedError(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

Status ErrnoError(int err, std::string_view operation, std::string_view path) {
  std::string msg(operation);
  msg += " ";
  msg += path;
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return ResourceExhaustedError(std::move(msg));
    case ENOENT:
      return NotFoundError(std::move(msg));
    case EEXIST:
    case ENOTEMPTY:
      return AlreadyExistsError(std::move(msg));
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
    case ENOTDIR:
      return InvalidArgumentError(std::move(msg));
    case EACCES:
    case EPERM:
    case EROFS:
      return FailedPreconditionError(std::move(msg));
    default:
      return UnavailableError(std::move(msg));
  }
}

}  // namespace shardsafe
