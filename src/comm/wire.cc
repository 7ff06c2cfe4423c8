#include "comm/wire.h"

namespace shardsafe::wire {

void Writer::Shape(const shardsafe::Shape& s) {
  U32(static_cast<uint32_t>(s.size()));
  for (uint64_t d : s) U64(d);
}

void Writer::Slice(const shardsafe::Slice& s) {
  Shape(s.box.offset);
  Shape(s.box.size);
  U8(s.flat.has_value());
  if (s.flat) {
    U64(s.flat->begin);
    U64(s.flat->end);
  }
}

void Writer::Status(const shardsafe::Status& s) {
  U32(static_cast<uint32_t>(s.code()));
  U8(static_cast<uint8_t>(s.detail()));
  Str(s.message());
}

shardsafe::Status Reader::Need(size_t n) const {
  if (in_.size() - pos_ < n) return InternalError("truncated message between ranks");
  return {};
}

Result<uint8_t> Reader::U8() {
  SS_RETURN_IF_ERROR(Need(1));
  return static_cast<uint8_t>(in_[pos_++]);
}

Result<uint32_t> Reader::U32() {
  SS_ASSIGN_OR_RETURN(uint64_t v, U64());
  if (v > UINT32_MAX) return InternalError("bad number in message between ranks");
  return static_cast<uint32_t>(v);
}

Result<uint64_t> Reader::U64() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    SS_RETURN_IF_ERROR(Need(1));
    const uint8_t byte = static_cast<uint8_t>(in_[pos_++]);
    // The tenth byte holds bit 63 alone.
    if (shift == 63 && byte > 1) break;
    v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) return v;
  }
  return InternalError("bad number in message between ranks");
}

Result<uint32_t> Reader::Fixed32() {
  SS_RETURN_IF_ERROR(Need(4));
  uint32_t v;
  std::memcpy(&v, in_.data() + pos_, 4);
  pos_ += 4;
  return v;
}

Result<uint64_t> Reader::Fixed64() {
  SS_RETURN_IF_ERROR(Need(8));
  uint64_t v;
  std::memcpy(&v, in_.data() + pos_, 8);
  pos_ += 8;
  return v;
}

Result<std::string> Reader::Str() {
  SS_ASSIGN_OR_RETURN(std::string_view s, View());
  return std::string(s);
}

Result<std::string_view> Reader::View() {
  SS_ASSIGN_OR_RETURN(uint64_t n, U64());
  SS_RETURN_IF_ERROR(Need(n));
  std::string_view s = in_.substr(pos_, n);
  pos_ += n;
  return s;
}

Result<shardsafe::Shape> Reader::Shape() {
  SS_ASSIGN_OR_RETURN(uint32_t n, U32());
  SS_RETURN_IF_ERROR(Need(n));  // at least a byte a dimension
  shardsafe::Shape s(n);
  for (auto& d : s) {
    SS_ASSIGN_OR_RETURN(d, U64());
  }
  return s;
}

Result<shardsafe::Slice> Reader::Slice() {
  shardsafe::Slice s;
  SS_ASSIGN_OR_RETURN(s.box.offset, Shape());
  SS_ASSIGN_OR_RETURN(s.box.size, Shape());
  SS_ASSIGN_OR_RETURN(uint8_t has_flat, U8());
  if (has_flat) {
    FlatRange f;
    SS_ASSIGN_OR_RETURN(f.begin, U64());
    SS_ASSIGN_OR_RETURN(f.end, U64());
    s.flat = f;
  }
  return s;
}

shardsafe::Status Reader::Status(shardsafe::Status* out) {
  SS_ASSIGN_OR_RETURN(uint32_t code, U32());
  SS_ASSIGN_OR_RETURN(uint8_t detail, U8());
  SS_ASSIGN_OR_RETURN(std::string msg, Str());
  if (code > static_cast<uint32_t>(StatusCode::kInternal) ||
      detail > static_cast<uint8_t>(kLastErrorDetail)) {
    return InternalError("bad status code in message between ranks");
  }
  *out = code == 0 ? shardsafe::Status()
                   : shardsafe::Status(static_cast<StatusCode>(code), std::move(msg))
                         .WithDetail(static_cast<ErrorDetail>(detail));
  return shardsafe::Status();
}

}  // namespace shardsafe::wire
