// Helpers shared by the storage tests: scratch directories and test data.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "shardsafe/filesystem.h"

namespace shardsafe::testing {

// A fresh directory under `parent`, removed with everything in it at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& parent) {
    std::string tmpl = parent + "/ss_storage_test.XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ScratchDir() {
    if (!path_.empty()) DefaultFileSystem()->RemoveAll(path_).IgnoreError();
  }
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return JoinPath(path_, name); }

 private:
  std::string path_;
};

// The project's own disk (where O_DIRECT works): the test's working directory.
inline std::string DiskParent() { return std::filesystem::current_path().string(); }
// tmpfs, where O_DIRECT is refused.
inline std::string TmpfsParent() { return "/dev/shm"; }

// `n` pseudo-random bytes, different for each seed.
inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    memcpy(&s[i], &x, 8);
  }
  for (; i < n; ++i) s[i] = static_cast<char>(rng());
  return s;
}

}  // namespace shardsafe::testing
