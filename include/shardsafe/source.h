// Reading a checkpoint piece by piece: what a tool needs beyond Load (the
// CLI's inspect and import, the Python package's load planning, the Hugging
// Face export). Open what a path names once, look at its index, then load
// from it, read its blobs, or stream pieces of its tensors.
//
//   auto src = shardsafe::OpenSource(*shardsafe::DefaultFileSystem(), "/ckpt/run1");
//   for (const auto& [key, t] : src->index.tensors) { ... t.dtype, t.shape ... }
//   auto res = shardsafe::LoadOpenedSource(request, *src, *comm, {});
//
// A path names a shardsafe checkpoint, a root of checkpoints (its latest),
// a single .safetensors file, or a Hugging Face model directory
// (model.safetensors, shards listed by model.safetensors.index.json, or any
// *.safetensors files). Foreign files get a synthesized index: one
// whole-tensor chunk per header entry, no checksums. Every index, native or
// synthesized, is checked for tiling before it is returned, so a reader can
// trust its geometry.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/index.h"

namespace shardsafe {

class PackedTensors;

struct CheckpointSource {
  std::string path;      // what was resolved: checkpoint dir or file
  std::string data_dir;  // directory holding the data files
  bool native = false;   // a shardsafe checkpoint (has checksums)
  CheckpointIndex index;
  // The index has a chunk table (docs/format.md §3a) that was not read: its
  // tensors hold no chunks (dtypes and shapes only). OpenSourceCollective
  // opens so; a load reads the parts of the table it needs.
  bool chunks_pending = false;
  // The tensors, packed (format/index_packed.h), where the read paths
  // opened the source themselves (Load, the tools, the Python package):
  // `index.tensors` is then empty. Null for a source from OpenSource or
  // OpenSourceCollective, whose `index.tensors` holds them.
  std::shared_ptr<const PackedTensors> packed = nullptr;
  // A native checkpoint's index, locked shared while the source lives
  // (where the file system has locks; on the rank that opened it): retention
  // and prune leave a checkpoint alone while a load holds it.
  std::shared_ptr<FileLock> pin = nullptr;
  // Set by OpenSourceCollectivePacked when rank 0's caller found another
  // tool's checkpoint at `path` (the name its reader goes by): nothing was
  // opened, and only `path` is set besides.
  std::string other_format = {};
};

// How every file of `src` is opened for reading: confined
// (ReadOptions::within) to the checkpoint or model directory it came from,
// or for a Hugging Face cache snapshot (CACHE/models--ORG--NAME/snapshots/
// REV, whose files link to ../../blobs) to that cached repository. A single
// .safetensors file the caller named is not confined.
ReadOptions SourceReadOptions(const CheckpointSource& src);

// Opens `path` on this process alone, with every chunk of the index (a
// chunk table read whole). NotFound if nothing loadable is there; DataLoss
// for a corrupt index, chunk table or header (naming the file and rule).
Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path);
// OpenSource on the file system `path` lies on (FileSystemFor).
Result<CheckpointSource> OpenSource(const std::string& path);
// OpenSource with the tensors packed (CheckpointSource::packed, a few tens
// of bytes a tensor and a chunk; index.tensors left empty), the index read
// a piece at a time, never whole (but in an object store): what the tools
// and the Python package open a checkpoint with, whatever its size.
Result<CheckpointSource> OpenSourcePacked(FileSystem& fs, const std::string& path);
Result<CheckpointSource> OpenSourcePacked(const std::string& path);

// Collective: rank 0 resolves and reads `path` (OpenSource) and sends what
// it read; every rank returns the same source, or the same error. Other
// ranks never touch the index file. A chunk table is not read
// (chunks_pending): each rank's load reads what it needs of it.
Result<CheckpointSource> OpenSourceCollective(FileSystem& fs, const std::string& path,
                                              Comm& comm);
// OpenSourceCollective on the file system `path` lies on (FileSystemFor).
Result<CheckpointSource> OpenSourceCollective(const std::string& path, Comm& comm);
// OpenSourceCollective with the tensors packed (OpenSourcePacked).
// `other_format`, read on rank 0 only: the name of another tool's format
// that its caller found at `path` (empty: none), sent to every rank in the
// same broadcast instead of an index, so that every rank takes the same
// reader's path without a collective of its own; rank 0 then opens nothing
// and every rank returns a source with `path` and `other_format` only.
Result<CheckpointSource> OpenSourceCollectivePacked(const std::string& path, Comm& comm,
                                                    std::string_view other_format = {});

// Collective: Load (shardsafe/checkpoint.h) from a source every rank got
// from OpenSourceCollective, so a caller that plans from the index does not
// open it twice. `src.path` is what the result reports.
Result<LoadResult> LoadOpenedSource(const LoadRequest& request, const CheckpointSource& src,
                                    Comm& comm, const LoadOptions& options);

// A target that takes saved tensor `tensor` of a packed source (its
// number in CheckpointSource::packed) whole, in the dtype it was saved in,
// into `data` (room for all its bytes): 16 bytes where a TensorTarget takes
// ~270, for a caller that matched many tensors by key itself (the Python
// package's load).
struct WholeTensorTarget {
  uint32_t tensor = 0;
  void* data = nullptr;
};
// LoadOpenedSource with `whole` targets besides `request`'s (`src` packed:
// InvalidArgument otherwise, or for a tensor number out of range or a null
// destination). `whole` must outlive the call.
Result<LoadResult> LoadOpenedSource(const LoadRequest& request,
                                    std::span<const WholeTensorTarget> whole,
                                    const CheckpointSource& src, Comm& comm,
                                    const LoadOptions& options);

// Reads one blob chunk into *out, verifying its checksum when recorded.
// DataLoss naming the blob and file (a chunk beyond the file's end
// included, checked before anything is allocated).
Status ReadBlob(FileSystem& fs, const CheckpointSource& src, const std::string& name,
                const IndexBlobChunk& chunk, std::string* out);

// True if a load with LoadOptions::convert_dtypes can convert `from` to
// `to` (docs/format.md §5; equal dtypes always can).
bool CanConvert(DType from, DType to);

// One piece for SourceReader: a slice of source tensor `*key`, converted to
// `dtype` (CanConvert), into `dst` (room for slice.NumElements() elements).
struct SourcePiece {
  const std::string* key = nullptr;
  Slice slice;
  void* dst = nullptr;
  DType dtype = DType::kF32;
};

// How each SourceReader::Read runs: threads reading at once, scratch
// memory per thread (for bytes that need converting or are not contiguous
// in `dst`), and whether data files are read with O_DIRECT (buffered on
// tmpfs). Direct by default: an export reads every byte once, cold
// buffered reads are slower, and data already cached is still taken from
// the cache.
struct SourceReadTuning {
  int threads = 2;
  uint64_t scratch_bytes = uint64_t{8} << 20;
  bool direct_io = true;
};

// Reads pieces of a source's tensors, batch by batch, with the load
// planner and executor (straight into `dst` where the bytes are contiguous,
// coalesced reads), and verifies checksums from the bytes as they stream
// through, across batches: a chunk that batches cut in pieces is verified
// without a second read as long as its pieces arrive in order; VerifyRest
// reads the others once more, whole.
//
// Thread-safe: Read and VerifyRest may be called from several threads.
class SourceReader {
 public:
  // `src` and `fs` must outlive the reader.
  SourceReader(const CheckpointSource& src, FileSystem& fs, bool verify_checksums,
               SourceReadTuning tuning = SourceReadTuning());
  ~SourceReader();

  // Reads every piece, in reads of at most `max_read_bytes`. DataLoss
  // naming file, tensor and chunk on a checksum mismatch or a truncated
  // file.
  Status Read(std::span<const SourcePiece> pieces, uint64_t max_read_bytes);

  // Verifies every checksummed chunk of `keys` (of the tensors whose keys
  // `of` accepts) that no Read verified, on `threads` threads. DataLoss as
  // Read.
  Status VerifyRest(const std::set<std::string>& keys, int threads);
  Status VerifyRest(const std::function<bool(std::string_view)>& of, int threads);

  uint64_t bytes_read() const;
  uint64_t chunks_verified() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardsafe
