#include "engine/save/save_writer.h"

#include <cstdio>

#include "base/thread_pool.h"
#include "format/checksum_file.h"
#include "format/index.h"
#include "layout/plan_part.h"
#include "format/safetensors.h"

namespace shardsafe {
namespace {

const std::map<std::string, std::string> kHfMetadata = {{"format", "pt"}};

Shape EntryShape(const Slice& slice) {
  if (slice.flat) return {slice.flat->size()};
  return slice.box.size;
}

// Copies `bytes` of a device payload, from `offset`, into host memory at
// `dst`; a failure names the tensor.
Status CopyFromDevice(const Payload& p, char* dst, uint64_t offset, size_t bytes) {
  const DeviceMemory::Copy copy{dst, static_cast<const char*>(p.data) + offset, bytes};
  return p.device->CopyToHost({&copy, 1}).WithContext("copying tensor \"" + *p.key +
                                                     "\" from the device");
}

Result<WrittenFile> WriteFile(const SavePlan& plan, uint32_t file_index, const SaveState& state,
                              const SaveDirs& dirs, FileSystem& fs, const SaveOptions& options,
                              std::atomic<uint64_t>* progress) {
  const PlannedFile& planned = plan.files[file_index];
  SS_ASSIGN_OR_RETURN(FileImage image, DescribeFile(plan, file_index, state, options.device.get()));
  const std::string path =
      JoinPath(dirs.data, DataFileName(planned.rank, planned.number, dirs.file_suffix));
  SS_ASSIGN_OR_RETURN(auto out,
                      fs.NewWritableFile(path, DataFileOptions(options, image.layout.file_size)));
  SS_RETURN_IF_ERROR(out->Append(image.layout.header.data(), image.layout.header.size()));
  std::vector<uint32_t> crcs(image.payloads.size());
  for (uint32_t i : image.layout.order) {
    const Payload& p = image.payloads[i];
    if (p.device != nullptr) {
      // Straight into the file's buffers: nothing of the tensor is staged.
      SS_RETURN_IF_ERROR(out->AppendFilled(
          p.bytes,
          [&p](char* dst, uint64_t offset, size_t n) { return CopyFromDevice(p, dst, offset, n); },
          &crcs[i]));
    } else {
      SS_RETURN_IF_ERROR(out->AppendChecksummed(p.data, p.bytes, &crcs[i]));
    }
    progress->fetch_add(p.bytes, std::memory_order_relaxed);
  }
  SS_RETURN_IF_ERROR(out->Sync());
  SS_RETURN_IF_ERROR(out->Close());
  return ReportOf(plan, file_index, image, crcs);
}

}  // namespace

Result<SafetensorsLayout> LayOutFile(const SavePlan& plan, uint32_t file) {
  const PlannedFile& planned = plan.files[file];
  std::vector<EntrySpec> specs;
  for (uint32_t c : planned.chunks) {
    const PlannedChunk& chunk = plan.chunks[c];
    const PlannedTensor& tensor = plan.tensors[chunk.tensor];
    specs.push_back({ChunkEntryName(tensor.key, chunk.slice, tensor.shape), tensor.dtype,
                     EntryShape(chunk.slice), chunk.bytes});
  }
  for (uint32_t b : planned.blobs) {
    const PlannedBlob& blob = plan.blobs[b];
    const auto rank = blob.per_rank ? std::optional<int>(blob.rank) : std::nullopt;
    specs.push_back({BlobEntryName(blob.name, rank), DType::kU8, {blob.bytes}, blob.bytes});
  }
  return BuildSafetensorsHeader(specs, kHfMetadata, kDataFileAlignment);
}

Result<FileImage> DescribeFile(const SavePlan& plan, uint32_t file, const SaveState& state,
                               DeviceMemory* device) {
  const PlannedFile& planned = plan.files[file];
  FileImage image;
  for (uint32_t c : planned.chunks) {
    const PlannedChunk& chunk = plan.chunks[c];
    const TensorShard& shard = state.tensors[chunk.writer_shard];
    image.payloads.push_back({static_cast<const char*>(shard.data) + chunk.shard_offset,
                              chunk.bytes, shard.on_device ? device : nullptr, &shard.key});
  }
  for (uint32_t b : planned.blobs) {
    const PlannedBlob& blob = plan.blobs[b];
    image.payloads.push_back({state.blobs[blob.writer_blob].data, blob.bytes});
  }
  SS_ASSIGN_OR_RETURN(image.layout, LayOutFile(plan, file));
  return image;
}

WriteOptions DataFileOptions(const SaveOptions& options, uint64_t size) {
  WriteOptions w;
  w.direct = options.direct_io;
  w.size_hint = size;
  w.buffer_bytes = options.io_buffer_bytes;
  w.queue_depth = std::max(options.io_depth, 1);
  return w;
}

WrittenFile ReportOf(const SavePlan& plan, uint32_t file, const FileImage& image,
                     const std::vector<uint32_t>& crcs) {
  const PlannedFile& planned = plan.files[file];
  WrittenFile written{file, image.layout.file_size, {}, {}};
  for (size_t i = 0; i < image.payloads.size(); ++i) {
    auto& list = i < planned.chunks.size() ? written.chunks : written.blobs;
    list.push_back({image.layout.offsets[i], crcs[i]});
  }
  return written;
}

std::string DataFileName(int rank, uint32_t number, std::string_view suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "data-%05d-%03u", rank, number);
  return std::string(buf) + std::string(suffix) + ".safetensors";
}

std::string ChecksumFileName(int rank, std::string_view suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "checksums-%05d", rank);
  return std::string(buf) + std::string(suffix) + std::string(kChecksumFileExtension);
}

std::string ChunkTableFileName(int rank, std::string_view suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "chunks-%05d", rank);
  return std::string(buf) + std::string(suffix) + ".chunks";
}

Status WriteChecksumFile(const SavePlan& plan, int rank, const std::vector<WrittenFile>& written,
                         const SaveDirs& dirs, FileSystem& fs) {
  std::vector<ChunkChecksum> entries;
  for (const WrittenFile& f : written) {
    const uint32_t whole = WholeFileNumber(plan, f.plan_file);
    const PlannedFile& planned = plan.files[f.plan_file];
    for (size_t i = 0; i < f.chunks.size(); ++i) {
      if (plan.chunks[planned.chunks[i]].bytes == 0) continue;  // no checksum to keep
      entries.push_back({whole, f.chunks[i].at, f.chunks[i].crc32c});
    }
  }
  if (entries.empty()) return Status();
  const std::string path = JoinPath(dirs.data, ChecksumFileName(rank, dirs.file_suffix));
  const std::string bytes = EncodeChecksumFile(std::move(entries));
  SS_ASSIGN_OR_RETURN(auto out, fs.NewWritableFile(path, WriteOptions{}));
  SS_RETURN_IF_ERROR(out->Append(bytes.data(), bytes.size()).WithContext(path));
  SS_RETURN_IF_ERROR(out->Sync().WithContext(path));
  return out->Close().WithContext(path);
}

Result<std::vector<WrittenFile>> WriteRankFiles(const SavePlan& plan, int rank,
                                                const SaveState& state, const SaveDirs& dirs,
                                                FileSystem& fs, const SaveOptions& options,
                                                std::atomic<uint64_t>* progress) {
  std::vector<uint32_t> mine;
  for (uint32_t f = 0; f < plan.files.size(); ++f) {
    if (plan.files[f].rank == rank) mine.push_back(f);
  }
  std::vector<WrittenFile> written(mine.size());
  ThreadPool pool(std::min<size_t>(std::max(options.io_threads, 1), mine.size()));
  TaskGroup group(&pool);
  for (size_t i = 0; i < mine.size(); ++i) {
    group.Add([&, i]() -> Status {
      auto r = WriteFile(plan, mine[i], state, dirs, fs, options, progress);
      if (!r.ok()) return r.status();
      written[i] = std::move(*r);
      return Status();
    });
  }
  uint64_t total = 0;
  for (uint32_t f : mine) total += plan.files[f].payload_bytes;
  while (!group.WaitFor(std::chrono::milliseconds(250))) {
    if (options.progress) options.progress({"write", progress->load(), total});
  }
  SS_RETURN_IF_ERROR(group.Wait());
  if (options.progress) options.progress({"write", progress->load(), total});
  return written;
}

}  // namespace shardsafe
