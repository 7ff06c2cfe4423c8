// Test helpers for the tests of the engine and of what uses it (hf, the MPI
// programs): an element-by-element oracle for shard contents,
// threads-as-ranks runners, and temporary directories. They use the public
// API (include/shardsafe) only. The end of this header names them in
// namespace shardsafe, where those tests live, so no test repeats a `using`
// list of its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "shardsafe/checkpoint.h"
#include "shardsafe/filesystem.h"

namespace shardsafe::testing {

// Byte `b` of global element `e` of tensor `key`: a hash, so any misplaced
// byte shows.
inline std::byte OracleByte(const std::string& key, uint64_t e, int b) {
  uint64_t h = std::hash<std::string>{}(key) ^ (e * 0x9E3779B97F4A7C15ull) ^ (b * 0xBF58476D1CE4E5B9ull);
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return static_cast<std::byte>(h & 0xFF);
}

// Global row-major indices of the elements `slice` selects, in order.
inline std::vector<uint64_t> SliceElements(const Shape& shape, const Slice& slice) {
  const Box& box = slice.box;
  uint64_t volume = 1;
  for (uint64_t d : box.size) volume *= d;
  const uint64_t begin = slice.flat ? slice.flat->begin : 0;
  const uint64_t end = slice.flat ? slice.flat->end : volume;
  std::vector<uint64_t> out;
  out.reserve(end - begin);
  for (uint64_t i = begin; i < end; ++i) {
    uint64_t rest = i, global = 0, stride = 1;
    for (size_t d = box.size.size(); d-- > 0;) {
      const uint64_t idx = rest % box.size[d] + box.offset[d];
      rest /= box.size[d];
      global += idx * stride;
      stride *= shape[d];
    }
    out.push_back(global);
  }
  return out;
}

// The bytes of `slice` of tensor `key` per the oracle. Sub-byte dtypes are
// generated per packed byte: element groups are whole bytes (ValidateSlice).
inline std::vector<std::byte> OracleShard(const std::string& key, DType dtype, const Shape& shape,
                                          const Slice& slice) {
  const auto elems = SliceElements(shape, slice);
  std::vector<std::byte> out;
  const int bits = DTypeBits(dtype);
  if (bits >= 8) {
    for (uint64_t e : elems) {
      for (int b = 0; b < bits / 8; ++b) out.push_back(OracleByte(key, e, b));
    }
    return out;
  }
  // Sub-byte: a byte holds 8/bits... F4 packs 2 elements per byte, F6 4 per
  // 3 bytes; derive byte j of a group from the group's first element.
  const size_t group = bits == 4 ? 2 : 4, group_bytes = bits == 4 ? 1 : 3;
  for (size_t i = 0; i < elems.size(); i += group) {
    for (size_t b = 0; b < group_bytes; ++b) out.push_back(OracleByte(key, elems[i], static_cast<int>(b)));
  }
  return out;
}

// Runs fn(rank, comm) on `n` threads sharing a ThreadComm.
inline void RunRanks(int n, const std::function<void(int, Comm&)>& fn) {
  auto comms = MakeThreadComms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r, *comms[r]); });
  for (auto& t : threads) t.join();
}

// A manager save of step `step` on one process: tensor "w" = {1, 2, 3,
// step} and the value {"step": step}, so a load tells which step it read.
inline Status SaveManagerStep(CheckpointManager& m, int64_t step, SaveOptions options = {}) {
  auto comm = MakeSingleProcessComm();
  const float data[4] = {1, 2, 3, static_cast<float>(step)};
  SaveState state;
  state.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, data});
  state.values = "{\"step\":" + std::to_string(step) + "}";
  return m.Save(step, state, *comm, options).status();
}

// The tags ListCheckpoints gives for `root`, in its order; when it fails,
// one entry "error: STATUS" (which no expected list matches, and a test's
// failure message shows).
inline std::vector<std::string> ListedTags(const std::string& root) {
  auto list = ListCheckpoints(root);
  if (!list.ok()) return {"error: " + list.status().ToString()};
  std::vector<std::string> tags;
  for (const auto& c : *list) tags.push_back(c.tag);
  return tags;
}

// A fresh, empty directory under $TMPDIR (default /tmp).
inline std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/shardsafe-" + name + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

// XORs byte `at` of `file` with `mask` (a second call puts it back).
inline void FlipByte(const std::string& file, uint64_t at, char mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  const char old = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(old ^ mask));
}

// A FileSystem that forwards every call to `base`: tests that inject a
// fault override only the calls they change.
class ForwardingFileSystem : public FileSystem {
 public:
  explicit ForwardingFileSystem(FileSystem* base) : base_(base) {}
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const WriteOptions& o) override {
    return base_->NewWritableFile(p, o);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const ReadOptions& o) override {
    return base_->NewRandomAccessFile(p, o);
  }
  Result<FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  Result<std::vector<DirEntry>> ListDir(const std::string& p) override { return base_->ListDir(p); }
  Status CreateDir(const std::string& p) override { return base_->CreateDir(p); }
  Status RemoveFile(const std::string& p) override { return base_->RemoveFile(p); }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  Status Rename(const std::string& a, const std::string& b) override { return base_->Rename(a, b); }
  Status RenameExchange(const std::string& a, const std::string& b) override {
    return base_->RenameExchange(a, b);
  }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  Result<std::unique_ptr<FileLock>> TryLock(const std::string& p, LockMode mode) override {
    return base_->TryLock(p, mode);
  }
  bool IsObjectStore() const override { return base_->IsObjectStore(); }
  Status CreateFileExclusive(const std::string& p, std::string_view data) override {
    return base_->CreateFileExclusive(p, data);
  }
  Result<std::string> ReadFileVersioned(const std::string& p, uint64_t max,
                                        std::string* version) override {
    return base_->ReadFileVersioned(p, max, version);
  }
  Status ReplaceFileIfVersion(const std::string& p, std::string_view data,
                              const std::optional<std::string>& version) override {
    return base_->ReplaceFileIfVersion(p, data, version);
  }
  Status AbortUploadsBefore(const std::string& p, int64_t before) override {
    return base_->AbortUploadsBefore(p, before);
  }

 protected:
  FileSystem* const base_;
};

// A shard of the oracle tensor: owns its bytes, and views as a TensorShard.
struct OwnedShard {
  std::string key;
  DType dtype;
  Shape shape;
  Slice slice;
  std::vector<std::byte> bytes;
  TensorShard View() const { return {key, dtype, shape, slice, bytes.data()}; }
};

inline OwnedShard MakeShard(const std::string& key, DType dtype, const Shape& shape,
                            const Slice& slice) {
  return {key, dtype, shape, slice, OracleShard(key, dtype, shape, slice)};
}

// A load target with its own buffer, to compare against the oracle.
struct OwnedTarget {
  TensorTarget target;
  std::vector<std::byte> buffer;
};

inline OwnedTarget MakeTarget(const std::string& key, DType dtype, const Shape& shape,
                              const Slice& slice) {
  OwnedTarget t{{key, dtype, shape, slice, nullptr, false}, {}};
  t.buffer.assign(*NumBytes(dtype, slice.NumElements()) + 1, std::byte{0xEE});
  t.target.data = t.buffer.data();
  return t;
}

// True if the target's bytes equal the oracle's (and the guard byte after
// them is untouched).
inline bool MatchesOracle(const OwnedTarget& t) {
  auto want = OracleShard(t.target.key, t.target.dtype, t.target.shape, t.target.slice);
  return want.size() + 1 == t.buffer.size() &&
         std::equal(want.begin(), want.end(), t.buffer.begin()) &&
         t.buffer.back() == std::byte{0xEE};
}

}  // namespace shardsafe::testing

namespace shardsafe {

using testing::FlipByte;
using testing::ForwardingFileSystem;
using testing::ListedTags;
using testing::MakeShard;
using testing::MakeTarget;
using testing::MakeTempDir;
using testing::MatchesOracle;
using testing::OracleShard;
using testing::OwnedShard;
using testing::OwnedTarget;
using testing::RunRanks;
using testing::SaveManagerStep;

}  // namespace shardsafe
