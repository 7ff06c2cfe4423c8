#include "engine/save/staging.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/crc32c.h"

namespace shardsafe {
namespace {

bool HasDeviceShards(const SaveState& state) {
  return std::any_of(state.tensors.begin(), state.tensors.end(),
                     [](const TensorShard& t) { return t.on_device; });
}

}  // namespace

size_t CopyThreads() { return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8); }

Result<uint64_t> DescribeStaged(const SavePlan& plan, int rank, const SaveState& state,
                                DeviceMemory* device, std::vector<StagedFile>* files,
                                std::vector<FileImage>* images) {
  uint64_t total = 0;
  for (uint32_t f = 0; f < plan.files.size(); ++f) {
    if (plan.files[f].rank != rank) continue;
    SS_ASSIGN_OR_RETURN(FileImage image, DescribeFile(plan, f, state, device));
    files->push_back({f, total, image.layout.file_size, {}});
    total += AlignUp(image.layout.file_size);
    images->push_back(std::move(image));
  }
  return total;
}

Status ChecksumDevicePieces(StagedImages& staged) {
  SS_RETURN_IF_ERROR(staged.progress->WaitFinished());
  std::vector<Piece*> device;
  for (Piece& p : staged.pieces) {
    if (p.device) device.push_back(&p);
  }
  if (device.empty()) return Status();
  ThreadPool pool(std::min(CopyThreads(), device.size()));
  TaskGroup group(&pool);
  for (Piece* p : device) {
    group.Add([p] {
      p->crc = Crc32cExtend(0, p->dst, p->n);
      return Status();
    });
  }
  return group.Wait();
}

void FillReports(const SavePlan& plan, StagedImages& staged) {
  for (size_t i = 0; i < staged.files.size(); ++i) {
    std::vector<uint32_t> crcs;
    for (auto [first, end] : staged.ranges[i]) {
      uint32_t crc = 0;
      for (size_t k = first; k < end; ++k) {
        crc = Crc32cCombine(crc, staged.pieces[k].crc, staged.pieces[k].n);
      }
      crcs.push_back(crc);
    }
    staged.files[i].report = ReportOf(plan, staged.files[i].plan_file, staged.images[i], crcs);
  }
}

void StagingArena::Grow(uint64_t bytes, const SaveState& state, const SaveOptions& options) {
  if (arena_.capacity() < bytes) {
    Unregister();
    arena_ = AlignedBuffer();
    arena_ = AcquireAlignedBuffer(bytes);
  }
  if (!registered_ && options.device && !arena_.empty() && HasDeviceShards(state)) {
    options.device->Register(arena_.data(), arena_.capacity());
    registered_ = options.device;
  }
}

void StagingArena::Unregister() {
  if (!registered_) return;
  registered_->Unregister(arena_.data(), arena_.capacity());
  registered_.reset();
}

Status StagingArena::LayOut(const SavePlan& plan, int rank, const SaveState& state,
                            const SaveOptions& options, StagedImages* staged,
                            std::vector<DeviceMemory::Copy>* device_copies) {
  SS_ASSIGN_OR_RETURN(uint64_t total, DescribeStaged(plan, rank, state, options.device.get(),
                                                     &staged->files, &staged->images));
  Grow(total, state, options);
  staged->arena = arena_.data();
  // Pieces in file order, so the writer can follow the copy closely.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> units(staged->images.size());
  staged->ranges.assign(staged->images.size(), {});
  for (size_t i = 0; i < staged->images.size(); ++i) {
    char* base = arena_.data() + staged->files[i].offset;
    const FileImage& image = staged->images[i];
    std::memcpy(base, image.layout.header.data(), image.layout.header.size());
    staged->ranges[i].resize(image.payloads.size());
    uint64_t unit_bytes = kCopyPiece;  // the first piece opens a unit
    bool unit_device = false;
    for (uint32_t e : image.layout.order) {
      const Payload& p = image.payloads[e];
      const bool device = p.device != nullptr;
      if (device && p.bytes > 0) {
        device_copies->push_back({base + image.layout.offsets[e], p.data, p.bytes});
      }
      const size_t first = staged->pieces.size();
      for (uint64_t off = 0; off < p.bytes; off += kCopyPiece) {
        const uint64_t at = image.layout.offsets[e] + off;
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyPiece, p.bytes - off));
        if (unit_bytes + n > kCopyPiece || device != unit_device) {
          units[i].emplace_back(at, at);
          unit_bytes = 0;
          unit_device = device;
        }
        units[i].back().second = at + n;  // entries lie back to back
        unit_bytes += n;
        staged->pieces.push_back({base + at, static_cast<const char*>(p.data) + off, n, i,
                               units[i].size() - 1, device});
      }
      staged->ranges[i][e] = {first, staged->pieces.size()};
    }
  }
  staged->progress->Reset(staged->files, std::move(units));
  return Status();
}

Status StagingArena::Copy(StagedImages* staged, DeviceMemory* device,
                          const std::vector<DeviceMemory::Copy>& device_copies) {
  std::vector<Piece>& pieces = staged->pieces;
  StagingProgress& progress = *staged->progress;
  TaskGroup group(&copy_pool_);
  std::vector<std::pair<size_t, size_t>> device_units;  // (file, unit)
  for (size_t first = 0; first < pieces.size();) {
    size_t end = first + 1;
    while (end < pieces.size() && pieces[end].file == pieces[first].file &&
           pieces[end].unit == pieces[first].unit) {
      ++end;
    }
    if (pieces[first].device) {
      device_units.emplace_back(pieces[first].file, pieces[first].unit);
    } else {
      // A payload's checksum is its pieces' checksums combined in order.
      group.Add([&pieces, &progress, first, end] {
        for (size_t k = first; k < end; ++k) {
          Piece& p = pieces[k];
          p.crc = CopyWithCrc32c(p.dst, p.src, p.n, 0);
        }
        progress.UnitDone(pieces[first].file, pieces[first].unit);
        return Status();
      });
    }
    first = end;
  }
  // The device's copies run on this thread while the pool copies the rest.
  Status copied;
  if (!device_copies.empty()) {
    copied = device->CopyToHost(device_copies).WithContext("copying tensors from the device");
    if (copied.ok()) {
      for (auto [file, unit] : device_units) progress.UnitDone(file, unit);
    }
  }
  Status host = group.Wait();
  return copied.ok() ? host : copied;
}

}  // namespace shardsafe
