// Fuzzes the read paths over a whole checkpoint directory: the input is
// unframed (checkpoint_dir_framing.h) into shardsafe.json, commit.json, data
// files, or a foreign model.safetensors (+ its HF index), written as real
// files through DefaultFileSystem into one scratch directory reused per
// input (under /dev/shm when there is one). Then, as a reader would:
// OpenSource, VerifyCheckpoint, ReadBlob of every blob chunk, and two
// Loads on a one-rank comm, one of every tensor whole in its own dtype,
// one of part of each tensor converted to another dtype, unchecked, with a
// missing key (allow_partial). Any Status is fine; a crash, sanitizer
// report, hang or huge allocation (-malloc_limit_mb) is a bug.
//
// Targets are capped at kMaxTargetBytes per load (larger tensors are not
// requested), so that a hostile shape cannot make the fuzzer itself
// allocate; the engine's own allocations are not capped. With
// SHARDSAFE_FUZZ_VERBOSE=1 in the environment each step prints its outcome
// (to see what an input reaches: run the fuzzer on that one file).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint_dir_framing.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/source.h"
#include "shardsafe/tools.h"

namespace {

using namespace shardsafe;

constexpr uint64_t kMaxTargetBytes = uint64_t{4} << 20;

void Log(const char* step, const Status& s) {
  static const bool verbose = std::getenv("SHARDSAFE_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s: %s\n", step, s.ok() ? "OK" : s.ToString().c_str());
}

// The scratch checkpoint directory, created once; removed at exit.
const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string root = std::string(base) + "/shardsafe-fuzz-" + std::to_string(getpid());
    std::string d = JoinPath(root, "step-00000001");
    if (!CreateDirs(*DefaultFileSystem(), d).ok()) {
      std::fprintf(stderr, "cannot create %s\n", d.c_str());
      std::abort();
    }
    static std::string to_remove = root;
    std::atexit([] { DefaultFileSystem()->RemoveAll(to_remove).IgnoreError(); });
    return d;
  }();
  return dir;
}

void WriteFiles(const std::map<std::string, std::string>& files) {
  FileSystem& fs = *DefaultFileSystem();
  const std::string& dir = ScratchDir();
  fs.RemoveFile(JoinPath(dir, "shardsafe.json")).IgnoreError();
  for (const auto& [id, name] : fuzz::FramedFiles()) {
    fs.RemoveFile(JoinPath(dir, std::string(name))).IgnoreError();
  }
  for (const auto& [name, bytes] : files) {
    auto file = fs.NewWritableFile(JoinPath(dir, name), {});
    if (!file.ok() || !(*file)->Append(bytes.data(), bytes.size()).ok() || !(*file)->Close().ok()) {
      std::fprintf(stderr, "cannot write %s in %s\n", name.c_str(), dir.c_str());
      std::abort();
    }
  }
}

// Bytes of `n` elements of `dtype`, or nullopt (overflow, partial byte).
std::optional<uint64_t> BytesOf(DType dtype, uint64_t n) {
  auto b = NumBytes(dtype, n);
  return b.ok() ? std::optional<uint64_t>(*b) : std::nullopt;
}

// Targets own their memory here; LoadRequest points into it.
struct Request {
  LoadRequest req;
  std::vector<std::vector<char>> buffers;
  uint64_t bytes = 0;

  void Add(const std::string& key, DType dtype, const Shape& shape, const Slice& slice) {
    const auto n = BytesOf(dtype, slice.NumElements());
    if (!n || *n > kMaxTargetBytes - bytes) return;
    bytes += *n;
    buffers.emplace_back(*n);
    req.tensors.push_back({key, dtype, shape, slice, buffers.back().data()});
  }
};

// Part of a tensor: the second half of its rows, then the middle third of
// that box's elements; the whole tensor when that is not a valid slice.
Slice PartOf(const Shape& shape, DType dtype) {
  Slice s{Box::Whole(shape), std::nullopt};
  if (!shape.empty() && shape[0] >= 2) {
    s.box.offset[0] = shape[0] / 2;
    s.box.size[0] = shape[0] - shape[0] / 2;
  }
  const uint64_t n = s.NumElements();
  if (n >= 3) s.flat = FlatRange{n / 3, n - n / 3};
  if (!ValidateSlice(s, shape, dtype).ok()) return Slice{Box::Whole(shape), std::nullopt};
  return s;
}

constexpr DType kConvertTo[] = {DType::kF32, DType::kI32, DType::kBF16,
                                DType::kF16, DType::kI8,  DType::kBool};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteFiles(fuzz::Unframe({reinterpret_cast<const char*>(data), size}));
  FileSystem& fs = *DefaultFileSystem();
  const std::string& dir = ScratchDir();
  static const std::unique_ptr<Comm> comm = MakeSingleProcessComm();

  const VerifyReport report = VerifyCheckpoint(dir, &fs, /*io_threads=*/1);
  for (const std::string& fault : report.faults) Log("verify", DataLossError(fault));

  Result<CheckpointSource> src = OpenSource(fs, dir);
  Log("open", src.status());
  if (!src.ok()) return 0;
  for (const auto& [name, blob] : src->index.blobs) {
    for (const IndexBlobChunk& chunk : blob.chunks) {
      std::string out;
      Log("blob", ReadBlob(fs, *src, name, chunk, &out));
    }
  }

  // Every tensor whole, as saved, checksums verified.
  Request whole;
  for (const auto& [key, t] : src->index.tensors) {
    whole.Add(key, t.dtype, t.shape, Slice{Box::Whole(t.shape), std::nullopt});
  }
  LoadOptions options;
  options.io_threads = 1;
  options.share_reads = false;
  options.shared_memory = false;
  Log("load whole", Load(whole.req, dir, *comm, options).status());

  // Parts, converted where the engine can, not verified (so corrupt bytes
  // reach the conversions), plus a key the checkpoint lacks.
  Request part;
  size_t i = 0;
  for (const auto& [key, t] : src->index.tensors) {
    DType to = kConvertTo[i++ % std::size(kConvertTo)];
    if (!CanConvert(t.dtype, to)) to = t.dtype;
    part.Add(key, to, t.shape, PartOf(t.shape, t.dtype));
  }
  part.Add("fuzz.not.in.checkpoint", DType::kF32, {2}, Slice{Box::Whole({2}), std::nullopt});
  options.verify_checksums = false;
  options.convert_dtypes = true;
  options.allow_partial = true;
  options.direct_io = false;
  Log("load part", Load(part.req, dir, *comm, options).status());
  return 0;
}
