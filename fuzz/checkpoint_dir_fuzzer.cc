// Fuzzes the read paths over a checkpoint root: the input is unframed
// (checkpoint_dir_framing.h) into the files of checkpoint step-00000001
// (shardsafe.json, commit.json, data files, or a foreign model.safetensors
// + its HF index), of a second checkpoint step-00000002 and a `latest`
// pointer, some of them perhaps links, directories or FIFOs where files
// belong, made in one scratch root reused per input (under /dev/shm when
// there is one). Then, as a reader of the
// checkpoint would: VerifyCheckpoint (with its commit record, per-rank
// values and values), OpenSource, ReadBlob of every blob chunk, and two
// Loads on a one-rank comm, one of every tensor whole in its own dtype,
// one of part of each tensor converted to another dtype, unchecked, with a
// missing key (allow_partial). And as a reader of the root would:
// ListCheckpoints (commit records, `latest`, commit order),
// VerifyCheckpoint of the root (every checkpoint's commit record, then its
// latest) and a Load of the root (its latest resolved: every tensor whole
// when that is the second checkpoint). Last, retention as a manager keeping
// one checkpoint runs it (CheckpointManager::Prune), which must remove none
// of those it promises to keep (the latest, the one `latest` names, the
// newest in commit order, any whose order is unknown): removing one aborts.
// Otherwise any Status is fine; a crash, sanitizer report, hang or huge
// allocation (-malloc_limit_mb) is a bug.
//
// A link whose target resolves outside the scratch root (a device, /proc,
// anything on the machine) is repointed at a decoy file beside the root
// (which "../../outside" names from a checkpoint directory), so that links
// out of a checkpoint are still tried without the engine opening whatever
// a mutation names.
//
// Targets are capped at kMaxTargetBytes per load (larger tensors are not
// requested), so that a hostile shape cannot make the fuzzer itself
// allocate; the engine's own allocations are not capped. With
// SHARDSAFE_FUZZ_VERBOSE=1 in the environment each step prints its outcome
// (to see what an input reaches: run the fuzzer on that one file).
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
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

// The scratch root and the decoy file beside it, created once in a
// directory of their own; removed at exit.
struct Scratch {
  std::string dir;    // holds both
  std::string root;   // DIR/root
  std::string decoy;  // DIR/outside, what links out of the root point at
  std::string real_root, real_decoy;  // their realpaths
};

const Scratch& ScratchRoot() {
  static const Scratch scratch = [] {
    FileSystem& fs = *DefaultFileSystem();
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    Scratch s;
    s.dir = std::string(base) + "/shardsafe-fuzz-" + std::to_string(getpid());
    s.root = JoinPath(s.dir, "root");
    s.decoy = JoinPath(s.dir, "outside");
    char real[PATH_MAX];
    if (!CreateDirs(fs, JoinPath(s.root, std::string(fuzz::kFirst))).ok() ||
        !CreateDirs(fs, JoinPath(s.root, std::string(fuzz::kSecond))).ok() ||
        realpath(s.root.c_str(), real) == nullptr) {
      std::fprintf(stderr, "cannot create %s\n", s.root.c_str());
      std::abort();
    }
    s.real_root = real;
    s.real_decoy = JoinPath(ParentDir(s.real_root), "outside");
    // A commit record a reader must not take from outside the checkpoint.
    auto decoy = fs.NewWritableFile(s.decoy, {});
    const std::string text = R"({"sequence": 3, "time_ns": 3, "moved_latest": true})";
    if (!decoy.ok() || !(*decoy)->Append(text.data(), text.size()).ok() ||
        !(*decoy)->Close().ok()) {
      std::fprintf(stderr, "cannot write %s\n", s.decoy.c_str());
      std::abort();
    }
    // Initialised before the handler is registered, so destroyed after it runs.
    static const std::string to_remove = s.dir;
    std::atexit([] { DefaultFileSystem()->RemoveAll(to_remove).IgnoreError(); });
    return s;
  }();
  return scratch;
}

// Every framed path, removed (files, links, directories, FIFOs alike).
void RemoveFramed(FileSystem& fs, const std::string& root) {
  fs.RemoveAll(JoinPath(root, std::string(fuzz::kIndexPath))).IgnoreError();
  for (const auto& [id, name] : fuzz::FramedFiles()) {
    fs.RemoveAll(JoinPath(root, std::string(name))).IgnoreError();
  }
}

// Repoints every link of `links` that resolves outside the root (through
// any chain of the others) at the decoy, until none does.
void ConfineLinks(const Scratch& s, const std::vector<std::string>& links) {
  for (bool changed = true; changed;) {
    changed = false;
    for (const std::string& link : links) {
      char target[PATH_MAX];
      if (realpath(link.c_str(), target) == nullptr) continue;  // dangling, a loop: opens nothing
      const std::string_view t = target;
      if (t == s.real_root || t == s.real_decoy) continue;
      if (t.starts_with(s.real_root) && t[s.real_root.size()] == '/') continue;
      unlink(link.c_str());
      if (symlink(s.decoy.c_str(), link.c_str()) != 0) std::abort();
      changed = true;
    }
  }
}

void WriteFiles(const std::map<std::string, fuzz::FramedEntry>& entries) {
  FileSystem& fs = *DefaultFileSystem();
  const Scratch& s = ScratchRoot();
  RemoveFramed(fs, s.root);
  // Retention may have removed either checkpoint directory.
  for (std::string_view tag : {fuzz::kFirst, fuzz::kSecond}) {
    if (!CreateDirs(fs, JoinPath(s.root, std::string(tag))).ok()) std::abort();
  }
  std::vector<std::string> links;
  for (const auto& [name, entry] : entries) {
    const std::string path = JoinPath(s.root, name);
    switch (entry.kind) {
      case fuzz::FramedEntry::Kind::kFile: {
        auto file = fs.NewWritableFile(path, {});
        if (!file.ok() || !(*file)->Append(entry.bytes.data(), entry.bytes.size()).ok() ||
            !(*file)->Close().ok()) {
          std::fprintf(stderr, "cannot write %s\n", path.c_str());
          std::abort();
        }
        break;
      }
      case fuzz::FramedEntry::Kind::kLink:
        // An empty or overlong target makes no link: the file is missing.
        if (symlink(entry.bytes.c_str(), path.c_str()) == 0) links.push_back(path);
        break;
      case fuzz::FramedEntry::Kind::kDir:
        mkdir(path.c_str(), 0755);
        break;
      case fuzz::FramedEntry::Kind::kFifo:
        mkfifo(path.c_str(), 0644);
        break;
    }
  }
  ConfineLinks(s, links);
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

// Every tensor of `index` whole, as saved.
Request WholeOf(const CheckpointIndex& index) {
  Request whole;
  for (const auto& [key, t] : index.tensors) {
    whole.Add(key, t.dtype, t.shape, Slice{Box::Whole(t.shape), std::nullopt});
  }
  return whole;
}

LoadOptions FuzzLoadOptions() {
  LoadOptions options;
  options.io_threads = 1;
  options.share_reads = false;
  options.shared_memory = false;
  return options;
}

// The checkpoint as a reader of it: verify, open, blobs, two loads.
void ReadCheckpoint(FileSystem& fs, const std::string& dir, Comm& comm) {
  const VerifyReport report = VerifyCheckpoint(dir, &fs, /*io_threads=*/1);
  for (const std::string& fault : report.faults) Log("verify", DataLossError(fault));

  Result<CheckpointSource> src = OpenSource(fs, dir);
  Log("open", src.status());
  if (!src.ok()) return;
  for (const auto& [name, blob] : src->index.blobs) {
    for (const IndexBlobChunk& chunk : blob.chunks) {
      std::string out;
      Log("blob", ReadBlob(fs, *src, name, chunk, &out));
    }
  }

  // Every tensor whole, as saved, checksums verified.
  const Request whole = WholeOf(src->index);
  LoadOptions options = FuzzLoadOptions();
  Log("load whole", Load(whole.req, dir, comm, options).status());

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
  Log("load part", Load(part.req, dir, comm, options).status());
}

// The root as a reader of it: list, verify (every commit record, then the
// latest), load the latest (resolved again by Load). The first checkpoint's
// tensors were loaded already: for it the load asks for none (values and
// blobs are still read).
Result<std::vector<CheckpointInfo>> ReadRoot(FileSystem& fs, const std::string& root,
                                             const std::string& first, Comm& comm) {
  auto list = ListCheckpoints(root, &fs);
  Log("list root", list.status());
  const VerifyReport report = VerifyCheckpoint(root, &fs, /*io_threads=*/1);
  for (const std::string& fault : report.faults) Log("verify root", DataLossError(fault));

  Result<CheckpointSource> src = OpenSource(fs, root);
  Log(src.ok() ? ("open root: " + src->path).c_str() : "open root", src.status());
  if (!src.ok()) return list;
  const Request whole = src->path == first ? Request{} : WholeOf(src->index);
  auto loaded = Load(whole.req, root, comm, FuzzLoadOptions());
  Log("load root", loaded.status());
  return list;
}

// The tag a regular `latest` file names, as the engine reads it (up to 4
// KiB, trailing line ends trimmed); "" when none.
std::string LatestPointer(const std::map<std::string, fuzz::FramedEntry>& entries) {
  auto it = entries.find("latest");
  if (it == entries.end() || it->second.kind != fuzz::FramedEntry::Kind::kFile ||
      it->second.bytes.size() > 4096) {
    return "";
  }
  std::string tag = it->second.bytes;
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r')) tag.pop_back();
  return tag;
}

// Retention keeping one checkpoint, checked against `before` (the root as
// listed before it ran) and the tag `latest` named: it must remove none of
// the checkpoints it promises to keep.
void PruneRoot(FileSystem& fs, const std::string& root,
               const Result<std::vector<CheckpointInfo>>& before, const std::string& pointer) {
  CheckpointManager::Options options;
  options.fs = &fs;
  CheckpointManager manager(root, options);
  std::vector<std::string> warnings;
  auto removed = manager.Prune(/*keep=*/1, &warnings);
  std::string step = "prune root, removed:";
  for (const std::string& tag : removed.ok() ? *removed : std::vector<std::string>{}) {
    step += " " + tag;
  }
  Log(step.c_str(), removed.status());
  if (!before.ok() || !removed.ok()) return;
  std::string newest;  // in commit order, of those whose order is known
  for (const CheckpointInfo& c : *before) {
    if (c.order_fault.empty()) newest = c.tag;
  }
  for (const CheckpointInfo& c : *before) {
    const char* kept_for = c.is_latest             ? "it is the latest"
                           : c.tag == pointer      ? "`latest` names it"
                           : c.tag == newest       ? "it is the newest"
                           : !c.order_fault.empty() ? "its order is unknown"
                                                    : nullptr;
    if (kept_for && std::find(removed->begin(), removed->end(), c.tag) != removed->end()) {
      std::fprintf(stderr, "retention removed %s, which it must keep: %s\n", c.tag.c_str(),
                   kept_for);
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto entries = fuzz::Unframe({reinterpret_cast<const char*>(data), size});
  WriteFiles(entries);
  FileSystem& fs = *DefaultFileSystem();
  const std::string& root = ScratchRoot().root;
  const std::string first = JoinPath(root, std::string(fuzz::kFirst));
  static const std::unique_ptr<Comm> comm = MakeSingleProcessComm();
  ReadCheckpoint(fs, first, *comm);
  const auto before = ReadRoot(fs, root, first, *comm);
  PruneRoot(fs, root, before, LatestPointer(entries));
  return 0;
}
