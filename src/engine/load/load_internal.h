// Engine-internal loading from an already opened source (used by Load, and
// by tools that read many slices of one checkpoint).
#pragma once

#include "engine/load/source.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"

namespace shardsafe {

// Loads `request` from `src` on this process alone (no collectives), plus,
// when `blobs_of_rank` is set, the global blobs and that rank's per-rank
// blobs.
Status LoadFromSource(const LoadRequest& request, const CheckpointSource& src,
                      std::optional<int> blobs_of_rank, FileSystem& fs,
                      const LoadOptions& options, LoadResult* result);

// Collective: rank 0 resolves and validates `path` (OpenSource) and
// broadcasts it; every rank returns the same source, or the same error.
// Other ranks never read the index file.
Result<CheckpointSource> OpenSourceCollective(FileSystem& fs, const std::string& path,
                                              Comm& comm);

// Collective: Load from a source every rank got from OpenSourceCollective
// (so a caller that inspects the index first does not open it twice).
Result<LoadResult> LoadOpenedSource(const LoadRequest& request, const CheckpointSource& src,
                                    Comm& comm, const LoadOptions& options);

// Reads one blob chunk into *out, verifying its checksum when recorded
// (DataLoss naming the blob and file).
Status ReadBlob(FileSystem& fs, const CheckpointSource& src, const std::string& name,
                const IndexBlobChunk& chunk, std::string* out);

}  // namespace shardsafe
