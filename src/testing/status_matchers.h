// Checks of a failed Status or Result by what failed, for tests: a test that
// expects a failure names its code and a part of its message, so a failure
// for another reason (a typo in a path, a missing file) does not pass.
//
//   EXPECT_TRUE(IsError(ValidateSlice(...), StatusCode::kInvalidArgument, "exceeds shape"));
//
// On a mismatch the assertion's message shows the whole status.
#pragma once

#include <string_view>

#include "gtest/gtest.h"
#include "shardsafe/status.h"

namespace shardsafe::testing {

// Passes if `s` failed with `code` and its message holds `part` (any
// message when `part` is empty).
inline ::testing::AssertionResult IsError(const Status& s, StatusCode code,
                                          std::string_view part = {}) {
  if (!s.ok() && s.code() == code && s.message().find(part) != std::string_view::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << (s.ok() ? "OK" : s.ToString()) << ", wanted "
                                       << StatusCodeName(code) << " with \"" << part << "\"";
}

template <typename T>
::testing::AssertionResult IsError(const Result<T>& r, StatusCode code,
                                   std::string_view part = {}) {
  return IsError(r.status(), code, part);
}

}  // namespace shardsafe::testing

namespace shardsafe {
using testing::IsError;
}  // namespace shardsafe
