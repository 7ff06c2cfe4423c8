// shardsafe inspect PATH: what a checkpoint, Hugging Face directory or
// .safetensors file holds.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/output.h"
#include "format/index.h"
#include "format/index_packed.h"
#include "shardsafe/source.h"

namespace shardsafe::cli {
namespace {

// Bytes of tensor t's chunks.
uint64_t TensorBytes(const PackedTensors& tensors, size_t t) {
  uint64_t n = 0;
  const uint64_t first = tensors.first_chunk(t);
  for (uint64_t c = first; c < first + tensors.chunk_count(t); ++c) n += tensors.bytes(c);
  return n;
}

// The index as the format writes it (compact; every chunk inline, also
// those of a chunk table), with "path" and "native" first, streamed from
// the packed tensors: a copy of a large index (or a DOM, ~10x) would take
// more memory than the index itself.
void PrintIndexJson(const CheckpointSource& src) {
  std::cout << "{\"path\":" << Json(src.path).dump() << ",\"native\":"
            << (src.native ? "true" : "false") << ",";
  bool first = true;
  SerializeIndex(src.index, *src.packed, [&](std::string_view piece) {
    if (first) piece.remove_prefix(1);  // its '{'
    first = false;
    std::cout.write(piece.data(), static_cast<std::streamsize>(piece.size()));
  });
  std::cout << "\n";
}

void PrintChunks(const CheckpointSource& src, size_t t) {
  const PackedTensors& tensors = *src.packed;
  const uint64_t first = tensors.first_chunk(t);
  for (uint64_t c = first; c < first + tensors.chunk_count(t); ++c) {
    char crc[16] = "-";
    if (const std::optional<uint32_t> sum = tensors.crc32c(c)) {
      std::snprintf(crc, sizeof crc, "%08x", *sum);
    }
    std::cout << "    " << SliceToString(tensors.slice(t, c)) << "  "
              << Printable(src.index.files[tensors.file(c)].name) << " @" << tensors.at(c)
              << "  " << FormatBytes(tensors.bytes(c)) << "  crc32c " << crc << "\n";
  }
}

void PrintHuman(const CheckpointSource& src, bool chunks) {
  const CheckpointIndex& ix = src.index;
  const PackedTensors& tensors = *src.packed;
  uint64_t file_bytes = 0, tensor_bytes = 0;
  for (const IndexFile& f : ix.files) file_bytes += f.bytes;
  for (size_t t = 0; t < tensors.size(); ++t) tensor_bytes += TensorBytes(tensors, t);
  std::cout << "path      " << Printable(src.path) << "\n"
            << "kind      "
            << (src.native ? "shardsafe checkpoint (format v" + std::to_string(ix.version) + ")"
                           : "safetensors (no index, no checksums)")
            << "\n";
  if (ix.chunk_tables.size() == 1) {
    std::cout << "chunks in " << Printable(ix.chunk_tables[0].name) << ", "
              << FormatBytes(ix.chunk_tables[0].bytes) << "\n";
  } else if (!ix.chunk_tables.empty()) {
    uint64_t bytes = 0;
    for (const IndexChunkTable& t : ix.chunk_tables) bytes += t.bytes;
    std::cout << "chunks in " << ix.chunk_tables.size() << " table parts, " << FormatBytes(bytes)
              << "\n";
  }
  if (src.native) {
    std::cout << "tag       " << Printable(ix.tag) << "\n"
              << "saved by  " << ix.world_size << " rank(s), layout " << ix.layout << "\n";
    if (ix.metadata != "null") std::cout << "metadata  " << ix.metadata << "\n";
    if (ix.values != "{}") std::cout << "values    " << ix.values << "\n";
    for (const auto& [name, b] : ix.blobs) {
      std::cout << "blob      " << Printable(name) << (b.per_rank ? " (per rank, " : " (global, ")
                << b.chunks.size() << " chunk(s))\n";
    }
  }
  std::cout << "files     " << ix.files.size() << ", " << FormatBytes(file_bytes);
  if (!ix.checksum_files.empty()) std::cout << " (" << ix.checksum_files.size() << " checksum files)";
  if (ix.chunk_tables.size() > 0 && ix.chunk_tables[0].file) {
    std::cout << " (" << ix.chunk_tables.size() << " chunk table parts)";
  }
  std::cout << "\n"
            << "tensors   " << tensors.size() << ", " << FormatBytes(tensor_bytes) << "\n\n";
  std::printf("%-48s %-8s %-20s %7s %12s\n", "TENSOR", "DTYPE", "SHAPE", "CHUNKS", "BYTES");
  for (size_t t = 0; t < tensors.size(); ++t) {
    std::printf("%-48s %-8s %-20s %7zu %12s\n", Printable(tensors.key(t)).c_str(),
                std::string(DTypeName(tensors.dtype(t))).c_str(),
                ShapeToString(tensors.shape(t)).c_str(),
                static_cast<size_t>(tensors.chunk_count(t)),
                FormatBytes(TensorBytes(tensors, t)).c_str());
    std::fflush(stdout);
    if (chunks) PrintChunks(src, t);
  }
}

}  // namespace

void AddInspect(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("inspect", "Show the tensors, chunks, files and save layout at PATH");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto chunks = std::make_shared<bool>(false);
  cmd->add_option("PATH", *path, "checkpoint dir, root, Hugging Face dir or .safetensors file")->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->add_flag("--chunks", *chunks, "list every chunk of every tensor");
  cmd->callback([=] {
    auto src = OpenSourcePacked(*path);
    if (!src.ok()) {
      *exit_code = Fail(src.status());
      return;
    }
    if (*json) {
      PrintIndexJson(*src);
    } else {
      PrintHuman(*src, *chunks);
    }
  });
}

}  // namespace shardsafe::cli
