#include "engine/checkpoint_dir.h"

#include <algorithm>
#include <charconv>

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

// Oldest first: by step when both have one, else by mtime, then tag.
bool Older(const CheckpointInfo& a, const CheckpointInfo& b) {
  if (a.step && b.step && *a.step != *b.step) return *a.step < *b.step;
  if (a.mtime_unix != b.mtime_unix) return a.mtime_unix < b.mtime_unix;
  return a.tag < b.tag;
}

struct LatestPointer {
  std::string tag;
  int64_t mtime_unix = 0;
};

Result<std::optional<LatestPointer>> ReadLatestFile(FileSystem& fs, const std::string& root) {
  const std::string path = JoinPath(root, kLatestFileName);
  auto text = ReadFileToString(fs, path, 4096);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<LatestPointer>();
    return text.status();
  }
  std::string tag = *text;
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r')) tag.pop_back();
  if (!ValidateTag(tag).ok()) return std::optional<LatestPointer>();
  auto info = fs.Stat(path);
  return std::optional<LatestPointer>(LatestPointer{tag, info.ok() ? info->mtime_seconds : 0});
}

// Which checkpoint is the latest: the one `latest` names, unless a newer
// checkpoint was committed no earlier than `latest` was written (a save
// whose pointer update failed after its commit); then the newest. A
// `latest` rewritten by hand later than every commit (a rollback) wins.
void MarkLatest(std::vector<CheckpointInfo>& list, const std::optional<LatestPointer>& latest) {
  if (list.empty()) return;
  CheckpointInfo& newest = list.back();
  for (auto& c : list) {
    if (latest && c.tag == latest->tag &&
        (&c == &newest || latest->mtime_unix > newest.mtime_unix)) {
      c.is_latest = true;
      return;
    }
  }
  newest.is_latest = true;
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

Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, FileSystem* fsp) {
  FileSystem& fs = fsp ? *fsp : *DefaultFileSystem();
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(root));
  SS_ASSIGN_OR_RETURN(auto latest, ReadLatestFile(fs, root));
  std::vector<CheckpointInfo> out;
  for (const DirEntry& e : entries) {
    const std::string dir = JoinPath(root, e.name);
    if (!e.is_dir || !ValidateTag(e.name).ok() || !IsCommitted(fs, dir)) continue;
    CheckpointInfo info{e.name, dir, StepOfTag(e.name), DataBytes(fs, dir), 0, false};
    auto st = fs.Stat(JoinPath(dir, kIndexFileName));
    if (st.ok()) info.mtime_unix = st->mtime_seconds;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), Older);
  MarkLatest(out, latest);
  return out;
}

Result<std::optional<std::string>> ResolveLatestTag(FileSystem& fs, const std::string& root) {
  SS_ASSIGN_OR_RETURN(auto list, ListCheckpoints(root, &fs));
  for (const auto& c : list) {
    if (c.is_latest) return std::optional<std::string>(c.tag);
  }
  return std::optional<std::string>();
}

Status CleanLeftovers(FileSystem& fs, const std::string& root) {
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(root));
  Status first;
  for (const DirEntry& e : entries) {
    const std::string path = JoinPath(root, e.name);
    Status s;
    if (e.is_dir && StartsWith(e.name, kTmpPrefix)) {
      // A save in progress holds a lock on its directory: leave it alone.
      auto lock = fs.TryLock(path);
      if (!lock.ok() && lock.status().code() == StatusCode::kFailedPrecondition) continue;
      s = fs.RemoveAll(path);
    }
    if (!e.is_dir && StartsWith(e.name, ".latest.tmp.")) s = fs.RemoveFile(path);
    if (first.ok()) first = s;
  }
  return first;
}

Status CreateDirs(FileSystem& fs, const std::string& path) {
  auto info = fs.Stat(path);
  if (info.ok()) {
    if (info->is_dir) return Status();
    return FailedPreconditionError(path + " exists and is not a directory");
  }
  const std::string parent = ParentDir(path);
  if (parent != path && parent != "." && parent != "/") SS_RETURN_IF_ERROR(CreateDirs(fs, parent));
  Status s = fs.CreateDir(path);
  if (s.code() == StatusCode::kAlreadyExists) return Status();
  return s;
}

std::string BaseName(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

}  // namespace shardsafe
