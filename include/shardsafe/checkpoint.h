// The shardsafe C++ API: save the sharded state of N ranks, load it back into
// any layout, and manage step-tagged checkpoints.
//
//   shardsafe::SaveState state;
//   state.tensors.push_back({"layers.0.wq", DType::kBF16, {4096, 4096},
//                            {Box{{rank * 2048, 0}, {2048, 4096}}}, ptr});
//   state.values = R"({"step": 100})";
//   SS_RETURN_IF_ERROR(shardsafe::Save(state, "/ckpt/step-100", *comm, {}).status());
//
// Every call here is collective: all ranks of `comm` call it with their own
// part of the state, in the same order. Every rank gets the same outcome: if
// any rank fails (bad layout, I/O error), every rank returns an error and
// nothing is committed. A committed checkpoint is complete and durable; see
// docs/format.md for the on-disk format and the commit protocol.
//
// Thread-safety: calls on different checkpoints may run concurrently when
// they use different Comm objects.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/comm.h"
#include "shardsafe/device_memory.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe {

// ---------------------------------------------------------------- saving --

// One shard this rank holds. `data` points at slice.NumElements() elements
// of `dtype`, row-major and dense; it must stay valid and unchanged until
// Save returns. Nothing is copied before the write (the synchronous path
// streams from `data`). With `on_device`, `data` is a device address that
// the engine never reads itself: its bytes come through
// SaveOptions::device (shardsafe/device_memory.h).
struct TensorShard {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;  // the global shape
  Slice slice;  // the part this rank holds
  const void* data = nullptr;
  bool on_device = false;
};

// Opaque bytes: RNG state, data-loader position. A per-rank blob is saved
// for each rank that passes one; a global blob is saved once (every rank
// that passes it must pass the same size; the lowest such rank writes it).
struct BlobRef {
  std::string name;
  const void* data = nullptr;
  uint64_t size = 0;
  bool per_rank = false;
};

// User JSON crosses this API as text (UTF-8, RFC 8259), so any JSON library
// can build and read it. A save checks and rewrites it in one canonical form
// (compact, object keys sorted); a load returns that text.
struct SaveState {
  std::vector<TensorShard> tensors;
  std::vector<BlobRef> blobs;
  // Global values, a JSON object saved once (rank 0's). Every value another
  // rank passes must equal rank 0's under the same key (checked:
  // InvalidArgument naming the key and ranks otherwise); per-rank data goes
  // in per-rank blobs. Empty: none.
  std::string values;
  std::string metadata;  // user metadata, any JSON (rank 0's); empty: none
  std::string layout;    // description of the parallel layout (rank 0's); empty: none
};

struct Progress {
  std::string_view phase;  // "plan", "write", "commit", "read"
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;
};
using ProgressFn = std::function<void(const Progress&)>;

struct SaveOptions {
  uint64_t max_file_bytes = uint64_t{2} << 30;  // payload cap per data file
  bool direct_io = true;  // O_DIRECT data files (buffered fallback on tmpfs)
  int io_threads = 4;     // files written in parallel per rank
  // Direct I/O staging of a synchronous save: each file in flight holds
  // io_depth + 1 buffers of io_buffer_bytes, so at the defaults a rank uses
  // at most 4 files x 4 x 16 MiB = 256 MiB extra, whatever the state size.
  size_t io_buffer_bytes = 16 << 20;  // bytes per write request
  int io_depth = 3;       // write requests in flight per file
  bool overwrite = false; // replace an existing checkpoint at the path
  // CheckpointManager saves: point `latest` at the new checkpoint. False
  // commits without moving it (DeepSpeed's save_latest=False); such a
  // checkpoint is never taken as the latest while `latest` names another.
  // Save(path) never moves `latest`.
  bool update_latest = true;
  // Check that ranks holding the same slice of a tensor hold the same bytes:
  // each non-writing holder checksums its copy (CRC-32C, the rate of base/crc32c.h)
  // and a mismatch fails the save, naming the tensor and ranks. Off only
  // when the caller guarantees its replicas (one holder's copy is saved).
  bool verify_replicas = true;
  // Async saves: how long a rank's background thread waits for the other
  // ranks (their completion markers, or rank 0's commit) once its own part
  // is written, before failing the save as Unavailable naming what it waited
  // for. A dead peer costs this long, so minutes, not hours.
  std::chrono::seconds peer_timeout{600};
  // From this many chunks on, the index keeps its chunks in a binary chunk
  // table that each loading rank reads only in part (docs/format.md §3a;
  // a version-2 index). 0: SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS if set, else
  // 65,536.
  uint64_t chunk_table_min_chunks = 0;
  // From this many ranks on, a save whose layout changed (synchronous or
  // asynchronous) is planned by all ranks together instead of on rank 0,
  // and always writes a chunk table (docs/design.md, "Planning by all ranks"). Every rank
  // must pass the same. 0: SHARDSAFE_DISTRIBUTED_PLAN_MIN_RANKS if set,
  // else 1,024.
  uint64_t distributed_plan_min_ranks = 0;
  FileSystem* fs = nullptr;  // default: DefaultFileSystem()
  ProgressFn progress = nullptr;  // called on the calling thread, this rank only
  // A failure this rank met before the call, preparing its part (the Python
  // package's walk of its state): the call fails on every rank, with this
  // status named by rank, through its first collective, so that no rank
  // waits for this one. OK: none.
  Status local_failure = Status();
  // Copies the shards marked on_device to host memory; required when there
  // are any (InvalidArgument otherwise). An AsyncSaver keeps the one it
  // registered its staging memory with until it unregisters it.
  std::shared_ptr<DeviceMemory> device = nullptr;
};

struct SaveStats {
  uint64_t bytes_written = 0;  // payload this rank wrote
  uint64_t unique_bytes = 0;   // payload of the checkpoint (all ranks)
  uint64_t held_bytes = 0;     // payload held by all ranks, replicas counted
  uint64_t max_rank_bytes = 0; // payload of the busiest writer
  int files = 0;               // data files in the checkpoint
  double seconds = 0;          // wall time of the call on this rank
  // Every rank's layout (keys, shapes, slices, blob sizes) was the same as
  // at its previous save, so the plan was reused without gathering the
  // layouts or planning again.
  bool plan_reused = false;
  // Failures after the commit point (fsync of the root, replacing `latest`,
  // retention), and checkpoints retention kept because their commit order
  // is unknown (CheckpointInfo::order_fault): the checkpoint is committed
  // and loadable, so the save succeeded, but these are worth a log line.
  // Same on every rank.
  std::vector<std::string> warnings;
};

// Saves `state` as the checkpoint directory `path` (its last component is
// the tag: a safe name, docs/format.md §1). The directory appears only when
// complete. Returns OK exactly when the checkpoint is committed. AlreadyExists if `path` exists (unless overwrite); InvalidArgument
// for a bad tag or layout (dtype/shape disagreement, gaps, overlaps) or
// text in values / metadata / layout that is not JSON;
// ResourceExhausted for a full disk; Unavailable for I/O errors.
Result<SaveStats> Save(const SaveState& state, const std::string& path, Comm& comm,
                       const SaveOptions& options);

// --------------------------------------------------------------- loading --

// Where to put one slice of a saved tensor. `data` has room for
// slice.NumElements() elements of `dtype`, row-major and dense.
struct TensorTarget {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;  // expected global shape (must match the checkpoint's)
  Slice slice;
  void* data = nullptr;
  // `data` is a device address, filled through LoadOptions::device.
  bool on_device = false;
};

struct LoadRequest {
  std::vector<TensorTarget> tensors;
};

struct LoadOptions {
  bool verify_checksums = true;  // verify every chunk read whole
  bool allow_partial = false;    // missing keys are reported, not an error
  bool convert_dtypes = false;   // allow dtype conversion (docs/format.md §5)
  int io_threads = 4;
  uint64_t scratch_bytes = uint64_t{64} << 20;  // bound on staging memory per thread
  // Cold data: O_DIRECT (large unaligned reads through bounce buffers);
  // bytes already in the page cache are still copied from there. Small
  // reads stay buffered. Off: every read goes through the page cache.
  bool direct_io = true;
  // Shared reads: when other ranks on its machine read at least half of the
  // bytes a rank reads of a data file (a resharded load: saved Shard(0),
  // loaded Shard(1); replicated tensors), the disk reads those bytes once,
  // not once per rank: one of those ranks reads the file with O_DIRECT into
  // a small shared-memory ring the others copy from (`shared_memory`), else
  // they all read it through the page cache. Adds collectives: must be the
  // same on every rank. Off: each rank reads alone.
  bool share_reads = true;
  // Shared reads through shared-memory rings (/dev/shm, 8 x 8 MiB per
  // reading rank); off, or when a ring cannot be set up: the page cache.
  bool shared_memory = true;
  FileSystem* fs = nullptr;
  ProgressFn progress;
  // Copies into the targets marked on_device (DeviceMemory::CopyToDevice);
  // required when there are any (InvalidArgument otherwise). Their bytes
  // are staged in at most device_staging_bytes of host memory (two
  // buffers, registered through DeviceMemory::Register for the load and
  // freed after it), each copied to the device while the other fills.
  std::shared_ptr<DeviceMemory> device;
  uint64_t device_staging_bytes = uint64_t{256} << 20;
  // A check before anything is read, made in the load's first collective
  // when `check_reports` is set (on every rank alike; LoadOpenedSource):
  // every rank's `local_failure` (a failure it met preparing its part: the
  // load fails on every rank, naming the lowest failing rank) and `report`
  // (the caller's, e.g. the Python package's key matching) are gathered on
  // every rank, then `check_reports` runs on every rank with every rank's
  // report, by rank; a failure it returns fails the load before any byte is
  // read. It must decide the same on every rank.
  Status local_failure = Status();
  std::string report;
  std::function<Status(const std::vector<std::string>& reports)> check_reports;
  // Host memory the caller keeps registered with `device` and lends to
  // this load alone, 4 KiB aligned: when it holds both staging buffers (2
  // x max(device_staging_bytes / 2 rounded down to 4 KiB, 1 MiB)), they are
  // carved from it, and nothing is allocated or registered (a caller that
  // loads again and again pays for page-locking once); else it is unused.
  std::span<char> device_staging_memory;
};

struct LoadResult {
  std::string path;  // the checkpoint directory or file actually loaded
  std::string tag;
  // As saved, in canonical JSON text (SaveState): values an object ("{}"
  // when none), metadata and layout "null" when none.
  std::string values;
  std::string metadata;
  std::string layout;
  int saved_world_size = 1;
  // Global blobs, and this rank's per-rank blobs (when the checkpoint has
  // one for this rank number).
  std::map<std::string, std::string> blobs;
  std::vector<std::string> missing;     // requested keys not in the checkpoint
  std::vector<std::string> unexpected;  // checkpoint keys nobody on this rank asked for
  uint64_t bytes_needed = 0;
  uint64_t bytes_read = 0;
  uint64_t chunks_verified = 0;
  // Of the bytes this rank read from a shared-memory ring or through the
  // page cache because of share_reads, those another rank on its machine
  // read too.
  uint64_t bytes_shared = 0;
  double seconds = 0;
  // A manager's load (CheckpointManager::Load): the step loaded, the bytes
  // this rank read by the tier it read them from ("memory", "root"), and
  // why a tier's copy or the latest step was passed over.
  std::optional<int64_t> step;
  std::map<std::string, uint64_t> bytes_by_tier;
  std::vector<std::string> warnings;
};

// Loads the requested slices from `path`: a checkpoint directory, a root
// (its `latest`, else its newest committed checkpoint), a single
// .safetensors file, or a Hugging Face model directory. Errors:
// NotFound (no checkpoint there; missing keys unless allow_partial, listing
// them), InvalidArgument (shape mismatch naming the key and both shapes;
// dtype mismatch without convert_dtypes), DataLoss (corrupt, truncated or
// missing data file, checksum mismatch: names the file, tensor and chunk). A load that
// fails after it began reading adds the keys of this rank's targets it may
// have partly overwritten; one refused before that changed none.
Result<LoadResult> Load(const LoadRequest& request, const std::string& path, Comm& comm,
                        const LoadOptions& options);

// ---------------------------------------------------- step-tagged roots --

struct CheckpointInfo {
  std::string tag;
  std::string path;
  // The step a manager saved it as (its commit record); for checkpoints
  // without a record, that of a "step-N" tag.
  std::optional<int64_t> step;
  uint64_t bytes = 0;           // sum of data file sizes
  int64_t mtime_unix = 0;       // of its index
  // Its commit record (docs/format.md §1); 0 for checkpoints without one.
  uint64_t sequence = 0;
  int64_t committed_ns = 0;
  bool moved_latest = false;  // its save replaced `latest`
  bool is_latest = false;
  // Non-empty when its place in the commit order is unknown, saying why:
  // its commit record cannot be trusted (unreadable, not a regular file,
  // malformed, a field out of range), or it has none though it was
  // committed after checkpoints that have one. Such a checkpoint is never
  // removed by retention, and when it might be newer than the latest by
  // the rules of docs/format.md §1, no checkpoint is_latest: resolving the
  // root's latest is then an error (DataLoss) rather than a guess.
  std::string order_fault;
  // A manager with a memory tier (CheckpointManager::List): the tiers that
  // hold it committed, fastest first ("memory", "root"); `path` is the
  // copy in the first. Empty otherwise.
  std::vector<std::string> tiers;
};

// Committed checkpoints under `root`, oldest first in commit order
// (docs/format.md §1: commit records, never file times, order checkpoints
// that have them), then those whose order is unknown (order_fault), by tag.
// Leftovers of interrupted saves are never listed.
Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root,
                                                    FileSystem* fs = nullptr);

// The memory tier of a CheckpointManager (docs/design.md, "Memory tier"):
// every save goes into a folder in node-local shared memory, in the
// checkpoint format and with the commit protocol of any root, and every
// persist_every-th is then copied to the manager's root in the background.
// Files there survive the death of the training process, not of the node.
struct MemoryTierOptions {
  // The tier's folder: empty for /dev/shm/shardsafe-<16 hex digits of a
  // hash of the manager's root> (the same path after a restart). Every rank
  // must see the same folder: ranks on several nodes (hosts, or folders)
  // are refused, since replicas on peer nodes are not built yet.
  std::string dir;
  // Copies of each rank's shards on other nodes. With every rank on one
  // node there is no other node to hold one: a save says so once (a
  // warning) and the tier holds one copy.
  int replicas = 1;
  int keep_last = 2;  // checkpoints the tier keeps (>= 1)
};

// One committed copy of a manager's checkpoint in one tier.
struct TierCopy {
  std::string tier;  // "memory" or "root"
  std::string path;  // without a memory tier, the latest asked: the root (the load resolves it)
  int64_t step = 0;  // -1: the root's latest, not resolved yet
};

// Checkpoints in ROOT/step-NNNNNNNN, a `latest` pointer, and retention.
class AsyncSaver;
class AsyncSaveHandle;
class Persister;

class CheckpointManager {
 public:
  struct Options {
    int keep_last = 0;  // keep this many newest committed checkpoints; 0: all
    FileSystem* fs = nullptr;
    // How a step names its checkpoint: one "{step}" or "{step:0Nd}" in a
    // tag (docs/format.md §1), e.g. "global_step{step}". The step is also
    // recorded in the checkpoint's commit record.
    std::string tag_format = "step-{step:08d}";
    // Saves go to memory first (MemoryTierOptions); every persist_every-th
    // (>= 1) is also written to the root, from the memory copy, in the
    // background (on rank 0; a local root only). Unset: saves go to the root.
    std::optional<MemoryTierOptions> memory = std::nullopt;
    int persist_every = 1;
  };
  CheckpointManager(std::string root, Options options);
  ~CheckpointManager();  // waits for an async save and a persist in flight
  // InvalidArgument for a bad memory tier (keep_last or persist_every < 1,
  // replicas < 0, an s3:// root); every call of a manager with one checks.
  static Status CheckOptions(const std::string& root, const Options& options);

  const std::string& root() const { return root_; }

  // Saves as ROOT/TAG (the tag format's name for `step`), points `latest`
  // at it (unless options.update_latest is false), then removes the oldest
  // checkpoints beyond keep_last (as Prune). InvalidArgument for a bad tag
  // format.
  Result<SaveStats> Save(int64_t step, const SaveState& state, Comm& comm,
                         SaveOptions options);
  // The same in the background (shardsafe/async_save.h): returns once this
  // rank's state is staged; `latest` and retention follow the commit. A
  // failed async save is reported by its handle only (shardsafe/async_save.h).
  Result<std::shared_ptr<AsyncSaveHandle>> AsyncSave(int64_t step, const SaveState& state,
                                                     Comm& comm, SaveOptions options);
  // Collective: allocates the async saves' staging memory for `state` now
  // (AsyncSaver::Reserve), so that the first AsyncSave does not pay for it.
  Status ReserveAsyncSave(const SaveState& state, Comm& comm, const SaveOptions& options = {});
  // Bytes of async save staging memory held (0 before the first
  // ReserveAsyncSave or AsyncSave).
  size_t async_staging_bytes() const;
  // Waits for the async save in flight, if any, and then for the persist
  // in flight (memory tier); the first failure.
  Status WaitForAsyncSave();
  // Step of the latest checkpoint (ListCheckpoints' is_latest); nullopt for
  // an empty root or a latest checkpoint without a step. DataLoss when
  // which is the latest cannot be told (CheckpointInfo::order_fault). With
  // a memory tier: the newer of the tier's and the root's.
  Result<std::optional<int64_t>> LatestStep();
  // Loads step `step`, or the latest when nullopt. With a memory tier, the
  // copies of LoadOrder in turn: a copy that is corrupt or incomplete
  // (DataLoss, a data file missing) is passed over with a warning naming
  // the tier and the error (file, tensor, chunk), for the next copy of the
  // same step, then (the latest asked) the newest older step; any other
  // error, or the last copy's, is the load's.
  Result<LoadResult> Load(const LoadRequest& request, std::optional<int64_t> step, Comm& comm,
                          LoadOptions options);
  // Collective: the copies a load of `step` (nullopt: the latest) tries,
  // in order, the same on every rank (rank 0 lists the tiers): `step`'s
  // copies, fastest tier first (NotFound when none); or the latest step's,
  // then every older step's, newest first. Without a memory tier, the
  // root's copy alone.
  Result<std::vector<TierCopy>> LoadOrder(std::optional<int64_t> step, Comm& comm);
  // The root's checkpoints; with a memory tier, the tiers' together, oldest
  // step first, each with the tiers that hold it (CheckpointInfo::tiers).
  Result<std::vector<CheckpointInfo>> List();
  // The memory tier's folder ("" without one).
  std::string memory_dir() const;
  // Removes the oldest committed checkpoints (in commit order) until `keep`
  // remain (keep >= 1), but never the newest one, the one `latest` names
  // (it counts among the `keep`), nor one a load in progress holds
  // (CheckpointSource::pin; it stays beside the `keep`, never in place of a
  // newer one, and a later prune removes it), nor one whose order is unknown (CheckpointInfo::order_fault:
  // kept apart from the `keep`, and named in `*warnings` when set). Each is
  // hidden by an atomic rename before it is deleted. Returns the tags
  // removed.
  Result<std::vector<std::string>> Prune(int keep, std::vector<std::string>* warnings = nullptr);

  // The tag of `step` under this manager's tag format ("step-00000100" by
  // default).
  Result<std::string> TagOf(int64_t step) const;

 private:
  Result<std::string> SaveRoot(int64_t step, Comm& comm);
  void Persist(int64_t step, const std::string& tag, Comm& comm,
               std::shared_ptr<AsyncSaveHandle> after);

  std::string root_;
  Options options_;
  std::unique_ptr<AsyncSaver> saver_;  // created by the first AsyncSave
  std::unique_ptr<Persister> persister_;  // memory tier: copies to the root
  int saves_since_persist_ = 0;
  bool tier_checked_ = false;  // every rank shares the tier's folder
};

// The tag rules of docs/format.md §1. InvalidArgument naming the problem.
Status ValidateTag(std::string_view tag);

}  // namespace shardsafe
