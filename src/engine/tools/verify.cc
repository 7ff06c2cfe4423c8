#include "shardsafe/tools.h"

#include <algorithm>
#include <mutex>

#include "base/crc32c.h"
#include "base/thread_pool.h"
#include "engine/load/source.h"
#include "format/index.h"

namespace shardsafe {
namespace {

constexpr uint64_t kPiece = 16 << 20;

// A byte range of one data file whose checksum is recorded: chunk `chunk`
// of a tensor or of a blob. It refers into the index (32 bytes a chunk, on
// top of it): names are made only for a header check or a fault, one at a
// time, since a large index has millions of chunks.
struct Expected {
  const std::string* name;               // the tensor's key or the blob's name
  const IndexTensor* tensor = nullptr;   // a tensor's chunk, or
  const IndexBlob* blob = nullptr;       // a blob's
  size_t chunk = 0;

  uint64_t at() const { return tensor ? tensor->chunks[chunk].at : blob->chunks[chunk].at; }
  uint64_t bytes() const {
    return tensor ? tensor->chunks[chunk].bytes : blob->chunks[chunk].bytes;
  }
  std::optional<uint32_t> crc() const {
    return tensor ? tensor->chunks[chunk].crc32c : blob->chunks[chunk].crc32c;
  }
  // "tensor \"k\" chunk [..]" or "blob \"b\"".
  std::string What() const {
    if (!tensor) return "blob \"" + *name + "\"";
    return "tensor \"" + *name + "\" chunk " + SliceToString(tensor->chunks[chunk].slice);
  }
  // The safetensors entry name the data file must give it.
  std::string Entry() const {
    if (tensor) return ChunkEntryName(*name, tensor->chunks[chunk].slice, tensor->shape);
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

// Calls `f(file, expected)` for every chunk of the index.
template <typename F>
void ForEachExpected(const CheckpointIndex& index, F f) {
  for (const auto& [key, t] : index.tensors) {
    for (size_t i = 0; i < t.chunks.size(); ++i) f(t.chunks[i].file, Expected{&key, &t, nullptr, i});
  }
  for (const auto& [name, b] : index.blobs) {
    for (size_t i = 0; i < b.chunks.size(); ++i) f(b.chunks[i].file, Expected{&name, nullptr, &b, i});
  }
}

// Each file's chunks, at their exact count.
std::vector<std::vector<Expected>> ExpectedByFile(const CheckpointIndex& index) {
  std::vector<size_t> count(index.files.size());
  ForEachExpected(index, [&](uint32_t f, const Expected&) { ++count[f]; });
  std::vector<std::vector<Expected>> by_file(index.files.size());
  for (size_t f = 0; f < by_file.size(); ++f) by_file[f].reserve(count[f]);
  ForEachExpected(index, [&](uint32_t f, const Expected& x) { by_file[f].push_back(x); });
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

// Header entries must sit where the index puts them, under the right names.
void CheckHeader(const std::string& name, const SafetensorsHeader& header,
                 const std::vector<Expected>& expected, Collector* out) {
  std::map<uint64_t, const SafetensorsEntry*> by_offset;
  for (const auto& e : header.entries) {
    if (e.end > e.begin) by_offset[header.data_start() + e.begin] = &e;
  }
  for (const Expected& x : expected) {
    if (x.bytes() == 0) continue;
    auto it = by_offset.find(x.at());
    const std::string entry = x.Entry();
    if (it == by_offset.end() || it->second->name != entry ||
        it->second->end - it->second->begin != x.bytes()) {
      out->Fault(name + ": " + x.What() + ": no header entry \"" + entry + "\" of " +
                 std::to_string(x.bytes()) + " bytes at offset " + std::to_string(x.at()));
    }
  }
}

void VerifyFile(FileSystem& fs, const CheckpointSource& src, uint32_t f,
                const std::vector<Expected>& expected, Collector* out,
                std::atomic<uint64_t>* chunks, std::atomic<uint64_t>* bytes) {
  const IndexFile& info = src.index.files[f];
  const std::string path = JoinPath(src.data_dir, info.name);
  uint64_t size = 0;
  auto header = ReadSafetensorsHeader(fs, path, &size, SourceReadOptions(src));
  if (!header.ok()) return out->Fault(header.status().message());
  if (src.native && size != info.bytes) {
    return out->Fault(path + ": size " + std::to_string(size) + " bytes, index records " +
                      std::to_string(info.bytes));
  }
  for (const std::string& dup : header->duplicate_names) {
    out->Fault(path + ": tensor name \"" + dup + "\" appears twice in the header (the last one wins)");
  }
  if (src.native) CheckHeader(path, *header, expected, out);
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
    }
    *bytes += x.bytes();
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
    return report;
  }
  FileSystem& fs = **found;
  auto src = OpenSource(fs, path);
  if (!src.ok()) {
    report.faults.push_back(src.status().message());
    return report;
  }
  report.path = src->path;
  report.native = src->native;
  report.files = 0;
  for (uint32_t f = 0; f < src->index.files.size(); ++f) report.files += IsDataFile(src->index, f);
  report.tensors = src->index.tensors.size();
  const auto expected = ExpectedByFile(src->index);
  Collector faults;
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
