// Fixed-size little-endian integers in the binary files of a checkpoint
// (the chunk table, checksum files: docs/format.md §3a-3b), read and
// written in place on a little-endian host.
#pragma once

#include <bit>
#include <cstring>
#include <string>

namespace shardsafe::le {

static_assert(std::endian::native == std::endian::little, "the files are read in place");

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads a T at `p` and moves `p` past it (the caller checked the length).
template <typename T>
T Get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  p += sizeof(v);
  return v;
}

}  // namespace shardsafe::le
