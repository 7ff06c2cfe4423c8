// The async save's staging: a rank's data file images laid out in one
// reusable arena of host memory, and the copy that fills it (step c of
// async_save.cc's protocol). The copy runs on a pool of threads, host
// payloads copied and checksummed in 8 MiB pieces, while the save's
// DeviceMemory copies device payloads straight into the arena (which it may
// have page-locked once: the arena is kept across saves). StagingProgress
// tells the writer how far each file's image is staged, so writing follows
// the copy.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "engine/save/save_writer.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"
#include "storage/aligned_buffer.h"

namespace shardsafe {

// The staging copy runs in tasks of up to this many bytes on up to 8 threads
// (memory bandwidth, not core count, is the limit beyond that): a payload
// is cut into pieces of this size, and consecutive small payloads of a file
// share a task (20,000 tensors of ~100 KiB are ~250 tasks, not 20,000).
constexpr uint64_t kCopyPiece = uint64_t{8} << 20;

// Threads of the staging copy (and of the device pieces' checksums).
size_t CopyThreads();

// One staged data file: its image lives at `offset` in the arena.
struct StagedFile {
  uint32_t plan_file = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  WrittenFile report;
};

// The files `rank` writes under `plan`: their images and where each sits
// in the arena (4 KiB aligned, in plan order). Returns the arena bytes
// they need.
Result<uint64_t> DescribeStaged(const SavePlan& plan, int rank, const SaveState& state,
                                DeviceMemory* device, std::vector<StagedFile>* files,
                                std::vector<FileImage>* images);

// How far the staging copy (step c) has got, for the writer (step d) that
// follows it: per file, the length of the image's prefix that is staged.
// Units (the copy's tasks) complete in any order; a file's prefix grows over
// the units done in file order. A waiter is woken only once its prefix is
// staged (or the copy is over), not at every unit.
class StagingProgress {
 public:
  // `units[f]`: the [begin, end) byte ranges of file f's image that the
  // copy fills, in file order and without gaps up to `files[f].size`. Bytes
  // before the first unit (the header) are staged before the copy starts.
  void Reset(const std::vector<StagedFile>& files,
             std::vector<std::vector<std::pair<uint64_t, uint64_t>>> units) {
    std::lock_guard<std::mutex> lock(mu_);
    files_.clear();
    for (size_t f = 0; f < files.size(); ++f) {
      File& file = files_.emplace_back();
      file.units = std::move(units[f]);
      file.done.assign(file.units.size(), false);
      file.size = files[f].size;
      file.staged = file.units.empty() ? file.size : file.units.front().first;
    }
  }

  void UnitDone(size_t f, size_t unit) {
    std::lock_guard<std::mutex> lock(mu_);
    File& file = files_[f];
    file.done[unit] = true;
    while (file.next < file.units.size() && file.done[file.next]) {
      file.staged = file.units[file.next++].second;
    }
    if (file.wanted != 0 && file.staged >= file.wanted) cv_.notify_all();
  }

  // The copy is over: every unit done and the reports filled in (OK), or
  // it failed.
  void Finish(Status staged) {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    if (staged.ok()) {
      for (File& file : files_) file.staged = file.size;  // all of it, whatever the pieces said
    }
    status_ = std::move(staged);
    cv_.notify_all();
  }

  // Waits until the first `bytes` of file f are staged; the copy's error if
  // it failed first.
  Status WaitFor(size_t f, uint64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    File& file = files_[f];
    file.wanted = bytes;
    cv_.wait(lock, [&] { return file.staged >= bytes || (finished_ && !status_.ok()); });
    file.wanted = 0;
    return file.staged >= bytes ? Status() : status_;
  }

  Status WaitFinished() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_; });
    return status_;
  }

 private:
  struct File {
    std::vector<std::pair<uint64_t, uint64_t>> units;
    std::vector<bool> done;
    size_t next = 0;      // first unit not yet counted in `staged`
    uint64_t size = 0;    // of the image
    uint64_t staged = 0;  // bytes of the image's prefix staged
    uint64_t wanted = 0;  // the prefix a waiter waits for; 0: nobody waits
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<File> files_;
  bool finished_ = false;
  Status status_;
};

// A piece of one payload's copy into the arena.
struct Piece {
  char* dst;
  const char* src;  // host memory, or a device address (`device`)
  size_t n;
  size_t file;  // index in StagedImages::files
  size_t unit;  // the copy task it belongs to: its number within the file
  bool device = false;
  uint32_t crc = 0;
};

// One rank's staged file images: where each lies in the arena, the copy's
// pieces, and how far the copy has got.
struct StagedImages {
  std::vector<StagedFile> files;
  std::vector<FileImage> images;  // parallel to files
  // The payloads' pieces in file order; `ranges[i][e]`: the pieces of file
  // i's entry e. The copy checksums host pieces as it copies them;
  // ChecksumDevicePieces the device ones once they are staged.
  std::vector<Piece> pieces;
  std::vector<std::vector<std::pair<size_t, size_t>>> ranges;
  const char* arena = nullptr;
  std::shared_ptr<StagingProgress> progress;  // shared with the writer
};

// The checksums of the pieces a device copied, once the copy is over, on up
// to CopyThreads() threads of the caller's priority.
Status ChecksumDevicePieces(StagedImages& staged);
// Each file's report (offsets, checksums) from its pieces' checksums.
void FillReports(const SavePlan& plan, StagedImages& staged);

// The arena and the copy's threads, kept across saves.
class StagingArena {
 public:
  ~StagingArena() { Unregister(); }

  // Makes the arena hold at least `bytes` for `state` (the old one is
  // unregistered and released first: the peak is one arena, not two), and
  // offers it to the state's device for page-locking, once. Throws
  // std::bad_alloc.
  void Grow(uint64_t bytes, const SaveState& state, const SaveOptions& options);
  // Unregisters the arena from the device it was registered with, if any.
  void Unregister();
  size_t capacity() const { return arena_.capacity(); }

  // Step c, first half: the images of `rank`'s files under `plan`, each
  // 4 KiB aligned in the arena (grown if needed), headers copied, the
  // payloads' pieces listed in `staged`, grouped into units of consecutive
  // pieces, all host or all device (one copy task each), and announced to
  // `staged->progress`. A device payload is also one entry of
  // `device_copies` (one copy per shard: shards may lie back to back in
  // device memory, and a copy may not span two, DeviceMemory's contract).
  Status LayOut(const SavePlan& plan, int rank, const SaveState& state,
                const SaveOptions& options, StagedImages* staged,
                std::vector<DeviceMemory::Copy>* device_copies);
  // Step c, second half: copies and checksums the host units in parallel,
  // while `device` makes `device_copies`, then reports each unit to the
  // progress as it completes.
  Status Copy(StagedImages* staged, DeviceMemory* device,
              const std::vector<DeviceMemory::Copy>& device_copies);

 private:
  AlignedBuffer arena_;
  std::shared_ptr<DeviceMemory> registered_;  // the arena is registered with it
  ThreadPool copy_pool_{CopyThreads()};
};

}  // namespace shardsafe
