// A small binary encoding for the messages ranks exchange during a save or
// load (holdings, per-rank outcomes). Integers as LEB128 varints (7 bits a
// byte, low first: counts, sizes, offsets and indices take 1-4 bytes
// rather than 4 or 8), checksums and digests little-endian fixed-width
// (Fixed32, Fixed64: random bits gain nothing from a varint), strings
// length-prefixed. Decoding is bounds-checked: a malformed message
// is an Internal error (it can only come from a peer rank of the same
// build), never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe::wire {

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { U64(v); }
  void U64(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_.push_back(static_cast<char>(v | 0x80));
    out_.push_back(static_cast<char>(v));
  }
  void Fixed32(uint32_t v) { Raw(&v, sizeof v); }
  void Fixed64(uint64_t v) { Raw(&v, sizeof v); }
  void Str(std::string_view s) {
    U64(s.size());
    out_.append(s);
  }
  void Shape(const shardsafe::Shape& s);
  void Slice(const shardsafe::Slice& s);
  void Status(const shardsafe::Status& s);
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  Result<uint8_t> U8();
  Result<uint32_t> U32();
  Result<uint64_t> U64();
  Result<uint32_t> Fixed32();
  Result<uint64_t> Fixed64();
  Result<std::string> Str();
  // A string written by Writer::Str, as a view into the message.
  Result<std::string_view> View();
  Result<shardsafe::Shape> Shape();
  Result<shardsafe::Slice> Slice();
  // Decodes a Status into *out; the return value is the decoding outcome.
  shardsafe::Status Status(shardsafe::Status* out);
  bool done() const { return pos_ == in_.size(); }
  // Bytes not read yet: a bound on the count of items that follow (each
  // takes at least one), to check a count before reserving for it.
  size_t left() const { return in_.size() - pos_; }

 private:
  shardsafe::Status Need(size_t n) const;
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace shardsafe::wire
