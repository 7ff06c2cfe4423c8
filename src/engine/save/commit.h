// The commit protocol: how a save becomes visible, atomically and durably.
//
// Steps (rank 0 runs the directory operations; every rank writes its data).
// Names directly under ROOT are only created, renamed or removed with
// ROOT's lock held (LockRoot, catalog/checkpoint_dir.h), briefly: other
// processes saving into or pruning ROOT wait for it, and deleting what was
// claimed happens after it is released.
//
//  1. Prepare (rank 0), once every rank has announced what it holds (so
//     every rank is done with its previous save): create ROOT if needed;
//     with ROOT locked, claim leftovers of earlier interrupted saves
//     (.tmp-* dirs nobody holds; .latest.tmp.* files are removed), fail
//     with AlreadyExists if ROOT/TAG exists (unless overwriting), create
//     ROOT/.tmp-TAG.NONCE and lock it (held until the save ends); then
//     delete the claimed leftovers.
//  2. Write (every rank): data files into the temporary directory, each
//     fdatasync'ed.
//  3. Agree (collective): every rank reports success and its checksums. If
//     any rank failed, rank 0 removes the temporary directory and every
//     rank returns that failure.
//  4. Index (rank 0): check the replicas (replica_check.h); write
//     shardsafe.json into the temporary directory and fdatasync it; lock
//     ROOT (held through step 7); write the commit record (commit.json: the
//     next commit sequence of the root, unique under the lock), fdatasync
//     it, fsync the temporary directory (file names durable).
//  5. Publish (rank 0): rename the temporary directory to ROOT/TAG and fsync
//     ROOT. This rename is the commit point. When overwriting, the old
//     checkpoint is swapped out atomically (renameat2 RENAME_EXCHANGE) and
//     removed afterwards.
//  6. Point (rank 0, manager saves that move it): replace ROOT/latest atomically
//     (temporary file, fdatasync, rename, fsync ROOT).
//  7. Retain (rank 0, manager saves with keep_last): hide the oldest
//     committed checkpoints beyond keep_last (HideOldCheckpoints: not one a
//     load holds), release ROOT, delete them.
//  Then rank 0 tells every rank the outcome (one broadcast).
//
// Save reports success exactly when step 5 happened: a failure in step 5's
// root fsync, in steps 6-7 or in telling the other ranks comes back as a
// warning on rank 0 (the checkpoint is committed and loads; a retry would
// only hit AlreadyExists).
//
// What a crash between two steps leaves behind:
//  - before 5: a .tmp-* directory that readers never look at and the next
//    save removes; `latest` and every committed checkpoint untouched.
//  - between 5 and 6: the new checkpoint is committed and loadable; `latest`
//    still names the previous one, which is also still loadable.
//  - during 6: `latest` holds the old tag or the new one, never a mix; a
//    .latest.tmp.* file may be left for the next save to remove.
#pragma once

#include <string>
#include <vector>

#include "engine/save/save_dirs.h"
#include "engine/save/save_writer.h"
#include "engine/save/user_json.h"
#include "format/index.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

// Step 1. Leftovers are temporary directories nobody holds a lock on (a
// save killed before committing): saves of other tags still in progress,
// in this process or another, are left alone. On an object store, where
// nothing can be locked, leftovers are those older than ObjectLeftoverAge()
// (checkpoint_dir.h).
Result<TmpDir> PrepareSave(FileSystem& fs, const std::string& root, const std::string& tag,
                           bool overwrite);

// What an index holds besides the plan's files, tensors and blobs.
struct IndexForm {
  // Version 3 (SaveStart::chunk_table): the chunks without checksums (they
  // are in the writers' checksum files, listed after the data files).
  bool checksum_files = false;
  // False: the tensors without their chunks, for a chunk table made before
  // (FileLayouts::table); `written` is then read only for blobs and files.
  bool chunks = true;
};

// Sets what an index says of one save: `tag`, the time, the user's JSON.
void StampIndex(const UserJson& json, const std::string& tag, CheckpointIndex* index);

// The index of a save from its plan and what each rank wrote (by rank),
// its data files named with `file_suffix` (SaveDirs).
Result<CheckpointIndex> BuildIndex(const SavePlan& plan,
                                   const std::vector<std::vector<WrittenFile>>& written,
                                   const UserJson& json, const std::string& tag,
                                   int world_size, const std::string& file_suffix,
                                   IndexForm form = {});

// Whether a save of `chunks` chunks writes a chunk table: from
// `min_chunks` chunks on (SaveOptions::chunk_table_min_chunks; 0:
// SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS, else kDefaultChunkTableMinChunks).
// InvalidArgument for a bad variable.
Result<bool> WritesChunkTable(uint64_t chunks, uint64_t min_chunks);

// What a commit writes for `index` (format/index.h): version 1, or with
// `chunk_table` version 4, its chunk table in parts, each tensor in the
// part of its home rank (HomeOf), the part of rank R named
// ChunkTableFileName(R, file_suffix); `table` when it was made before
// (FileLayouts::table). The table is set in *index (SetChunkTable).
Result<CommitIndex> IndexToCommit(CheckpointIndex* index, bool chunk_table,
                                  const std::string& file_suffix,
                                  std::shared_ptr<const EncodedChunkTable> table = nullptr);

// Steps 4-7: the commit record (its sequence read from the root's committed
// checkpoints) and the index, then the rename, `latest` and retention. A failure before the commit
// point is returned (nothing is committed); failures after it are appended
// to `warnings` and the result is OK, because the checkpoint is committed.
// On an object store the same steps run with conditional writes instead of
// the lock and the rename (docs/design.md, "Object storage").
// `written` is what IndexToCommit made of `index`.
Status CommitSave(FileSystem& fs, const SaveDirs& dirs, const std::string& root,
                  const CheckpointIndex& index, const CommitIndex& written,
                  const CommitOptions& commit, std::vector<std::string>* warnings);

// Best-effort removal of what a failed save wrote: its temporary
// directory and, on an object store, its data files (those with its
// suffix; another save's files under the same tag stay).
void AbandonSave(FileSystem& fs, const SaveDirs& dirs);

}  // namespace shardsafe
