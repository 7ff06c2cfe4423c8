// The commit protocol on an object store (FileSystem::IsObjectStore: S3),
// where there is no rename and no lock: data objects under their final
// prefix with names of their own, then a claim and the index created with
// conditional writes, `latest` moved by compare-and-swap.
// docs/design.md, "Object storage", lists the steps and what a crash
// between any two leaves behind; commit.h is the POSIX protocol, and calls
// these for an object store.
#pragma once

#include <string>
#include <vector>

#include "engine/save/save_dirs.h"
#include "format/index.h"

namespace shardsafe {

// Step 1 on rank 0: removes leftovers older than ObjectLeftoverAge(), fails
// with AlreadyExists if ROOT/TAG is committed (unless overwriting), and
// picks the save's names: data objects go to ROOT/TAG with a suffix of
// their own, markers to ROOT/.tmp-TAG.NONCE (created, so that it exists).
Result<TmpDir> PrepareObjectStoreSave(FileSystem& fs, const std::string& root,
                                      const std::string& tag, bool overwrite);

// Steps 4-7 on rank 0: checks that every data object (and checksum
// object) is there whole, claims
// the tag (commit.json, created only if absent), creates the index (the
// commit point; AlreadyExists if another save committed the tag first),
// moves `latest` forward and applies retention. Failures after the commit
// point are appended to `warnings`.
Status CommitToObjectStore(FileSystem& fs, const SaveDirs& dirs, const std::string& root,
                           const CheckpointIndex& index, const CommitIndex& written,
                           const CommitOptions& commit, std::vector<std::string>* warnings);

}  // namespace shardsafe
