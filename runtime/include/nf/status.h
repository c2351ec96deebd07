// Status and StatusOr: the error-reporting convention of nf's C++ code.
//
// Errors are values, never exceptions, so that the C API can hand them across
// without translation. A message is one line that names the file or object at
// fault and the problem, e.g. "model.safetensors: header length 999 exceeds
// file size 12".
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace nf {

class [[nodiscard]] Status {
public:
  static Status success() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    s.failed_ = true;
    return s;
  }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string &message() const { return message_; }

private:
  bool failed_ = false;
  std::string message_;
};

template <typename T> class [[nodiscard]] StatusOr {
public:
  StatusOr(T value) : value_(std::move(value)) {}
  StatusOr(Status status) : status_(std::move(status)) {
    assert(!status_.ok() && "StatusOr built from a success status");
  }
  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Status &status() const { return status_; }
  const std::string &message() const { return status_.message(); }
  T &value() & { return *value_; }
  const T &value() const & { return *value_; }
  T &&value() && { return std::move(*value_); }
  T *operator->() { return &*value_; }
  const T *operator->() const { return &*value_; }
  T &operator*() & { return *value_; }
  const T &operator*() const & { return *value_; }

private:
  Status status_;
  std::optional<T> value_;
};

} // namespace nf
