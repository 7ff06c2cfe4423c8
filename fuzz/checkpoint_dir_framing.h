// The framing checkpoint_dir_fuzzer reads its input in, shared with the
// seed generator (checkpoint_dir_seeds.cc) that writes its corpus.
//
// An input is the files of one checkpoint directory:
//
//   INDEX  ( "\0SSF" ID BYTES )*
//
// INDEX, the bytes before the first separator, is shardsafe.json (no index
// file when empty, so the directory opens as foreign safetensors files or
// fails). Each separator is followed by one byte naming the file its BYTES
// (up to the next separator) become; an unknown id is ignored, a repeated
// one replaces the earlier. A separator rather than lengths, so that a
// mutation that grows or shrinks one file leaves the others whole, and a
// mutation of the id byte moves a file's bytes to another name.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

namespace shardsafe::fuzz {

inline constexpr std::string_view kSeparator{"\0SSF", 4};

// The files a section id names (besides the leading index).
inline const std::map<char, std::string_view>& FramedFiles() {
  static const std::map<char, std::string_view> files = {
      {'c', "commit.json"},
      {'0', "data-00000-000.safetensors"},
      {'1', "data-00000-001.safetensors"},
      {'2', "data-00001-000.safetensors"},
      {'m', "model.safetensors"},
      {'h', "model.safetensors.index.json"},
  };
  return files;
}

// File name -> contents for one input (shardsafe.json only when non-empty).
inline std::map<std::string, std::string> Unframe(std::string_view in) {
  std::map<std::string, std::string> out;
  size_t sep = in.find(kSeparator);
  if (const std::string_view index = in.substr(0, sep); !index.empty()) {
    out["shardsafe.json"] = std::string(index);
  }
  while (sep != std::string_view::npos) {
    const size_t begin = sep + kSeparator.size();
    if (begin >= in.size()) break;
    const char id = in[begin];
    sep = in.find(kSeparator, begin + 1);
    const size_t end = sep == std::string_view::npos ? in.size() : sep;
    auto name = FramedFiles().find(id);
    if (name != FramedFiles().end()) {
      out[std::string(name->second)] = std::string(in.substr(begin + 1, end - begin - 1));
    }
  }
  return out;
}

// The inverse: `files` by name (names FramedFiles and shardsafe.json know).
inline std::string Frame(const std::map<std::string, std::string>& files) {
  std::string out;
  if (auto it = files.find("shardsafe.json"); it != files.end()) out = it->second;
  for (const auto& [id, name] : FramedFiles()) {
    auto it = files.find(std::string(name));
    if (it == files.end()) continue;
    out += kSeparator;
    out += id;
    out += it->second;
  }
  return out;
}

}  // namespace shardsafe::fuzz
