#include "engine/load/source.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/catalog/checkpoint_dir.h"
#include "engine/load/checksum_files.h"
#include "format/chunk_table.h"
#include "format/index.h"
#include "comm/wire.h"
#include "layout/tiling.h"

namespace shardsafe {
namespace {

constexpr std::string_view kHfIndexName = "model.safetensors.index.json";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Checks that every tensor's chunks tile it (DataLoss naming the tensor).
Status CheckIndexTiling(const CheckpointIndex& index, const std::string& source) {
  std::vector<Slice> slices;
  for (const auto& [key, tensor] : index.tensors) {
    slices.clear();
    for (const IndexChunk& c : tensor.chunks) slices.push_back(c.slice);
    Status s = CheckTiling(key, tensor.shape, slices);
    if (!s.ok()) return DataLossError(source + ": " + s.message());
  }
  return Status();
}

// A shardsafe checkpoint records a checksum for every chunk and blob chunk
// (only foreign files have none): one without is DataLoss, not a chunk
// left unchecked.
Status CheckChecksumsRecorded(const CheckpointIndex& index, const std::string& source) {
  for (const auto& [key, tensor] : index.tensors) {
    for (const IndexChunk& c : tensor.chunks) {
      if (!c.crc32c) {
        return DataLossError(source + ": tensor \"" + key + "\" chunk " +
                             SliceToString(c.slice) + " has no crc32c");
      }
    }
  }
  for (const auto& [name, blob] : index.blobs) {
    for (const IndexBlobChunk& c : blob.chunks) {
      if (!c.crc32c) {
        return DataLossError(source + ": blob \"" + name + "\" (rank " +
                             std::to_string(c.rank) + ") has no crc32c");
      }
    }
  }
  return Status();
}

// The directory a source in `dir` is confined to (SourceReadOptions).
std::string ConfinementDir(const std::string& dir) {
  const std::string snapshots = ParentDir(dir);
  const std::string repo = ParentDir(snapshots);
  if (BaseName(snapshots) == "snapshots" && BaseName(repo).rfind("models--", 0) == 0) return repo;
  return dir;
}

ReadOptions Within(const std::string& dir) {
  ReadOptions options;
  options.within = ConfinementDir(dir);
  return options;
}

// The status of a checkpoint that retention or prune removed while it was
// being opened.
Status Removed(const std::string& dir) {
  return NotFoundError("checkpoint " + dir +
                       " was removed (by retention or prune) while it was being opened");
}

// Locks `dir`'s index shared (CheckpointSource::pin); Removed() if a prune
// is removing it or has.
Result<std::shared_ptr<FileLock>> Pin(FileSystem& fs, const std::string& dir) {
  auto lock = fs.TryLock(JoinPath(dir, kIndexFileName), LockMode::kShared);
  if (lock.ok()) return std::shared_ptr<FileLock>(std::move(*lock));
  switch (lock.status().code()) {
    case StatusCode::kUnimplemented: return std::shared_ptr<FileLock>();
    case StatusCode::kFailedPrecondition:  // held by a prune
    case StatusCode::kNotFound: return Removed(dir);
    default: return lock.status();
  }
}

// Fills every tensor's chunks from the chunk table `index` names (every
// part of it).
Status ReadWholeTable(FileSystem& fs, const std::string& dir, CheckpointIndex* index) {
  std::vector<std::string> tables, paths;
  for (const IndexChunkTable& t : index->chunk_tables) {
    paths.push_back(JoinPath(dir, t.name));
    SS_ASSIGN_OR_RETURN(tables.emplace_back(),
                        ReadFileToString(fs, paths.back(), t.bytes, Within(dir)));
  }
  SS_RETURN_IF_ERROR(FillChunksFromTables(tables, paths, index));
  return FillChecksums(fs, dir, Within(dir), index);
}

// `*text` (when set) receives the index bytes read; `whole`: a chunk table
// is read too. The tag is the directory's name (what a root lists and
// `latest` names), not the index's field.
Result<CheckpointSource> OpenNative(FileSystem& fs, const std::string& dir, std::string* text,
                                    bool whole) {
  const std::string index_path = JoinPath(dir, kIndexFileName);
  SS_ASSIGN_OR_RETURN(std::shared_ptr<FileLock> pin, Pin(fs, dir));
  SS_ASSIGN_OR_RETURN(std::string read,
                      ReadFileToString(fs, index_path, kMaxIndexBytes, Within(dir)));
  SS_ASSIGN_OR_RETURN(CheckpointIndex index, ParseIndex(read, index_path));
  const bool table = !index.chunk_tables.empty();
  const bool pending = table && !whole;
  if (table && whole) SS_RETURN_IF_ERROR(ReadWholeTable(fs, dir, &index));
  if (!pending) SS_RETURN_IF_ERROR(CheckIndexTiling(index, index_path));
  SS_RETURN_IF_ERROR(CheckChecksumsRecorded(index, index_path));
  index.tag = BaseName(dir);
  if (text != nullptr) *text = std::move(read);
  CheckpointSource src{dir, dir, true, std::move(index)};
  src.chunks_pending = pending;
  src.pin = std::move(pin);
  return src;
}

// Adds the entries of one foreign safetensors file as whole-tensor chunks.
Status AddForeignFile(FileSystem& fs, const std::string& dir, const std::string& name,
                      const ReadOptions& options, CheckpointIndex* index) {
  const std::string path = JoinPath(dir, name);
  uint64_t size = 0;
  SS_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(fs, path, &size, options));
  const auto file = static_cast<uint32_t>(index->files.size());
  index->files.push_back({name, size, 0});
  for (const SafetensorsEntry& e : header.entries) {
    if (index->tensors.count(e.name)) {
      return DataLossError(path + ": tensor \"" + e.name + "\" also appears in another file");
    }
    IndexChunk chunk{Slice{Box::Whole(e.shape), std::nullopt}, file,
                     header.data_start() + e.begin, e.end - e.begin, std::nullopt};
    index->tensors[e.name] = IndexTensor{e.dtype, e.shape, {chunk}};
  }
  return Status();
}

// An HF index's weight_map (tensor -> shard file), with every file checked
// to be a plain .safetensors name inside the directory.
Result<std::map<std::string, std::string>> ReadHfWeightMap(FileSystem& fs, const std::string& path) {
  SS_ASSIGN_OR_RETURN(std::string text,
                      ReadFileToString(fs, path, kMaxIndexBytes, Within(ParentDir(path))));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return DataLossError(path + ": not a JSON object with a \"weight_map\" object");
  }
  std::map<std::string, std::string> map;
  for (const auto& [key, value] : j["weight_map"].items()) {
    if (!value.is_string()) return DataLossError(path + ": weight_map[\"" + key + "\"] is not a string");
    const std::string f = value.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." ||
        !EndsWith(f, ".safetensors")) {
      return DataLossError(path + ": weight_map[\"" + key + "\"] names a bad file \"" + f + "\"");
    }
    map[key] = f;
  }
  return map;
}

// Every tensor the weight_map promises must be in the file it names.
Status CheckWeightMap(const CheckpointSource& src, const std::map<std::string, std::string>& map,
                      const std::string& path) {
  std::map<std::string, std::string> file_of;
  for (const auto& [key, t] : src.index.tensors) file_of[key] = src.index.files[t.chunks[0].file].name;
  for (const auto& [key, file] : map) {
    auto it = file_of.find(key);
    if (it == file_of.end() || it->second != file) {
      return DataLossError(path + ": weight_map puts tensor \"" + key + "\" in " + file +
                           ", which does not hold it");
    }
  }
  return Status();
}

Result<CheckpointSource> OpenForeign(FileSystem& fs, const std::string& dir,
                                     const std::vector<std::string>& names,
                                     const std::string& shown_path) {
  CheckpointSource src{shown_path, dir, false, {}};
  src.index.tag = BaseName(shown_path);
  const ReadOptions options = SourceReadOptions(src);
  for (const std::string& name : names) {
    SS_RETURN_IF_ERROR(AddForeignFile(fs, dir, name, options, &src.index));
  }
  return src;
}

Result<std::vector<std::string>> SafetensorsFilesIn(FileSystem& fs, const std::string& dir) {
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(dir));
  std::vector<std::string> names;
  for (const DirEntry& e : entries) {
    if (!e.is_dir && EndsWith(e.name, ".safetensors") && e.name[0] != '.') names.push_back(e.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// True if every file is named like a shardsafe data file.
bool LooksLikeUncommittedCheckpoint(const std::vector<std::string>& names) {
  if (names.empty()) return false;
  for (const std::string& n : names) {
    if (n.rfind("data-", 0) != 0 || n.size() != std::string("data-00000-000.safetensors").size()) {
      return false;
    }
  }
  return true;
}

Result<CheckpointSource> OpenDirectory(FileSystem& fs, const std::string& dir,
                                       std::string* text, bool whole) {
  if (IsCommitted(fs, dir)) return OpenNative(fs, dir, text, whole);
  const std::string hf_index = JoinPath(dir, kHfIndexName);
  if (fs.Stat(hf_index).ok()) {
    SS_ASSIGN_OR_RETURN(auto map, ReadHfWeightMap(fs, hf_index));
    std::set<std::string> files;
    for (const auto& [key, file] : map) files.insert(file);
    SS_ASSIGN_OR_RETURN(CheckpointSource src,
                        OpenForeign(fs, dir, {files.begin(), files.end()}, dir));
    SS_RETURN_IF_ERROR(CheckWeightMap(src, map, hf_index));
    return src;
  }
  {
    // A root: its latest is resolved and pinned with the root locked
    // shared, so no commit or retention renames anything in between.
    SS_ASSIGN_OR_RETURN(auto shared, LockRoot(fs, dir, LockMode::kShared));
    SS_ASSIGN_OR_RETURN(auto latest, ResolveLatestTag(fs, dir));
    if (latest) return OpenNative(fs, JoinPath(dir, *latest), text, whole);
  }
  SS_ASSIGN_OR_RETURN(auto names, SafetensorsFilesIn(fs, dir));
  if (LooksLikeUncommittedCheckpoint(names)) {
    return FailedPreconditionError(dir + " holds shardsafe data files but no " +
                                   std::string(kIndexFileName) +
                                   ": an uncommitted or damaged checkpoint");
  }
  if (!names.empty()) return OpenForeign(fs, dir, names, dir);
  return NotFoundError("no committed checkpoint, Hugging Face model or safetensors file in " + dir);
}

}  // namespace

ReadOptions SourceReadOptions(const CheckpointSource& src) {
  return src.path == src.data_dir ? Within(src.data_dir) : ReadOptions{};
}

LoadSources FileSources(const CheckpointSource& src) {
  LoadSources sources;
  sources.within = SourceReadOptions(src).within;
  for (const IndexFile& f : src.index.files) {
    sources.file_paths.push_back(JoinPath(src.data_dir, f.name));
    if (src.native) sources.file_bytes.push_back(f.bytes);
  }
  return sources;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(FileSystem& fs, const std::string& path,
                                                uint64_t* file_size, const ReadOptions& options) {
  SS_ASSIGN_OR_RETURN(auto file, fs.NewRandomAccessFile(path, options));
  *file_size = file->size();
  std::byte prefix[8] = {};
  const size_t n = std::min<uint64_t>(8, *file_size);
  SS_RETURN_IF_ERROR(file->ReadAt(0, prefix, n));
  auto len = ParseSafetensorsHeaderLength(std::span<const std::byte>(prefix, n), *file_size);
  if (!len.ok()) return len.status().WithContext(path);
  std::string header(*len, '\0');
  SS_RETURN_IF_ERROR(file->ReadAt(8, header.data(), header.size()));
  auto parsed = ParseSafetensorsHeader(header, *file_size);
  if (!parsed.ok()) return parsed.status().WithContext(path);
  return parsed;
}


Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path) {
  return OpenSource(fs, path, nullptr, /*whole=*/true);
}

Result<CheckpointSource> OpenSource(const std::string& path) {
  SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(path));
  return OpenSource(*fs, path);
}

Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path,
                                    std::string* index_text, bool whole) {
  auto info = fs.Stat(path);
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) {
      return NotFoundError("checkpoint not found: " + path);
    }
    return info.status();
  }
  if (info->is_dir) return OpenDirectory(fs, path, index_text, whole);
  return OpenForeign(fs, ParentDir(path), {BaseName(path)}, path);
}

std::string EncodeSource(const CheckpointSource& source, std::string_view index_text) {
  wire::Writer w;
  w.Str(source.path);
  w.Str(source.data_dir);
  w.U8(source.native);
  if (!index_text.empty()) {
    w.Str(index_text);
  } else {
    w.Str(SerializeIndex(source.index));
  }
  return w.Take();
}

Result<CheckpointSource> DecodeSource(std::string_view msg) {
  wire::Reader r(msg);
  CheckpointSource src;
  SS_ASSIGN_OR_RETURN(src.path, r.Str());
  SS_ASSIGN_OR_RETURN(src.data_dir, r.Str());
  SS_ASSIGN_OR_RETURN(uint8_t native, r.U8());
  src.native = native != 0;
  // Parsed in place: a copy would add the index's size to every rank's peak.
  SS_ASSIGN_OR_RETURN(std::string_view text, r.View());
  SS_ASSIGN_OR_RETURN(src.index, ParseIndex(text, src.path));
  if (src.native) src.index.tag = BaseName(src.path);  // as OpenNative
  src.chunks_pending = !src.index.chunk_tables.empty();
  return src;
}

}  // namespace shardsafe
