#include "format/index_text.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace shardsafe::internal {
namespace {

constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

Status TooLarge(const std::string& size) {
  return DataLossError("index is " + size + " bytes, over the " +
                       std::to_string(kMaxIndexBytes) + "-byte limit");
}

Status NulAt(uint64_t offset) {
  return DataLossError("invalid JSON: NUL byte at offset " + std::to_string(offset));
}

Status ByteOrderMark() { return DataLossError("invalid JSON: byte order mark"); }

}  // namespace

Status CheckText(std::string_view text) {
  if (text.size() > kMaxIndexBytes) return TooLarge(std::to_string(text.size()));
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) return NulAt(nul);
  if (text.starts_with(kByteOrderMark)) return ByteOrderMark();
  return Status();
}

void PieceText::Refill() {
  at_ = end_ = nullptr;
  while (!ended_) {
    Result<std::string_view> piece = next_();
    if (!piece.ok()) {
      error_ = piece.status();
      ended_ = true;
      return;
    }
    if (piece->empty()) {
      ended_ = true;
      return;
    }
    const uint64_t offset = read_;
    read_ += piece->size();
    for (uint64_t i = offset; i < 3 && i < read_; ++i) head_[i] = (*piece)[i - offset];
    if (read_ > kMaxIndexBytes) {
      ended_ = true;  // the parser sees no more; status() says why
      return;
    }
    if (nul_ >= 0) continue;  // the parser has seen its end; only counting
    const void* nul = std::memchr(piece->data(), '\0', piece->size());
    at_ = piece->data();
    end_ = nul ? static_cast<const char*>(nul) : piece->data() + piece->size();
    if (nul) nul_ = static_cast<int64_t>(offset + (end_ - at_));
    if (at_ != end_) return;
  }
}

void PieceText::Drain() {
  while (!ended_) Refill();
}

Status PieceText::status() const {
  if (!error_.ok()) return error_;
  if (read_ > kMaxIndexBytes) return TooLarge("more than " + std::to_string(kMaxIndexBytes));
  if (nul_ >= 0) return NulAt(static_cast<uint64_t>(nul_));
  if (read_ >= 3 && std::string_view(head_, 3) == kByteOrderMark) return ByteOrderMark();
  return Status();
}

}  // namespace shardsafe::internal
