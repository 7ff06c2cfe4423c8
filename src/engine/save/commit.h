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

#include "engine/save/save_writer.h"
#include "engine/save/user_json.h"
#include "format/index.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

// A save's temporary directory and the lock rank 0 holds on it until the
// save is committed or abandoned (null where the file system has no locks).
struct TmpDir {
  std::string path;
  std::shared_ptr<FileLock> lock;
};

// Step 1. Leftovers are temporary directories nobody holds a lock on (a
// save killed before committing): saves of other tags still in progress,
// in this process or another, are left alone.
Result<TmpDir> PrepareSave(FileSystem& fs, const std::string& root, const std::string& tag,
                           bool overwrite);

// The index of a save from its plan and what each rank wrote (by rank).
Result<CheckpointIndex> BuildIndex(const SavePlan& plan,
                                   const std::vector<std::vector<WrittenFile>>& written,
                                   const UserJson& json, const std::string& tag,
                                   int world_size);

// How a save commits (steps 4-6).
struct CommitOptions {
  bool overwrite = false;      // step 5 swaps out an existing checkpoint
  bool update_latest = false;  // step 6 runs
  std::optional<int64_t> step; // recorded in the commit record
  int keep_last = 0;           // step 7 runs when > 0
};

// Steps 4-7: the commit record (its sequence read from the root's committed
// checkpoints) and the index, then the rename, `latest` and retention. A failure before the commit
// point is returned (nothing is committed); failures after it are appended
// to `warnings` and the result is OK, because the checkpoint is committed.
Status CommitSave(FileSystem& fs, const std::string& tmp_dir, const std::string& root,
                  const CheckpointIndex& index, const CommitOptions& commit,
                  std::vector<std::string>* warnings);

// Best-effort removal of a failed save's temporary directory.
void AbandonSave(FileSystem& fs, const std::string& tmp_dir);

}  // namespace shardsafe
