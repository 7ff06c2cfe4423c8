#include "engine/save/commit.h"

#include <chrono>
#include <map>

#include "base/env.h"
#include "base/thread_pool.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/plan/plan_home.h"
#include "engine/save/object_store_commit.h"
#include "format/checksum_file.h"
#include "format/chunk_table.h"

namespace shardsafe {
namespace {

void Warn(const Status& s, std::vector<std::string>* warnings) {
  if (!s.ok()) warnings->push_back(s.message());
}

// Step 5 when a checkpoint with the same tag exists: swap; the old one,
// now at `tmp_dir`, is claimed for deletion unless a load is reading it
// (then the next save's cleanup removes it).
Status PublishOverwrite(FileSystem& fs, const std::string& tmp_dir, const std::string& final_dir,
                        std::vector<ClaimedDir>* to_delete, std::vector<std::string>* warnings) {
  SS_RETURN_IF_ERROR(fs.RenameExchange(tmp_dir, final_dir));  // the commit point
  Warn(fs.SyncDir(ParentDir(final_dir)), warnings);
  if (auto old = ClaimDir(fs, tmp_dir)) to_delete->push_back(std::move(*old));
  return Status();
}

// Steps 4 (the commit record) to 6, with the root locked; what step 5
// replaced goes to `to_delete`.
Status Publish(FileSystem& fs, const std::string& tmp_dir, const std::string& root,
               const std::string& tag, const CommitOptions& commit,
               std::vector<ClaimedDir>* to_delete, std::vector<std::string>* warnings) {
  SS_ASSIGN_OR_RETURN(CommitRecord record,
                      NextCommitRecord(fs, root, commit.step, commit.update_latest));
  SS_RETURN_IF_ERROR(WriteSaveFile(fs, JoinPath(tmp_dir, kCommitFileName),
                                 SerializeCommitRecord(record)));
  SS_RETURN_IF_ERROR(fs.SyncDir(tmp_dir));
  const std::string final_dir = JoinPath(root, tag);
  if (commit.overwrite && fs.Stat(final_dir).ok()) {  // step 5
    SS_RETURN_IF_ERROR(PublishOverwrite(fs, tmp_dir, final_dir, to_delete, warnings));
  } else {
    SS_RETURN_IF_ERROR(fs.Rename(tmp_dir, final_dir));  // the commit point
    Warn(fs.SyncDir(root), warnings);
  }
  if (commit.update_latest) {  // step 6
    Warn(WriteFileAtomically(fs, JoinPath(root, kLatestFileName), tag + "\n"), warnings);
  }
  return Status();
}

}  // namespace

Result<TmpDir> PrepareSave(FileSystem& fs, const std::string& root, const std::string& tag,
                           bool overwrite) {
  SS_RETURN_IF_ERROR(ValidateTag(tag));
  if (fs.IsObjectStore()) return PrepareObjectStoreSave(fs, root, tag, overwrite);
  SS_RETURN_IF_ERROR(CreateDirs(fs, root));
  std::vector<ClaimedDir> leftovers;
  Result<TmpDir> tmp = [&]() -> Result<TmpDir> {
    SS_ASSIGN_OR_RETURN(auto root_lock, LockRoot(fs, root));
    leftovers = ClaimLeftovers(fs, root);
    const std::string final_dir = JoinPath(root, tag);
    if (!overwrite && fs.Stat(final_dir).ok()) {
      return AlreadyExistsError("checkpoint " + final_dir + " already exists");
    }
    const std::string path = JoinPath(root, std::string(kTmpPrefix) + tag + "." + RandomSuffix());
    TmpDir made{SaveDirs{path, path, ""}, nullptr};
    SS_RETURN_IF_ERROR(fs.CreateDir(path));
    auto lock = fs.TryLock(path, LockMode::kExclusive);
    if (lock.ok()) {
      made.lock = std::move(*lock);
    } else if (lock.status().code() != StatusCode::kUnimplemented) {
      fs.RemoveAll(path).IgnoreError();
      return lock.status();
    }
    return made;
  }();
  RemoveClaimed(fs, std::move(leftovers)).IgnoreError();  // harmless if it fails
  return tmp;
}

namespace {

// Version 3: after the data files, the checksum file of each rank that
// writes chunks (`written`, by rank), as WriteChecksumFile writes it.
void AddChecksumFiles(const SavePlan& plan, const std::vector<std::vector<WrittenFile>>& written,
                      const std::string& file_suffix, CheckpointIndex* index) {
  for (int rank = 0; rank < static_cast<int>(written.size()); ++rank) {
    uint64_t entries = 0;
    for (const WrittenFile& f : written[rank]) {
      for (uint32_t c : plan.files[f.plan_file].chunks) entries += plan.chunks[c].bytes > 0;
    }
    if (entries == 0) continue;
    index->checksum_files.push_back(static_cast<uint32_t>(index->files.size()));
    index->files.push_back({ChecksumFileName(rank, file_suffix), ChecksumFileBytes(entries), rank});
  }
}

}  // namespace

void StampIndex(const UserJson& json, const std::string& tag, CheckpointIndex* index) {
  index->tag = tag;
  index->created_unix = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  if (!json.layout.empty()) index->layout = json.layout;
  if (!json.metadata.empty()) index->metadata = json.metadata;
  index->values = json.values;
}

Result<CheckpointIndex> BuildIndex(const SavePlan& plan,
                                   const std::vector<std::vector<WrittenFile>>& written,
                                   const UserJson& json, const std::string& tag,
                                   int world_size, const std::string& file_suffix,
                                   IndexForm form) {
  CheckpointIndex index;
  index.world_size = world_size;
  StampIndex(json, tag, &index);
  index.files.resize(plan.files.size());
  // Each chunk goes straight to its place: its tensor's chunks, in plan
  // order, filled from what the writers reported.
  std::vector<IndexChunk*> place(form.chunks ? plan.chunks.size() : 0, nullptr);
  for (const PlannedTensor& t : plan.tensors) {
    IndexTensor& tensor = index.tensors[t.key] = IndexTensor{t.dtype, t.shape, {}};
    if (!form.chunks) continue;
    tensor.chunks.resize(t.chunks.size());
    for (size_t i = 0; i < t.chunks.size(); ++i) place[t.chunks[i]] = &tensor.chunks[i];
  }
  std::vector<IndexBlobChunk> blobs(plan.blobs.size());
  for (const auto& rank_files : written) {
    for (const WrittenFile& wf : rank_files) {
      if (wf.plan_file >= plan.files.size()) return InternalError("bad file in save report");
      const PlannedFile& pf = plan.files[wf.plan_file];
      if (wf.chunks.size() != pf.chunks.size() || wf.blobs.size() != pf.blobs.size()) {
        return InternalError("save report does not match the plan");
      }
      index.files[wf.plan_file] = {DataFileName(pf.rank, pf.number, file_suffix), wf.bytes,
                                   pf.rank};
      for (size_t i = 0; form.chunks && i < pf.chunks.size(); ++i) {
        const PlannedChunk& c = plan.chunks[pf.chunks[i]];
        if (place[pf.chunks[i]] == nullptr) return InternalError("a planned chunk of no tensor");
        std::optional<uint32_t> crc;
        if (!form.checksum_files) crc = wf.chunks[i].crc32c;
        *place[pf.chunks[i]] = {c.slice, wf.plan_file, wf.chunks[i].at, c.bytes, crc};
      }
      for (size_t i = 0; i < pf.blobs.size(); ++i) {
        const PlannedBlob& b = plan.blobs[pf.blobs[i]];
        blobs[pf.blobs[i]] = {b.rank, wf.plan_file, wf.blobs[i].at, b.bytes, wf.blobs[i].crc32c};
      }
    }
  }
  for (size_t i = 0; i < plan.blobs.size(); ++i) {
    IndexBlob& blob = index.blobs[plan.blobs[i].name];
    blob.per_rank = plan.blobs[i].per_rank;
    blob.chunks.push_back(blobs[i]);
  }
  if (form.checksum_files) AddChecksumFiles(plan, written, file_suffix, &index);
  return index;
}

Result<bool> WritesChunkTable(uint64_t chunks, uint64_t min_chunks) {
  if (min_chunks == 0) {
    SS_ASSIGN_OR_RETURN(const int64_t env,
                        EnvInteger("SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS",
                                   kDefaultChunkTableMinChunks, 1, INT64_MAX));
    min_chunks = static_cast<uint64_t>(env);
  }
  return chunks >= min_chunks;
}

Result<CommitIndex> IndexToCommit(CheckpointIndex* index, bool chunk_table,
                                  const std::string& file_suffix,
                                  std::shared_ptr<const EncodedChunkTable> table) {
  if (!chunk_table) return SerializeIndexToCommit(*index, nullptr);
  if (!table) {
    std::vector<int> homes;
    homes.reserve(index->tensors.size());
    for (const auto& [key, tensor] : index->tensors) {
      homes.push_back(HomeOf(key, index->world_size));
    }
    table = std::make_shared<const EncodedChunkTable>(EncodeChunkTable(
        *index, homes, [&](int rank) { return ChunkTableFileName(rank, file_suffix); }));
  }
  SS_RETURN_IF_ERROR(SetChunkTable(*table, index));
  return SerializeIndexToCommit(*index, std::move(table));
}

Status CommitSave(FileSystem& fs, const SaveDirs& dirs, const std::string& root,
                  const CheckpointIndex& index, const CommitIndex& written,
                  const CommitOptions& commit, std::vector<std::string>* warnings) {
  if (fs.IsObjectStore()) {
    return CommitToObjectStore(fs, dirs, root, index, written, commit, warnings);
  }
  const std::string& tmp_dir = dirs.tmp;
  // Step 4: the index; the commit record once the root is locked.
  if (written.table) SS_RETURN_IF_ERROR(WriteChunkTable(fs, tmp_dir, *written.table));
  SS_RETURN_IF_ERROR(WriteSaveFile(fs, JoinPath(tmp_dir, kIndexFileName), written.text));
  std::vector<ClaimedDir> replaced, pruned;
  {
    SS_ASSIGN_OR_RETURN(auto root_lock, LockRoot(fs, root));
    SS_RETURN_IF_ERROR(Publish(fs, tmp_dir, root, index.tag, commit, &replaced, warnings));
    if (commit.keep_last > 0) {  // step 7
      auto hidden = HideOldCheckpoints(fs, root, commit.keep_last, nullptr, warnings);
      if (hidden.ok()) pruned = std::move(*hidden);
      Warn(hidden.status().WithContext("retention after save"), warnings);
    }
  }
  Warn(RemoveClaimed(fs, std::move(replaced)), warnings);
  Warn(RemoveClaimed(fs, std::move(pruned)).WithContext("retention after save"), warnings);
  return Status();
}

void AbandonSave(FileSystem& fs, const SaveDirs& dirs) {
  if (!dirs.tmp.empty()) fs.RemoveAll(dirs.tmp).IgnoreError();
  if (dirs.file_suffix.empty()) return;  // the data files were in dirs.tmp
  auto entries = fs.ListDir(dirs.data);
  if (!entries.ok()) return;
  for (const DirEntry& e : *entries) {
    if (!e.is_dir && WrittenBySave(e.name, dirs.file_suffix)) {
      fs.RemoveFile(JoinPath(dirs.data, e.name)).IgnoreError();
    }
  }
}

}  // namespace shardsafe
