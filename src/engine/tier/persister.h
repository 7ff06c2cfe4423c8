// Persisting the memory tier: a committed checkpoint copied, file by file,
// into another root through the commit protocol (engine/save/commit.h),
// in the background.
//
// The copy is the checkpoint as committed: its data files, checksum files
// and chunk table parts byte for byte, its index as it is; only the commit
// record is the destination root's (the next sequence there, the same
// step). So a step is the same checkpoint in both tiers. Before the copy
// is committed every chunk of it is checked against its checksum
// (VerifyCheckpoint): a corrupt source is never persisted. While it is
// copied the source is pinned (its index locked shared, as a load does),
// so the memory tier's retention skips it.
//
// What a crash leaves: as a save's (commit.h): before the rename a
// .tmp-TAG.NONCE that the next save into the root removes, the root's
// committed checkpoints untouched; after it, the copy is committed.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/save/save_dirs.h"
#include "shardsafe/async_save.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/status.h"

namespace shardsafe {

// Copies the committed checkpoint `src` into `root` as TAG, committed as
// `commit` says (latest, retention), both on `fs` (null: the one `root`
// lies on, FileSystemFor); a local root only (an object store's
// data files carry the names of the save that wrote them: Unimplemented).
// Post-commit failures are appended to `warnings`. Errors name the file.
Status CopyCheckpoint(FileSystem* fs, const std::string& src, const std::string& root,
                      const std::string& tag, const CommitOptions& commit,
                      std::vector<std::string>* warnings);

// One persist at a time on a thread of its own, which enters no
// collective: the caller's thread (and the training) goes on.
class Persister {
 public:
  Persister() = default;
  ~Persister();  // waits
  Persister(const Persister&) = delete;
  Persister& operator=(const Persister&) = delete;

  // Waits for the persist in flight, then copies `src` into `root` as
  // `tag` (CopyCheckpoint) in the background, once `after` (the async save
  // writing `src`; null: none) has committed; if it failed, nothing is
  // copied (the failure is its handle's). A failure of the copy is Wait's.
  void Start(FileSystem* fs, std::string src, std::string root, std::string tag,
             CommitOptions commit, std::shared_ptr<AsyncSaveHandle> after);
  // Waits for the persist in flight; its outcome, or the failure of an
  // earlier one not yet returned (then cleared). A persist's post-commit
  // warnings (a `latest` or retention failure in the root) are dropped.
  Status Wait();

 private:
  std::mutex mu_;
  std::thread thread_;
  Status failure_;  // guarded by mu_
};

}  // namespace shardsafe
