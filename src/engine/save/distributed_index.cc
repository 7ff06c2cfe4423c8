#include "engine/save/distributed_index.h"

#include <algorithm>

#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/plan/distributed_plan.h"
#include "engine/save/commit.h"
#include "format/checksum_file.h"
#include "layout/plan_part.h"

namespace shardsafe {
namespace {

Status Bad(const std::string& what) {
  return InternalError("bad distributed save index message: " + what);
}

// A rank's summary as rank 0 reads it into the skeleton.
class SkeletonBuilder {
 public:
  Status Add(int rank, std::string_view msg) {
    wire::Reader r(msg);
    Status sent;
    SS_RETURN_IF_ERROR(r.Status(&sent));
    SS_RETURN_IF_ERROR(sent);
    CheckpointIndex& index = out_.index;
    const uint32_t base = static_cast<uint32_t>(index.files.size());
    SS_ASSIGN_OR_RETURN(uint64_t files, r.U64());
    for (uint64_t f = 0; f < files; ++f) {
      SS_ASSIGN_OR_RETURN(uint64_t bytes, r.U64());
      index.files.push_back({"", bytes, rank});
      out_.names.push_back({IndexSkeleton::FileKind::kData, rank, static_cast<uint32_t>(f)});
      out_.blob_slots.emplace_back();
    }
    SS_ASSIGN_OR_RETURN(uint64_t chunks, r.U64());
    if (chunks > 0) checksums_.push_back({rank, chunks});
    SS_ASSIGN_OR_RETURN(uint64_t blobs, r.U64());
    for (uint64_t b = 0; b < blobs; ++b) {
      SS_ASSIGN_OR_RETURN(uint32_t file, r.U32());
      if (file >= files) return Bad("a blob in a file the rank does not write");
      SS_ASSIGN_OR_RETURN(std::string name, r.Str());
      SS_ASSIGN_OR_RETURN(uint8_t per_rank, r.U8());
      IndexBlobChunk chunk;
      SS_ASSIGN_OR_RETURN(uint32_t owner, r.U32());
      chunk.rank = static_cast<int>(owner);
      chunk.file = base + file;
      SS_ASSIGN_OR_RETURN(chunk.at, r.U64());
      SS_ASSIGN_OR_RETURN(chunk.bytes, r.U64());
      IndexBlob& blob = index.blobs[name];
      blob.per_rank = per_rank != 0;
      out_.blob_slots[chunk.file].emplace_back(name, blob.chunks.size());
      blob.chunks.push_back(chunk);
    }
    SS_ASSIGN_OR_RETURN(uint64_t part_bytes, r.U64());
    SS_ASSIGN_OR_RETURN(uint64_t keys, r.U64());
    if (keys > 0) parts_.push_back({rank, part_bytes});
    for (uint64_t k = 0; k < keys; ++k) {
      SS_ASSIGN_OR_RETURN(std::string key, r.Str());
      IndexTensor tensor;
      SS_ASSIGN_OR_RETURN(tensor.dtype, GetDType(r));
      SS_ASSIGN_OR_RETURN(tensor.shape, r.Shape());
      IndexTableRef ref;
      ref.part = static_cast<uint32_t>(parts_.size() - 1);
      SS_ASSIGN_OR_RETURN(ref.count, r.U64());
      SS_ASSIGN_OR_RETURN(ref.directory_at, r.U64());
      SS_ASSIGN_OR_RETURN(ref.records_at, r.U64());
      SS_ASSIGN_OR_RETURN(ref.directory_crc32c, r.U32());
      tensor.table = ref;
      if (!index.tensors.emplace(std::move(key), std::move(tensor)).second) {
        return Bad("a key with two homes");
      }
    }
    if (!r.done()) return Bad("trailing bytes in a summary");
    return Status();
  }

  // After every rank's summary: the checksum files and the parts, after
  // the data files.
  IndexSkeleton Finish(int world) {
    CheckpointIndex& index = out_.index;
    index.world_size = world;
    for (const auto& [rank, chunks] : checksums_) {
      index.checksum_files.push_back(static_cast<uint32_t>(index.files.size()));
      index.files.push_back({"", ChecksumFileBytes(chunks), rank});
      out_.names.push_back({IndexSkeleton::FileKind::kChecksums, rank, 0});
    }
    for (const auto& [rank, bytes] : parts_) {
      const uint32_t file = static_cast<uint32_t>(index.files.size());
      index.chunk_tables.push_back({"", bytes, file});
      index.files.push_back({"", bytes, rank});
      out_.names.push_back({IndexSkeleton::FileKind::kTablePart, rank, 0});
    }
    return std::move(out_);
  }

 private:
  IndexSkeleton out_;
  std::vector<std::pair<int, uint64_t>> checksums_;  // (rank, its chunks)
  std::vector<std::pair<int, uint64_t>> parts_;      // (home, its part's bytes)
};

}  // namespace

IndexRounds::IndexRounds(int rank, int world, const SavePlan& part, const KeyHome* home)
    : rank_(rank), world_(world), part_(part), home_(home) {}

std::vector<std::string> IndexRounds::ToHomes() {
  std::vector<wire::Writer> to(world_);
  std::vector<uint8_t> used(world_, 0);
  for (uint32_t f = 0; f < part_.files.size() && error_.ok(); ++f) {
    Result<SafetensorsLayout> layout = LayOutFile(part_, f);
    if (!layout.ok()) {
      error_ = layout.status();
      break;
    }
    const PlannedFile& file = part_.files[f];
    for (size_t i = 0; i < file.chunks.size(); ++i) {
      const uint32_t c = file.chunks[i];
      const int home = HomeOf(part_.tensors[part_.chunks[c].tensor].key, world_);
      to[home].U32(WholeChunkNumber(part_, c));
      to[home].U32(WholeFileNumber(part_, f));
      to[home].U64(layout->offsets[i]);
      used[home] = 1;
    }
    layouts_.push_back(std::move(*layout));
  }
  std::vector<std::string> out(world_);
  for (int r = 0; r < world_; ++r) {
    if (used[r]) out[r] = to[r].Take();
  }
  return out;
}

Status IndexRounds::EncodePart(const std::vector<std::string>& from_writers,
                               std::vector<IndexTableRef>* refs) {
  if (home_ == nullptr) return Status();
  tensors_ = home_->IndexTensors();
  if (tensors_.empty()) return Status();
  // Each chunk number's tensor: the one with the last first number at or
  // before it (keys in order, so first numbers ascend).
  std::vector<std::vector<uint8_t>> seen(tensors_.size());
  for (size_t t = 0; t < tensors_.size(); ++t) seen[t].resize(tensors_[t].tensor.chunks.size());
  for (const std::string& msg : from_writers) {
    wire::Reader r(msg);
    while (!r.done()) {
      SS_ASSIGN_OR_RETURN(uint32_t number, r.U32());
      SS_ASSIGN_OR_RETURN(uint32_t file, r.U32());
      SS_ASSIGN_OR_RETURN(uint64_t at, r.U64());
      const auto after = std::upper_bound(
          tensors_.begin(), tensors_.end(), number,
          [](uint32_t n, const HomeTensor& t) { return n < t.first_number; });
      if (after == tensors_.begin()) return Bad("a chunk of no key of its home");
      const size_t t = static_cast<size_t>(after - tensors_.begin()) - 1;
      const uint64_t i = number - tensors_[t].first_number;
      if (i >= seen[t].size() || seen[t][i]) return Bad("a chunk of no key, or sent twice");
      seen[t][i] = 1;
      IndexChunk& chunk = tensors_[t].tensor.chunks[i];
      chunk.file = file;
      chunk.at = at;
    }
  }
  std::vector<const IndexTensor*> in_order;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (std::find(seen[t].begin(), seen[t].end(), 0) != seen[t].end()) {
      return Bad("a chunk of key \"" + tensors_[t].key + "\" that no writer placed");
    }
    in_order.push_back(&tensors_[t].tensor);
  }
  table_part_ = EncodeTablePart(in_order, 0, refs);
  return Status();
}

std::string IndexRounds::Summary(const std::vector<std::string>& from_writers) {
  std::vector<IndexTableRef> refs;
  if (error_.ok()) error_ = EncodePart(from_writers, &refs);
  wire::Writer w;
  w.Status(error_);
  if (!error_.ok()) return w.Take();
  w.U64(part_.files.size());
  uint64_t checksums = 0, blobs = 0;
  for (uint32_t f = 0; f < part_.files.size(); ++f) {
    w.U64(layouts_[f].file_size);
    for (uint32_t c : part_.files[f].chunks) checksums += part_.chunks[c].bytes > 0;
    blobs += part_.files[f].blobs.size();
  }
  w.U64(checksums);
  w.U64(blobs);
  for (uint32_t f = 0; f < part_.files.size(); ++f) {
    const PlannedFile& file = part_.files[f];
    for (size_t i = 0; i < file.blobs.size(); ++i) {
      const PlannedBlob& blob = part_.blobs[file.blobs[i]];
      w.U32(f);
      w.Str(blob.name);
      w.U8(blob.per_rank ? 1 : 0);
      w.U32(static_cast<uint32_t>(blob.rank));
      w.U64(layouts_[f].offsets[file.chunks.size() + i]);
      w.U64(blob.bytes);
    }
  }
  w.U64(table_part_.size());
  w.U64(tensors_.size());
  for (size_t t = 0; t < tensors_.size(); ++t) {
    w.Str(tensors_[t].key);
    w.U8(static_cast<uint8_t>(tensors_[t].tensor.dtype));
    w.Shape(tensors_[t].tensor.shape);
    w.U64(refs[t].count);
    w.U64(refs[t].directory_at);
    w.U64(refs[t].records_at);
    w.U32(refs[t].directory_crc32c);
  }
  return w.Take();
}

Result<IndexSkeleton> IndexRounds::Assemble(const std::vector<std::string>& summaries) {
  SkeletonBuilder builder;
  for (int r = 0; r < static_cast<int>(summaries.size()); ++r) {
    Status s = builder.Add(r, summaries[r]);
    if (!s.ok()) return s.WithContext("the index summary of rank " + std::to_string(r));
  }
  return builder.Finish(static_cast<int>(summaries.size()));
}

Result<CheckpointIndex> IndexOfSave(const IndexSkeleton& skeleton,
                                    const std::vector<std::vector<WrittenFile>>& written,
                                    const UserJson& json, const std::string& tag,
                                    const std::string& file_suffix) {
  CheckpointIndex index = skeleton.index;
  StampIndex(json, tag, &index);
  for (size_t f = 0; f < index.files.size(); ++f) {
    const IndexSkeleton::FileName& n = skeleton.names[f];
    switch (n.kind) {
      case IndexSkeleton::FileKind::kData:
        index.files[f].name = DataFileName(n.rank, n.number, file_suffix);
        break;
      case IndexSkeleton::FileKind::kChecksums:
        index.files[f].name = ChecksumFileName(n.rank, file_suffix);
        break;
      case IndexSkeleton::FileKind::kTablePart:
        index.files[f].name = ChunkTableFileName(n.rank, file_suffix);
        break;
    }
  }
  for (IndexChunkTable& t : index.chunk_tables) t.name = index.files[*t.file].name;
  for (const std::vector<WrittenFile>& files : written) {
    for (const WrittenFile& wf : files) {
      if (wf.plan_file >= skeleton.blob_slots.size()) return Bad("a report of no data file");
      const auto& slots = skeleton.blob_slots[wf.plan_file];
      if (wf.blobs.size() != slots.size()) return Bad("a report of other blobs");
      for (size_t i = 0; i < slots.size(); ++i) {
        index.blobs.at(slots[i].first).chunks[slots[i].second].crc32c = wf.blobs[i].crc32c;
      }
    }
  }
  return index;
}

Result<IndexSkeleton> IndexOverComm(Comm& comm, const SavePlan& part, const KeyHome* home,
                                    std::string* table_part) {
  IndexRounds rounds(comm.rank(), comm.size(), part, home);
  SS_ASSIGN_OR_RETURN(std::vector<std::string> in, comm.AllToAll(rounds.ToHomes()));
  SS_ASSIGN_OR_RETURN(in, comm.Gather(rounds.Summary(in), 0));
  Result<IndexSkeleton> skeleton = IndexSkeleton();
  Result<std::string> outcome = std::string();
  if (comm.rank() == 0) skeleton = IndexRounds::Assemble(in);
  if (!skeleton.ok()) outcome = skeleton.status();
  SS_RETURN_IF_ERROR(BroadcastOrFail(comm, 0, outcome).status());
  *table_part = rounds.table_part();
  return skeleton;
}

}  // namespace shardsafe
