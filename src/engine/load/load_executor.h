// Runs a LoadPlan: issues its reads on an I/O pool, reads straight into
// destination memory where the bytes land contiguously there in the saved
// dtype (a read spanning several such runs is one scattered read, preadv),
// else through a bounded scratch buffer per worker (converting each
// segment), and verifies the checksum of every chunk a group reads whole.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "engine/shared_reads/ring_reads.h"
#include "engine/load/stream_checksums.h"
#include "layout/load_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

struct LoadDestination {
  void* data = nullptr;
  DType dtype = DType::kF32;
};

// What the executor needs to know about the saved data, for reads and for
// error messages.
struct LoadSources {
  std::vector<std::string> file_paths;  // by data file index
  std::string within;                   // ReadOptions::within of every file
  // The size the index records for each data file (empty: not checked): a
  // file of another size is DataLoss when opened, as `verify` judges it.
  std::vector<uint64_t> file_bytes;
  std::vector<std::string> tensor_keys; // by SavedTensor index
  // Expected checksum per (tensor, chunk); nullopt where none is recorded.
  std::vector<std::vector<std::optional<uint32_t>>> crcs;
  // By data file index (empty: none): files to read through the page cache
  // even with LoadOptions::direct_io, because other ranks on this machine
  // read the same bytes (engine/shared_reads/shared_reads.h); `rings` comes first.
  std::vector<bool> buffered;
  // Groups reading this data file and later ones go first, then those
  // before it: ranks that read the same files start on different ones, so
  // the disk streams each file to one of them while the others read the
  // files already in the page cache.
  uint32_t first_file = 0;
  // Files read from shared-memory rings (instead of the disk or the page
  // cache), and the ring this rank fills (engine/shared_reads/ring_reads.h); null: none.
  // Their groups run on one worker in file and offset order, the producer
  // on a thread of its own.
  const RingReads* rings = nullptr;
};

struct LoadCounters {
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> chunks_verified{0};
  // When set, checksums are checked here, across plans, from every byte
  // read (engine/load/stream_checksums.h), instead of per group for the chunks a
  // group reads whole; its errors are reported by the plan too.
  StreamChecksums* stream = nullptr;
};

// Executes `plan`. `dests[i]` receives want i. DataLoss naming file, tensor
// and chunk on a checksum mismatch or truncated file.
Status ExecuteLoadPlan(const LoadPlan& plan, const std::vector<SavedTensor>& tensors,
                       const std::vector<Want>& wants,
                       const std::vector<LoadDestination>& dests, const LoadSources& sources,
                       FileSystem& fs, const LoadOptions& options, LoadCounters* counters);

}  // namespace shardsafe
