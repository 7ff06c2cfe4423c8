// The framing checkpoint_dir_fuzzer reads its input in, shared with the
// seed generator (checkpoint_dir_seeds.cc) that writes its corpus.
//
// An input is the files of a checkpoint root: the checkpoint
// step-00000001 (kFirst), optionally a second one, step-00000002 (kSecond),
// and a `latest` pointer:
//
//   INDEX  ( "\0SSF" SECTION )*
//
// INDEX, the bytes before the first separator, is step-00000001's
// shardsafe.json (no index file when empty, so the directory opens as
// foreign safetensors files or fails). A SECTION, up to the next separator,
// is one of
//
//   ID BYTES       the file FramedFiles() names for ID holds BYTES
//   '@' ID BYTES   that file is a symbolic link to BYTES (up to a NUL)
//   '/' ID         that file is an empty directory (BYTES ignored)
//   '|' ID         that file is a FIFO (BYTES ignored)
//
// An unknown ID is ignored, and a later section for a file replaces an
// earlier one. A separator rather than lengths, so that a mutation that
// grows or shrinks one file leaves the others whole, and a mutation of the
// id byte moves a file's bytes to another name. Links, directories and
// FIFOs are what a damaged or hostile root holds where a reader expects a
// file (commit.json a directory, `latest` a link out of the root, a data
// file a FIFO that would block a reader opening it without O_NONBLOCK).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

namespace shardsafe::fuzz {

inline constexpr std::string_view kSeparator{"\0SSF", 4};
inline constexpr char kLinkMarker = '@';
inline constexpr char kDirMarker = '/';
inline constexpr char kFifoMarker = '|';

// The two checkpoints' tags: the fuzzer reads the first as a checkpoint,
// and the root holding both as a reader of the root does.
inline constexpr std::string_view kFirst = "step-00000001";
inline constexpr std::string_view kSecond = "step-00000002";

// The leading section's file, relative to the root.
inline constexpr std::string_view kIndexPath = "step-00000001/shardsafe.json";

// The files a section id names (besides the leading index), relative to
// the root.
inline const std::map<char, std::string_view>& FramedFiles() {
  static const std::map<char, std::string_view> files = {
      {'c', "step-00000001/commit.json"},
      {'0', "step-00000001/data-00000-000.safetensors"},
      {'1', "step-00000001/data-00000-001.safetensors"},
      {'2', "step-00000001/data-00001-000.safetensors"},
      {'m', "step-00000001/model.safetensors"},
      {'h', "step-00000001/model.safetensors.index.json"},
      {'I', "step-00000002/shardsafe.json"},
      {'C', "step-00000002/commit.json"},
      {'3', "step-00000002/data-00000-000.safetensors"},
      {'l', "latest"},
  };
  return files;
}

// What a path of the root becomes.
struct FramedEntry {
  enum class Kind { kFile, kLink, kDir, kFifo };
  Kind kind = Kind::kFile;
  std::string bytes;  // a file's contents, a link's target
};

// Path (relative to the root) -> entry for one input (the index only when
// non-empty).
inline std::map<std::string, FramedEntry> Unframe(std::string_view in) {
  std::map<std::string, FramedEntry> out;
  size_t sep = in.find(kSeparator);
  if (const std::string_view index = in.substr(0, sep); !index.empty()) {
    out[std::string(kIndexPath)] = {FramedEntry::Kind::kFile, std::string(index)};
  }
  while (sep != std::string_view::npos) {
    size_t begin = sep + kSeparator.size();
    if (begin >= in.size()) break;
    sep = in.find(kSeparator, begin + 1);
    const size_t end = sep == std::string_view::npos ? in.size() : sep;
    auto kind = FramedEntry::Kind::kFile;
    if (begin + 1 < end) {
      if (in[begin] == kLinkMarker) kind = FramedEntry::Kind::kLink;
      if (in[begin] == kDirMarker) kind = FramedEntry::Kind::kDir;
      if (in[begin] == kFifoMarker) kind = FramedEntry::Kind::kFifo;
      begin += kind != FramedEntry::Kind::kFile;
    }
    auto name = FramedFiles().find(in[begin]);
    if (name == FramedFiles().end()) continue;
    std::string bytes(in.substr(begin + 1, end - begin - 1));
    if (kind == FramedEntry::Kind::kDir || kind == FramedEntry::Kind::kFifo) bytes.clear();
    if (kind == FramedEntry::Kind::kLink) bytes = bytes.substr(0, bytes.find('\0'));
    out[std::string(name->second)] = {kind, std::move(bytes)};
  }
  return out;
}

// One section: the file `id` names as `entry`.
inline std::string Section(char id, const FramedEntry& entry) {
  std::string out(kSeparator);
  if (entry.kind == FramedEntry::Kind::kLink) out += kLinkMarker;
  if (entry.kind == FramedEntry::Kind::kDir) out += kDirMarker;
  if (entry.kind == FramedEntry::Kind::kFifo) out += kFifoMarker;
  out += id;
  out += entry.bytes;
  return out;
}

// The inverse for regular files: contents by path relative to the root
// (kIndexPath and the paths FramedFiles knows).
inline std::string Frame(const std::map<std::string, std::string>& files) {
  std::string out;
  if (auto it = files.find(std::string(kIndexPath)); it != files.end()) out = it->second;
  for (const auto& [id, name] : FramedFiles()) {
    auto it = files.find(std::string(name));
    if (it != files.end()) out += Section(id, {FramedEntry::Kind::kFile, it->second});
  }
  return out;
}

}  // namespace shardsafe::fuzz
