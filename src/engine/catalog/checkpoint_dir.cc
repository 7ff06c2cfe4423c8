#include "engine/catalog/checkpoint_dir.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/env.h"
#include "format/index.h"

namespace shardsafe {
namespace {

bool IsTagChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '+' || c == '=' || c == '-';
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The newest modification time of the files in `dir` (nullopt if it
// cannot be listed or holds none).
std::optional<int64_t> NewestMtime(FileSystem& fs, const std::string& dir) {
  auto entries = fs.ListDir(dir);
  if (!entries.ok()) return std::nullopt;
  std::optional<int64_t> newest;
  for (const DirEntry& e : *entries) {
    auto info = fs.Stat(JoinPath(dir, e.name));
    if (info.ok()) newest = std::max(newest.value_or(info->mtime_seconds), info->mtime_seconds);
  }
  return newest;
}

// True if the committed index in `dir` names a file whose name ends with
// `suffix`; an index that cannot be read or parsed counts as naming it.
bool IndexNamesFileOfSave(FileSystem& fs, const std::string& dir, std::string_view suffix) {
  const std::string path = JoinPath(dir, kIndexFileName);
  auto text = ReadFileToString(fs, path, kMaxIndexBytes);
  if (!text.ok()) return text.status().code() != StatusCode::kNotFound;
  auto index = ParseIndex(*text, path);
  if (!index.ok()) return true;
  for (const IndexChunkTable& t : index->chunk_tables) {
    if (WrittenBySave(t.name, suffix)) return true;
  }
  return std::any_of(index->files.begin(), index->files.end(),
                     [&](const IndexFile& f) { return WrittenBySave(f.name, suffix); });
}

// The data objects of the dead save whose private prefix is `ledger`
// (".tmp-TAG.NONCE", written before any of them), under a tag that the
// uncommitted-tag sweep does not remove whole because another save
// committed it, or is writing to it: TAG/*.NONCE.safetensors. Deletes them
// unless the committed index names them (that save committed and was
// killed before removing its prefix) or one is younger than `before` (a
// save still running). True when the ledger may go: nothing of the save is
// left to find.
bool RemoveDataOfDeadSave(FileSystem& fs, const std::string& root, std::string_view ledger,
                          int64_t before) {
  const std::string_view name = ledger.substr(kTmpPrefix.size());
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || !ValidateTag(name.substr(0, dot)).ok()) return true;
  const std::string dir = JoinPath(root, std::string(name.substr(0, dot)));
  const std::string_view suffix = name.substr(dot);
  auto entries = fs.ListDir(dir);
  if (!entries.ok()) return entries.status().code() == StatusCode::kNotFound;
  std::vector<std::string> dead;
  for (const DirEntry& e : *entries) {
    if (!e.is_dir && WrittenBySave(e.name, suffix)) dead.push_back(JoinPath(dir, e.name));
  }
  if (dead.empty()) return true;
  if (IndexNamesFileOfSave(fs, dir, suffix)) return true;
  for (const std::string& path : dead) {
    auto info = fs.Stat(path);
    if (info.ok() && info->mtime_seconds > before) return false;
  }
  bool removed = true;
  for (const std::string& path : dead) removed &= fs.RemoveFile(path).ok();
  return removed;
}

// ClaimLeftovers on an object store: what nobody can hold a lock on is
// judged by age.
std::vector<ClaimedDir> ClaimAgedLeftovers(FileSystem& fs, const std::string& root,
                                           const std::vector<DirEntry>& entries) {
  const int64_t before = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count() -
                         ObjectLeftoverAge().count();
  std::vector<ClaimedDir> claimed;
  for (const DirEntry& e : entries) {
    const std::string path = JoinPath(root, e.name);
    const bool ledger = e.is_dir && StartsWith(e.name, kTmpPrefix);
    const bool candidate = ledger || (e.is_dir && ValidateTag(e.name).ok() && !IsCommitted(fs, path));
    if (!candidate) continue;
    std::optional<int64_t> newest = NewestMtime(fs, path);
    if (!newest || *newest > before) continue;
    if (ledger && !RemoveDataOfDeadSave(fs, root, e.name, before)) continue;
    claimed.push_back(ClaimedDir{path, nullptr, nullptr});
  }
  // Uploads a killed save left open, also under tags that hold no object.
  fs.AbortUploadsBefore(root, before).IgnoreError();
  return claimed;
}

// Sum of the sizes of a checkpoint's data files (*.safetensors).
uint64_t DataBytes(FileSystem& fs, const std::string& dir) {
  uint64_t total = 0;
  auto entries = fs.ListDir(dir);
  if (!entries.ok()) return 0;
  for (const DirEntry& e : *entries) {
    const std::string_view name = e.name;
    if (name.size() < 12 || name.substr(name.size() - 12) != ".safetensors") continue;
    auto info = fs.Stat(JoinPath(dir, e.name));
    if (info.ok() && !info->is_dir) total += info->size;
  }
  return total;
}

// Oldest first, by commit order (docs/format.md §1): by commit record,
// and checkpoints without one (older versions) before those with one, by
// step when both have one, then mtime, then tag.
bool Older(const CheckpointInfo& a, const CheckpointInfo& b) {
  if (a.sequence != b.sequence) return a.sequence < b.sequence;
  if (a.sequence != 0 && a.committed_ns != b.committed_ns) return a.committed_ns < b.committed_ns;
  if (a.sequence == 0 && a.step && b.step && *a.step != *b.step) return *a.step < *b.step;
  if (a.mtime_unix != b.mtime_unix) return a.mtime_unix < b.mtime_unix;
  return a.tag < b.tag;
}

// A record is a few dozen bytes; a larger commit.json is no record.
constexpr uint64_t kMaxCommitRecordBytes = 4096;

struct LatestPointer {
  std::string tag;
  int64_t mtime_ns = 0;
};

std::optional<LatestPointer> ReadLatestFile(FileSystem& fs, const std::string& root) {
  const std::string path = JoinPath(root, kLatestFileName);
  auto text = ReadFileToString(fs, path, 4096, ReadOptions{.within = root});
  if (!text.ok()) return std::nullopt;
  std::string tag = *text;
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r')) tag.pop_back();
  if (!ValidateTag(tag).ok()) return std::nullopt;
  auto info = fs.Stat(path);
  return LatestPointer{tag, info.ok() ? info->mtime_ns : 0};
}

// Which checkpoint is the latest (docs/format.md §1), `list` in commit
// order (those whose order is unknown last), `index_mtime_ns` parallel to
// it: the one `latest` names, unless a later commit that moved `latest`
// wrote its index after `latest` was written (its pointer update failed):
// then the newest such. A `latest` written after every commit (a rollback)
// and saves that did not move it stay behind it. Without a valid `latest`:
// the newest that moved it, or the newest of all. Where times are whole
// seconds (an object store's Last-Modified) a commit in the same second as
// `latest` counts as after it: there `latest` only moves forward
// (compare-and-swap), so a tie is a save cut short between its index and
// its `latest`, not a rollback.
//
// A checkpoint whose order is unknown might be newer than that choice when
// there is no valid `latest`, or when its index was written after `latest`
// (a save whose pointer update failed, for all anyone can tell): then
// nothing is marked, and the DataLoss returned says why.
Status MarkLatest(const std::string& root, std::vector<CheckpointInfo>& list,
                  const std::vector<int64_t>& index_mtime_ns,
                  const std::optional<LatestPointer>& latest, bool whole_seconds) {
  const size_t none = list.size();
  size_t named = none;
  for (size_t i = 0; latest && i < list.size(); ++i) {
    if (list[i].tag == latest->tag) named = i;
  }
  const auto after_latest = [&](size_t i) {
    return named == none || index_mtime_ns[i] > latest->mtime_ns ||
           (whole_seconds && index_mtime_ns[i] == latest->mtime_ns);
  };
  const size_t known = static_cast<size_t>(std::count_if(
      list.begin(), list.end(), [](const CheckpointInfo& c) { return c.order_fault.empty(); }));
  size_t chosen = none;
  for (size_t i = known; i-- > 0;) {
    if (i == named) break;
    if (list[i].moved_latest && after_latest(i)) {
      chosen = i;
      break;
    }
  }
  if (chosen == none) chosen = named != none ? named : known > 0 ? known - 1 : none;
  if (chosen == none && list.size() == 1) chosen = 0;  // the only one
  for (size_t i = known; i < list.size(); ++i) {
    if (i == chosen || !after_latest(i)) continue;
    return DataLossError(
        root + ": which checkpoint is the latest cannot be told: the commit order of " +
        list[i].tag + " is unknown (" + list[i].order_fault + "), and it may be newer than " +
        (chosen == none ? std::string("the others") : list[chosen].tag) +
        "; load a checkpoint by its path, or repair or remove " + list[i].tag);
  }
  if (chosen != none) list[chosen].is_latest = true;
  return Status();
}

// The order of recordless checkpoints is that of a root from before commit
// records (docs/format.md §1); one whose index was written after a record's
// commit time was committed since, by something that wrote no record (or
// lost it): its order is unknown.
void FlagMissingRecords(std::vector<std::pair<CheckpointInfo, int64_t>>& found) {
  const CheckpointInfo* first = nullptr;  // the earliest commit with a record
  for (const auto& [c, index_mtime_ns] : found) {
    if (c.sequence != 0 && (!first || c.committed_ns < first->committed_ns)) first = &c;
  }
  if (!first) return;
  const std::string first_tag = first->tag;
  const int64_t first_ns = first->committed_ns;
  for (auto& [c, index_mtime_ns] : found) {
    if (c.sequence != 0 || !c.order_fault.empty() || index_mtime_ns <= first_ns) continue;
    c.order_fault = JoinPath(c.path, kCommitFileName) +
                    ": missing, yet the checkpoint's index was written after " + first_tag +
                    " was committed with a record";
  }
}

// Where a checkpoint goes in a listing: commit order (Older), those whose
// order is unknown after every other, by tag.
bool ListedBefore(const CheckpointInfo& a, const CheckpointInfo& b) {
  if (a.order_fault.empty() != b.order_fault.empty()) return a.order_fault.empty();
  if (!a.order_fault.empty()) return a.tag < b.tag;
  return Older(a, b);
}

// A commit record's JSON, checked (ReadCommitRecord's contract).
Result<CommitRecord> ParseCommitRecord(std::string_view text, const std::string& path) {
  using nlohmann::json;
  std::set<std::string> keys;
  std::string duplicate;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event,
                                                json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !keys.insert(parsed).second) {
      duplicate = parsed;
    }
    return true;
  };
  const json j = json::parse(text, note_keys, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& why) { return DataLossError(path + ": " + why); };
  if (j.is_discarded()) return bad("not JSON");
  if (!j.is_object()) return bad("not a JSON object");
  if (!duplicate.empty()) return bad("field \"" + duplicate + "\" appears twice");
  const auto shown = [](const json& v) {
    std::string text = v.dump();
    return text.size() > 40 ? text.substr(0, 40) + "..." : text;
  };
  CommitRecord r;
  const auto sequence = j.find("sequence");
  if (sequence == j.end()) return bad("no sequence");
  if (!sequence->is_number_unsigned() || sequence->get<uint64_t>() == 0 ||
      sequence->get<uint64_t>() > kMaxCommitSequence) {
    return bad("sequence " + shown(*sequence) + " is not a whole number from 1 to 2^53");
  }
  r.sequence = sequence->get<uint64_t>();
  // A whole number from 0 to INT64_MAX (time_ns, step).
  const auto count = [&](const json& v, const char* name) -> Result<int64_t> {
    if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t{INT64_MAX}) {
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    return bad(std::string(name) + " " + shown(v) + " is not a whole number from 0 to 2^63-1");
  };
  const auto time_ns = j.find("time_ns");
  if (time_ns == j.end()) return bad("no time_ns");
  SS_ASSIGN_OR_RETURN(r.time_ns, count(*time_ns, "time_ns"));
  if (const auto step = j.find("step"); step != j.end()) {
    SS_ASSIGN_OR_RETURN(r.step, count(*step, "step"));
  }
  if (const auto moved = j.find("moved_latest"); moved != j.end()) {
    if (!moved->is_boolean()) return bad("moved_latest " + shown(*moved) + " is not a boolean");
    r.moved_latest = moved->get<bool>();
  }
  return r;
}

// True when `dir` lists an entry `name` (one that opening did not find: a
// dangling symbolic link).
bool Lists(FileSystem& fs, const std::string& dir, std::string_view name) {
  auto entries = fs.ListDir(dir);
  return entries.ok() && std::any_of(entries->begin(), entries->end(),
                                     [&](const DirEntry& e) { return e.name == name; });
}

}  // namespace

Status ValidateTag(std::string_view tag) {
  if (tag.empty() || tag.size() > 200) {
    return InvalidArgumentError("tag must be 1-200 characters long");
  }
  if (tag[0] == '.') return InvalidArgumentError("tag \"" + std::string(tag) + "\" starts with '.'");
  if (tag == kLatestFileName) return InvalidArgumentError("tag \"latest\" is reserved");
  for (char c : tag) {
    if (!IsTagChar(c)) {
      return InvalidArgumentError("tag \"" + std::string(tag) +
                                  "\" has a character outside [A-Za-z0-9._+=-]");
    }
  }
  return Status();
}

std::optional<int64_t> StepOfTag(std::string_view tag) {
  if (!StartsWith(tag, "step-")) return std::nullopt;
  std::string_view digits = tag.substr(5);
  int64_t step = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || digits.empty() || step < 0) {
    return std::nullopt;
  }
  return step;
}

bool IsCommitted(FileSystem& fs, const std::string& dir) {
  auto info = fs.Stat(JoinPath(dir, kIndexFileName));
  return info.ok() && !info->is_dir;
}

bool IsSavedFile(std::string_view name) {
  return name.ends_with(".safetensors") || name.ends_with(".chunks") || name.ends_with(".crc32c");
}

bool WrittenBySave(std::string_view name, std::string_view suffix) {
  const std::string data = std::string(suffix) + ".safetensors";
  const std::string checksums = std::string(suffix) + ".crc32c";
  const std::string table = std::string(suffix) + ".chunks";
  return name.ends_with(data) || name.ends_with(checksums) || name.ends_with(table);
}

Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, FileSystem* fsp) {
  SS_ASSIGN_OR_RETURN(FileSystem * found, FileSystemFor(root, fsp));
  FileSystem& fs = *found;
  // Shared: no commit or retention renames a checkpoint while it is listed
  // (a listing racing them could miss both the old and the new one).
  auto lock = LockRoot(fs, root, LockMode::kShared);
  if (!lock.ok() && lock.status().code() != StatusCode::kNotFound) return lock.status();
  return ListCommitted(fs, root, /*data_bytes=*/true);
}

Result<RootListing> ListRoot(FileSystem& fs, const std::string& root, bool data_bytes) {
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(root));
  const std::optional<LatestPointer> latest = ReadLatestFile(fs, root);
  std::vector<std::pair<CheckpointInfo, int64_t>> found;  // with its index's mtime_ns
  for (const DirEntry& e : entries) {
    const std::string dir = JoinPath(root, e.name);
    if (!e.is_dir || !ValidateTag(e.name).ok() || !IsCommitted(fs, dir)) continue;
    CheckpointInfo info;
    info.tag = e.name;
    info.path = dir;
    info.step = StepOfTag(e.name);
    info.bytes = data_bytes ? DataBytes(fs, dir) : 0;
    auto st = fs.Stat(JoinPath(dir, kIndexFileName));
    if (st.ok()) info.mtime_unix = st->mtime_seconds;
    Result<std::optional<CommitRecord>> record = ReadCommitRecord(fs, dir);
    if (!record.ok()) {
      info.order_fault = record.status().message();
    } else if (*record) {
      info.sequence = (*record)->sequence;
      info.committed_ns = (*record)->time_ns;
      if ((*record)->step) info.step = (*record)->step;
      info.moved_latest = (*record)->moved_latest;
    }
    found.emplace_back(std::move(info), st.ok() ? st->mtime_ns : 0);
  }
  FlagMissingRecords(found);
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return ListedBefore(a.first, b.first); });
  RootListing listing;
  std::vector<int64_t> index_mtime_ns;
  for (auto& [info, mtime] : found) {
    listing.checkpoints.push_back(std::move(info));
    index_mtime_ns.push_back(mtime);
  }
  if (latest) listing.latest_pointer = latest->tag;
  listing.latest_unknown = MarkLatest(root, listing.checkpoints, index_mtime_ns, latest,
                                      fs.IsObjectStore());
  return listing;
}

Result<std::vector<CheckpointInfo>> ListCommitted(FileSystem& fs, const std::string& root,
                                                  bool data_bytes) {
  SS_ASSIGN_OR_RETURN(RootListing listing, ListRoot(fs, root, data_bytes));
  return std::move(listing.checkpoints);
}

Result<std::optional<std::string>> ResolveLatestTag(FileSystem& fs, const std::string& root) {
  SS_ASSIGN_OR_RETURN(RootListing listing, ListRoot(fs, root, /*data_bytes=*/false));
  SS_RETURN_IF_ERROR(listing.latest_unknown);
  for (const auto& c : listing.checkpoints) {
    if (c.is_latest) return std::optional<std::string>(c.tag);
  }
  return std::optional<std::string>();
}

Result<TagFormat> TagFormat::Parse(std::string_view format) {
  const auto bad = [&](std::string_view why) {
    return InvalidArgumentError("tag format \"" + std::string(format) + "\": " + std::string(why));
  };
  const size_t open = format.find("{step");
  const size_t close = open == std::string_view::npos ? open : format.find('}', open);
  if (close == std::string_view::npos) return bad("needs one {step} or {step:0Nd}");
  TagFormat f;
  f.prefix_ = std::string(format.substr(0, open));
  f.suffix_ = std::string(format.substr(close + 1));
  const std::string_view spec = format.substr(open + 5, close - open - 5);
  if (!spec.empty()) {
    if (spec.size() < 4 || spec.substr(0, 2) != ":0" || spec.back() != 'd') {
      return bad("the step's format must be {step} or {step:0Nd}");
    }
    auto [ptr, ec] = std::from_chars(spec.data() + 2, spec.data() + spec.size() - 1, f.width_);
    if (ec != std::errc() || ptr != spec.data() + spec.size() - 1 || f.width_ > 20) {
      return bad("the step's width must be a number up to 20");
    }
  }
  if (f.prefix_.find('{') != std::string::npos || f.suffix_.find('{') != std::string::npos) {
    return bad("needs exactly one {step}");
  }
  SS_RETURN_IF_ERROR(
      ValidateTag(f.Format(0)).WithContext("tag format \"" + std::string(format) + "\""));
  return f;
}

std::string TagFormat::Format(int64_t step) const {
  std::string digits = std::to_string(step);
  if (static_cast<int>(digits.size()) < width_) digits.insert(0, width_ - digits.size(), '0');
  return prefix_ + digits + suffix_;
}

Result<CommitRecord> NextCommitRecord(FileSystem& fs, const std::string& root,
                                      std::optional<int64_t> step, bool moves_latest) {
  // Only the records are read: listing the root would also stat every data
  // file of every checkpoint, at each commit. A directory holds a record
  // only once committed (it is written inside the temporary directory).
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(root));
  CommitRecord record;
  std::string newest;  // the tag holding the largest sequence
  for (const DirEntry& e : entries) {
    if (!e.is_dir || !ValidateTag(e.name).ok()) continue;
    auto r = ReadCommitRecord(fs, JoinPath(root, e.name));
    if (r.ok() && *r && (*r)->sequence > record.sequence) {
      record.sequence = (*r)->sequence;
      newest = e.name;
    }
  }
  if (record.sequence >= kMaxCommitSequence) {
    return ResourceExhaustedError(
        root + ": no commit sequence is left: " + newest + "'s record holds " +
        std::to_string(record.sequence) +
        ", the largest a record may hold (docs/format.md §1); save to another root");
  }
  ++record.sequence;
  record.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  record.step = step;
  record.moved_latest = moves_latest;
  return record;
}

std::string SerializeCommitRecord(const CommitRecord& record) {
  nlohmann::json j = {{"sequence", record.sequence},
                      {"time_ns", record.time_ns},
                      {"moved_latest", record.moved_latest}};
  if (record.step) j["step"] = *record.step;
  return j.dump() + "\n";
}

Result<std::optional<CommitRecord>> ReadCommitRecord(FileSystem& fs, const std::string& dir) {
  const std::string path = JoinPath(dir, kCommitFileName);
  auto text = ReadFileToString(fs, path, kMaxCommitRecordBytes, ReadOptions{.within = dir});
  if (text.ok()) {
    SS_ASSIGN_OR_RETURN(CommitRecord record, ParseCommitRecord(*text, path));
    return std::optional<CommitRecord>(record);
  }
  if (text.status().code() != StatusCode::kNotFound) {
    return DataLossError(path + ": cannot be read: " + text.status().message());
  }
  // Not found by opening it; a name there is a dangling symbolic link.
  if (!Lists(fs, dir, kCommitFileName)) return std::optional<CommitRecord>();
  return DataLossError(path + ": cannot be read: a symbolic link to nothing");
}

Result<std::unique_ptr<FileLock>> LockRoot(FileSystem& fs, const std::string& root,
                                           LockMode mode) {
  const auto deadline = std::chrono::steady_clock::now() + kRootLockWait;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    auto lock = fs.TryLock(root, mode);
    if (lock.ok()) return lock;
    if (lock.status().code() == StatusCode::kUnimplemented) return std::unique_ptr<FileLock>();
    if (lock.status().code() != StatusCode::kFailedPrecondition) return lock.status();
    if (std::chrono::steady_clock::now() > deadline) {
      return FailedPreconditionError(root + " stayed locked by another process for " +
                                     std::to_string(kRootLockWait.count()) +
                                     " s (a save, prune or retention there does not finish)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

std::optional<ClaimedDir> ClaimDir(FileSystem& fs, const std::string& dir) {
  // In use: a save holds the directory, or a load its index (FailedPrecondition).
  const auto in_use = [](const Status& s) { return s.code() == StatusCode::kFailedPrecondition; };
  ClaimedDir claimed{dir, nullptr, nullptr};
  auto lock = fs.TryLock(dir, LockMode::kExclusive);
  if (!lock.ok() && in_use(lock.status())) return std::nullopt;
  if (lock.ok()) claimed.lock = std::move(*lock);
  auto index_lock = fs.TryLock(JoinPath(dir, kIndexFileName), LockMode::kExclusive);
  if (!index_lock.ok() && in_use(index_lock.status())) return std::nullopt;
  if (index_lock.ok()) claimed.index_lock = std::move(*index_lock);
  return claimed;
}

Status RemoveClaimed(FileSystem& fs, std::vector<ClaimedDir> dirs) {
  Status first;
  for (ClaimedDir& d : dirs) {
    Status s = fs.RemoveAll(d.path);
    if (first.ok()) first = s;
  }
  return first;
}

Result<std::vector<ClaimedDir>> HideOldCheckpoints(FileSystem& fs, const std::string& root,
                                                   int keep, std::vector<std::string>* tags,
                                                   std::vector<std::string>* warnings) {
  if (keep < 1) return InvalidArgumentError("prune must keep at least 1 checkpoint");
  SS_ASSIGN_OR_RETURN(RootListing listing, ListRoot(fs, root, /*data_bytes=*/false));
  const std::vector<CheckpointInfo>& list = listing.checkpoints;
  size_t known = 0;  // those whose order is known come first
  for (const CheckpointInfo& c : list) {
    if (c.order_fault.empty()) {
      ++known;
    } else if (warnings) {
      warnings->push_back("retention kept " + c.tag +
                          ": its place in the commit order is unknown (" + c.order_fault + ")");
    }
  }
  std::vector<ClaimedDir> hidden;
  int64_t to_remove = static_cast<int64_t>(known) - keep;
  for (size_t i = 0; i + 1 < known && to_remove > 0; ++i) {  // oldest first; never the newest
    const CheckpointInfo& c = list[i];
    // The one `latest` names counts among the `keep` (a rollback keeps it
    // in place of a newer one).
    if (c.is_latest || c.tag == listing.latest_pointer) continue;
    std::optional<ClaimedDir> claimed = ClaimDir(fs, c.path);
    if (!claimed) {  // a load is reading it: it stays beside the `keep`, not in place of one
      --to_remove;
      continue;
    }
    // Hidden by one atomic rename, so a crash mid-removal never leaves a
    // half-deleted directory that still looks committed. The locks follow
    // the directory. An object store has no rename: deleting the index
    // un-commits the checkpoint in one step.
    if (fs.IsObjectStore()) {
      SS_RETURN_IF_ERROR(fs.RemoveFile(JoinPath(c.path, kIndexFileName)));
    } else {
      claimed->path =
          JoinPath(root, std::string(kTmpPrefix) + "pruned-" + c.tag + "." + RandomSuffix());
      SS_RETURN_IF_ERROR(fs.Rename(c.path, claimed->path));
    }
    hidden.push_back(std::move(*claimed));
    if (tags) tags->push_back(c.tag);
    --to_remove;
  }
  if (!hidden.empty()) SS_RETURN_IF_ERROR(fs.SyncDir(root));
  return hidden;
}

Result<std::vector<std::string>> PruneCheckpoints(FileSystem& fs, const std::string& root,
                                                  int keep, std::vector<std::string>* warnings) {
  std::vector<std::string> tags;
  std::vector<ClaimedDir> hidden, leftovers;
  {
    SS_ASSIGN_OR_RETURN(auto root_lock, LockRoot(fs, root));
    SS_ASSIGN_OR_RETURN(hidden, HideOldCheckpoints(fs, root, keep, &tags, warnings));
    leftovers = ClaimLeftovers(fs, root);
  }
  SS_RETURN_IF_ERROR(RemoveClaimed(fs, std::move(hidden)));
  RemoveClaimed(fs, std::move(leftovers)).IgnoreError();  // harmless if it fails
  return tags;
}

std::chrono::seconds ObjectLeftoverAge() {
  constexpr int64_t kHour = 3600;
  // A value that is not a whole number of seconds >= 0 counts as unset.
  const Result<int64_t> age = EnvInteger("SHARDSAFE_S3_LEFTOVER_AGE", kHour, 0, INT64_MAX);
  return std::chrono::seconds(age.ok() ? *age : kHour);
}

std::vector<ClaimedDir> ClaimLeftovers(FileSystem& fs, const std::string& root) {
  std::vector<ClaimedDir> claimed;
  auto entries = fs.ListDir(root);
  if (!entries.ok()) return claimed;
  if (fs.IsObjectStore()) return ClaimAgedLeftovers(fs, root, *entries);
  for (const DirEntry& e : *entries) {
    const std::string path = JoinPath(root, e.name);
    if (e.is_dir && StartsWith(e.name, kTmpPrefix)) {
      if (auto c = ClaimDir(fs, path)) claimed.push_back(std::move(*c));
    }
    if (!e.is_dir && StartsWith(e.name, ".latest.tmp.")) fs.RemoveFile(path).IgnoreError();
  }
  return claimed;
}

}  // namespace shardsafe
