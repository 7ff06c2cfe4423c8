#include "engine/save/object_store_commit.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "base/thread_pool.h"
#include "engine/catalog/checkpoint_dir.h"
#include "format/index.h"

namespace shardsafe {
namespace {

// Written into the temporary prefix when the save starts: the prefix
// exists from then on (an async save's ranks watch it), and its age tells
// a killed save's leftovers from a running save.
constexpr std::string_view kStartedMarker = "started";

// How long a save that finds the tag claimed waits for the claim's save to
// commit (it is at its last steps: the claim comes right before the index).
constexpr std::chrono::seconds kClaimWait{60};

// Compare-and-swap rounds before step 6 gives up (each lost round means
// another writer moved `latest` in between).
constexpr int kLatestRounds = 16;

void Warn(const Status& s, std::vector<std::string>* warnings) {
  if (!s.ok()) warnings->push_back(s.message());
}

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Object stats in flight at once: each costs a round trip, and a job of
// 16,384 ranks has tens of thousands of data and checksum objects.
constexpr size_t kParallelStats = 32;

// Every data file the index names is there with its size: a cleanup in
// another process that took this save for a dead one (ObjectLeftoverAge)
// must not lead to a commit of missing data.
Status CheckDataObjects(FileSystem& fs, const std::string& dir, const CheckpointIndex& index) {
  ThreadPool pool(index.files.size() > 1 ? std::min(kParallelStats, index.files.size()) : 0);
  TaskGroup stats(&pool);
  for (const IndexFile& f : index.files) {
    stats.Add([&fs, &f, path = JoinPath(dir, f.name)]() -> Status {
      Result<FileInfo> info = fs.Stat(path);
      if (!info.ok()) return info.status().WithContext("before committing");
      if (info->size != f.bytes) {
        return DataLossError(path + ": " + std::to_string(info->size) + " bytes in the store, " +
                             std::to_string(f.bytes) + " written");
      }
      return Status();
    });
  }
  return stats.Wait();
}

// Waits up to kClaimWait for the save that claimed `dir` to commit it.
bool CommitsMeanwhile(FileSystem& fs, const std::string& dir) {
  const auto deadline = std::chrono::steady_clock::now() + kClaimWait;
  auto pause = std::chrono::milliseconds(50);
  while (!IsCommitted(fs, dir)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
  return true;
}

// Step 4: creates commit.json in `dir` unless it exists. A claim without an
// index is a save in progress elsewhere (which this one waits for, to fail
// with AlreadyExists once it commits), or a dead one once older than
// ObjectLeftoverAge(); only a dead one is taken over.
Status ClaimTag(FileSystem& fs, const std::string& dir, const std::string& record,
                bool overwrite) {
  const std::string path = JoinPath(dir, kCommitFileName);
  if (overwrite) return WriteFileAtomically(fs, path, record);
  Status created = fs.CreateFileExclusive(path, record);
  if (created.code() != StatusCode::kAlreadyExists) return created;
  if (IsCommitted(fs, dir)) return AlreadyExistsError("checkpoint " + dir + " already exists");
  SS_ASSIGN_OR_RETURN(FileInfo claim, fs.Stat(path));
  const int64_t age = NowSeconds() - claim.mtime_seconds;
  if (age >= ObjectLeftoverAge().count()) return WriteFileAtomically(fs, path, record);
  if (CommitsMeanwhile(fs, dir)) return AlreadyExistsError("checkpoint " + dir + " already exists");
  return FailedPreconditionError(
      path + ": another save of this tag claimed it " + std::to_string(age) +
      " s ago and has not committed (a save in progress, or one killed less than " +
      std::to_string(ObjectLeftoverAge().count()) +
      " s ago); retry later, or remove the object if no save is running");
}

bool NewerCommit(const CommitRecord& a, const CommitRecord& b) {
  if (a.sequence != b.sequence) return a.sequence > b.sequence;
  return a.time_ns > b.time_ns;
}

// Step 6: points `latest` at `tag` unless it already names a newer commit,
// by compare-and-swap, so that it never goes backwards when two writers
// commit at once.
Status MoveLatestForward(FileSystem& fs, const std::string& root, const std::string& tag,
                         const CommitRecord& record) {
  const std::string path = JoinPath(root, kLatestFileName);
  for (int round = 0; round < kLatestRounds; ++round) {
    std::string version;
    std::optional<std::string> expected;
    Result<std::string> text = fs.ReadFileVersioned(path, 4096, &version);
    if (text.ok()) {
      expected = version;
      std::string named = *text;
      while (!named.empty() && (named.back() == '\n' || named.back() == '\r')) named.pop_back();
      if (named != tag && ValidateTag(named).ok()) {
        const std::string dir = JoinPath(root, named);
        // A record that cannot be trusted orders nothing: `latest` moves on.
        Result<std::optional<CommitRecord>> current = ReadCommitRecord(fs, dir);
        if (current.ok() && *current && IsCommitted(fs, dir) &&
            NewerCommit(**current, record)) {
          return Status();
        }
      }
    } else if (text.status().code() != StatusCode::kNotFound) {
      return text.status().WithContext("moving " + path);
    }
    Status s = fs.ReplaceFileIfVersion(path, tag + "\n", expected);
    if (s.code() != StatusCode::kFailedPrecondition) return s.WithContext("moving " + path);
  }
  return UnavailableError("moving " + path + ": other writers changed it " +
                          std::to_string(kLatestRounds) + " times in a row");
}

// After an overwrite: the replaced checkpoint's data objects, which the
// new index does not name.
Status RemoveReplacedData(FileSystem& fs, const std::string& dir, const CheckpointIndex& index) {
  std::set<std::string> named;
  for (const IndexFile& f : index.files) named.insert(f.name);
  SS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs.ListDir(dir));
  Status first;
  for (const DirEntry& e : entries) {
    if (e.is_dir || !IsSavedFile(e.name) || named.count(e.name)) continue;
    Status s = fs.RemoveFile(JoinPath(dir, e.name));
    if (first.ok()) first = s;
  }
  return first.WithContext("removing the data of the replaced checkpoint");
}

}  // namespace

Result<TmpDir> PrepareObjectStoreSave(FileSystem& fs, const std::string& root,
                                      const std::string& tag, bool overwrite) {
  RemoveClaimed(fs, ClaimLeftovers(fs, root)).IgnoreError();  // harmless if it fails
  const std::string final_dir = JoinPath(root, tag);
  if (!overwrite && IsCommitted(fs, final_dir)) {
    return AlreadyExistsError("checkpoint " + final_dir + " already exists");
  }
  const std::string nonce = RandomSuffix();
  SaveDirs dirs{JoinPath(root, std::string(kTmpPrefix) + tag + "." + nonce), final_dir,
                "." + nonce};
  SS_RETURN_IF_ERROR(WriteFileAtomically(fs, JoinPath(dirs.tmp, kStartedMarker), ""));
  return TmpDir{std::move(dirs), nullptr};
}

Status CommitToObjectStore(FileSystem& fs, const SaveDirs& dirs, const std::string& root,
                           const CheckpointIndex& index, const CommitIndex& written,
                           const CommitOptions& commit, std::vector<std::string>* warnings) {
  const std::string& text = written.text;
  if (written.table) SS_RETURN_IF_ERROR(WriteChunkTable(fs, dirs.data, *written.table));
  SS_RETURN_IF_ERROR(CheckDataObjects(fs, dirs.data, index));
  SS_ASSIGN_OR_RETURN(CommitRecord record,
                      NextCommitRecord(fs, root, commit.step, commit.update_latest));
  SS_RETURN_IF_ERROR(ClaimTag(fs, dirs.data, SerializeCommitRecord(record), commit.overwrite));
  // Step 5, the commit point.
  const std::string index_path = JoinPath(dirs.data, kIndexFileName);
  Status published = commit.overwrite ? WriteFileAtomically(fs, index_path, text)
                                      : fs.CreateFileExclusive(index_path, text);
  if (published.code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError("checkpoint " + dirs.data + " already exists");
  }
  SS_RETURN_IF_ERROR(published);
  fs.RemoveAll(dirs.tmp).IgnoreError();  // the started marker; a leftover is cleaned later
  if (commit.overwrite) Warn(RemoveReplacedData(fs, dirs.data, index), warnings);
  if (commit.update_latest) Warn(MoveLatestForward(fs, root, index.tag, record), warnings);
  if (commit.keep_last > 0) {  // step 7
    auto removed = HideOldCheckpoints(fs, root, commit.keep_last, nullptr, warnings);
    Warn(removed.status().WithContext("retention after save"), warnings);
    if (removed.ok()) {
      Warn(RemoveClaimed(fs, std::move(*removed)).WithContext("retention after save"), warnings);
    }
  }
  return Status();
}

}  // namespace shardsafe
