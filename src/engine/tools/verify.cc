#include "shardsafe/tools.h"

#include <algorithm>
#include <mutex>

#include "base/crc32c.h"
#include "base/thread_pool.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/load/source.h"
#include "format/index.h"
#include "format/index_packed.h"
#include "format/package_records.h"
#include "format/safetensors.h"

namespace shardsafe {
namespace {

constexpr uint64_t kPiece = 16 << 20;

// A byte range of one data file whose checksum is recorded: chunk `chunk`
// of a tensor or of a blob. It refers into the index (40 bytes a chunk, on
// top of it): names are made only for a header check or a fault, one at a
// time, since a large index has millions of chunks.
struct Expected {
  const std::string* name = nullptr;       // the blob's name
  const PackedTensors* tensors = nullptr;  // a tensor's chunk (number `chunk` of tensor
  uint32_t tensor = 0;                     // `tensor` of them), or
  const IndexBlob* blob = nullptr;         // a blob's (its chunk `chunk`)
  uint64_t chunk = 0;

  uint64_t at() const { return tensors ? tensors->at(chunk) : blob->chunks[chunk].at; }
  uint64_t bytes() const { return tensors ? tensors->bytes(chunk) : blob->chunks[chunk].bytes; }
  std::optional<uint32_t> crc() const {
    return tensors ? tensors->crc32c(chunk) : blob->chunks[chunk].crc32c;
  }
  // "tensor \"k\" chunk [..]", "blob \"b\"" or "blob \"b\" of rank r".
  std::string What() const {
    if (!tensors && blob->per_rank) {
      return "blob \"" + *name + "\" of rank " + std::to_string(blob->chunks[chunk].rank);
    }
    if (!tensors) return "blob \"" + *name + "\"";
    return "tensor \"" + std::string(tensors->key(tensor)) + "\" chunk " +
           SliceToString(tensors->slice(tensor, chunk));
  }
  // The safetensors entry name the data file must give it.
  std::string Entry() const {
    if (tensors) {
      return ChunkEntryName(tensors->key(tensor), tensors->slice(tensor, chunk),
                            tensors->shape(tensor));
    }
    return BlobEntryName(*name, blob->per_rank ? std::optional<int>(blob->chunks[chunk].rank)
                                               : std::nullopt);
  }
};

class Collector {
 public:
  void Fault(std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    faults_.push_back(std::move(line));
  }
  std::vector<std::string> Take() { return std::move(faults_); }

 private:
  std::mutex mu_;
  std::vector<std::string> faults_;
};

// Calls `f(file, expected)` for every chunk of the index (its tensors
// packed: `tensors`).
template <typename F>
void ForEachExpected(const CheckpointIndex& index, const PackedTensors& tensors, F f) {
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t first = tensors.first_chunk(t);
    for (uint64_t c = first; c < first + tensors.chunk_count(t); ++c) {
      f(tensors.file(c), Expected{nullptr, &tensors, static_cast<uint32_t>(t), nullptr, c});
    }
  }
  for (const auto& [name, b] : index.blobs) {
    for (size_t i = 0; i < b.chunks.size(); ++i) {
      f(b.chunks[i].file, Expected{&name, nullptr, 0, &b, i});
    }
  }
}

// Each file's chunks, at their exact count.
std::vector<std::vector<Expected>> ExpectedByFile(const CheckpointIndex& index,
                                                  const PackedTensors& tensors) {
  std::vector<size_t> count(index.files.size());
  ForEachExpected(index, tensors, [&](uint32_t f, const Expected&) { ++count[f]; });
  std::vector<std::vector<Expected>> by_file(index.files.size());
  for (size_t f = 0; f < by_file.size(); ++f) by_file[f].reserve(count[f]);
  ForEachExpected(index, tensors, [&](uint32_t f, const Expected& x) { by_file[f].push_back(x); });
  return by_file;
}

Result<uint32_t> ChecksumRange(const RandomAccessFile& file, uint64_t at, uint64_t bytes,
                               std::vector<char>* buf) {
  uint32_t crc = 0;
  buf->resize(std::min(bytes, kPiece));
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(kPiece, bytes - done);
    SS_RETURN_IF_ERROR(file.ReadAt(at + done, buf->data(), n));
    crc = Crc32cExtend(crc, buf->data(), n);
    done += n;
  }
  return crc;
}

// Header entries must sit where the index puts them, under the right names:
// each entry, as the header is scanned, is checked against the chunk
// expected at its offset (4 bytes a chunk, no copy of the header's entries).
class HeaderCheck {
 public:
  explicit HeaderCheck(const std::vector<Expected>& expected)
      : expected_(expected), found_(expected.size()) {
    for (uint32_t i = 0; i < expected.size(); ++i) {
      if (expected[i].bytes() > 0) by_at_.push_back(i);
    }
    std::sort(by_at_.begin(), by_at_.end(),
              [&](uint32_t a, uint32_t b) { return expected_[a].at() < expected_[b].at(); });
  }

  // Entry `e` of the header, whose data buffer starts at `data_start`.
  void See(const SafetensorsEntry& e, uint64_t data_start) {
    if (e.end <= e.begin) return;
    const uint64_t at = data_start + e.begin;
    auto it = std::lower_bound(by_at_.begin(), by_at_.end(), at,
                               [&](uint32_t i, uint64_t a) { return expected_[i].at() < a; });
    if (it == by_at_.end() || expected_[*it].at() != at) return;
    const Expected& x = expected_[*it];
    if (e.end - e.begin == x.bytes() && e.name == x.Entry()) found_[*it] = true;
  }

  void Report(const std::string& name, Collector* out) const {
    for (uint32_t i : by_at_) {
      if (found_[i]) continue;
      const Expected& x = expected_[i];
      out->Fault(name + ": " + x.What() + ": no header entry \"" + x.Entry() + "\" of " +
                 std::to_string(x.bytes()) + " bytes at offset " + std::to_string(x.at()));
    }
  }

 private:
  const std::vector<Expected>& expected_;
  std::vector<uint32_t> by_at_;  // the chunks with bytes, by offset
  std::vector<bool> found_;
};

// A per-rank value's blob (checksum verified) must decode as the Python
// package's loader decodes it: only its safetensors header is read.
Status CheckPerRankBlob(const RandomAccessFile& file, const Expected& x) {
  std::byte prefix[8] = {};
  const uint64_t n = std::min<uint64_t>(8, x.bytes());
  SS_RETURN_IF_ERROR(file.ReadAt(x.at(), prefix, n));
  SS_ASSIGN_OR_RETURN(uint64_t length, ParseSafetensorsHeaderLength(
                                           std::span<const std::byte>(prefix, n), x.bytes()));
  std::string header(length, '\0');
  SS_RETURN_IF_ERROR(file.ReadAt(x.at() + 8, header.data(), header.size()));
  return CheckPerRankValue(header, x.bytes());
}

void VerifyFile(FileSystem& fs, const CheckpointSource& src, uint32_t f,
                const std::vector<Expected>& expected, Collector* out,
                std::atomic<uint64_t>* chunks, std::atomic<uint64_t>* bytes) {
  const IndexFile& info = src.index.files[f];
  const std::string path = JoinPath(src.data_dir, info.name);
  uint64_t size = 0, data_start = 0;
  std::vector<std::string> duplicates;
  HeaderCheck check(expected);
  Status header = ScanSafetensorsHeader(
      fs, path, SourceReadOptions(src), &size, &data_start,
      [&](const SafetensorsEntry& e) { check.See(e, data_start); }, &duplicates);
  if (!header.ok()) return out->Fault(header.message());
  if (src.native && size != info.bytes) {
    return out->Fault(path + ": size " + std::to_string(size) + " bytes, index records " +
                      std::to_string(info.bytes));
  }
  for (const std::string& dup : duplicates) {
    out->Fault(path + ": tensor name \"" + dup + "\" appears twice in the header (the last one wins)");
  }
  if (src.native) check.Report(path, out);
  auto file = fs.NewRandomAccessFile(path, SourceReadOptions(src));
  if (!file.ok()) return out->Fault(file.status().message());
  std::vector<char> buf;
  for (const Expected& x : expected) {
    const std::optional<uint32_t> want = x.crc();
    if (!want) continue;
    auto crc = ChecksumRange(**file, x.at(), x.bytes(), &buf);
    if (!crc.ok()) {
      out->Fault(path + ": " + x.What() + ": " + crc.status().message());
    } else if (*crc != *want) {
      out->Fault(path + ": " + x.What() + ": checksum mismatch");
    } else {
      (*chunks)++;
      if (x.blob && IsPerRankValueBlob(*x.name)) {
        if (Status s = CheckPerRankBlob(**file, x); !s.ok()) {
          out->Fault(path + ": " + x.What() + ": not a per-rank value the loader reads: " +
                     s.message());
        }
      }
    }
    *bytes += x.bytes();
  }
}

// The commit records verify answers for: a checkpoint's own, or, when
// `path` is a root (its latest was opened), every committed checkpoint's
// there, as retention and `latest` read them (CheckpointInfo::order_fault).
void CheckCommitRecords(FileSystem& fs, const std::string& path, const CheckpointSource& src,
                        Collector* out) {
  if (src.path == path) {
    auto record = ReadCommitRecord(fs, src.path);
    if (!record.ok()) out->Fault(record.status().message());
    return;
  }
  auto shared = LockRoot(fs, path, LockMode::kShared);
  auto list = ListCommitted(fs, path, /*data_bytes=*/false);
  if (!list.ok()) return out->Fault(list.status().message());
  for (const CheckpointInfo& c : *list) {
    if (!c.order_fault.empty()) out->Fault(c.tag + ": order unknown: " + c.order_fault);
  }
}

}  // namespace

VerifyReport VerifyCheckpoint(const std::string& path, FileSystem* fsp, int io_threads,
                              const ProgressFn& progress) {
  VerifyReport report;
  report.path = path;
  Result<FileSystem*> found = FileSystemFor(path, fsp);
  if (!found.ok()) {
    report.faults.push_back(found.status().message());
    report.unopened = found.status().code();
    return report;
  }
  FileSystem& fs = **found;
  auto src = OpenSourcePacked(fs, path);
  if (!src.ok()) {
    report.faults.push_back(src.status().message());
    auto info = fs.Stat(path);
    if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
      report.unopened = StatusCode::kNotFound;
    }
    return report;
  }
  report.path = src->path;
  report.native = src->native;
  report.files = 0;
  for (uint32_t f = 0; f < src->index.files.size(); ++f) report.files += IsDataFile(src->index, f);
  report.tensors = src->packed->size();
  const auto expected = ExpectedByFile(src->index, *src->packed);
  Collector faults;
  if (src->native) {
    CheckCommitRecords(fs, path, *src, &faults);
    if (Status s = CheckValuesJson(src->index.values); !s.ok()) {
      faults.Fault(JoinPath(src->path, kIndexFileName) + ": values: " + s.message());
    }
  }
  std::atomic<uint64_t> chunks{0}, bytes{0};
  ThreadPool pool(std::max(1, io_threads));
  TaskGroup group(&pool);
  for (uint32_t f = 0; f < expected.size(); ++f) {
    // A checksum file or chunk table part is no safetensors file:
    // OpenSource read it whole and checked it.
    if (!IsDataFile(src->index, f)) continue;
    group.Add([&, f] {
      VerifyFile(fs, *src, f, expected[f], &faults, &chunks, &bytes);
      return Status();
    });
  }
  uint64_t total = 0;
  for (const IndexFile& f : src->index.files) total += f.bytes;
  while (!group.WaitFor(std::chrono::milliseconds(250))) {
    if (progress) progress({"verify", bytes.load(), total});
  }
  group.Wait().IgnoreError();
  report.faults = faults.Take();
  std::sort(report.faults.begin(), report.faults.end());
  report.chunks_verified = chunks.load();
  report.bytes_checked = bytes.load();
  return report;
}

}  // namespace shardsafe
