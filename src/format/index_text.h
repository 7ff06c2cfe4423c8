// The index text as ParseIndex reads it (internal to format/): whole, or a
// piece at a time from a reader (format/index.h IndexTextReader), so that a
// large index is parsed without a copy of its text in memory.
//
// What the JSON grammar leaves to the reader is checked on the way: the
// size limit, a NUL byte (named at its offset) and a leading byte order
// mark (which nlohmann would skip). A NUL ends the text the parser sees;
// the checks' errors come before the parser's (CheckedText::status), in
// that order, as they did when the whole text was checked before parsing:
// so after a parse that failed the rest is read (Drain) for a NUL further
// on. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "format/index.h"

namespace shardsafe::internal {

// What the grammar leaves to the reader, of a whole text.
Status CheckText(std::string_view text);

class PieceText {
 public:
  // `next` must outlive this object.
  explicit PieceText(const IndexTextReader& next) : next_(next) {}

  // A char input iterator over the text (what nlohmann::json::sax_parse
  // takes): begin() and a default-constructed end.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = char;
    using difference_type = std::ptrdiff_t;
    using pointer = const char*;
    using reference = const char&;

    Iterator() = default;
    explicit Iterator(PieceText* text) : text_(text) {}
    reference operator*() const { return *text_->at_; }
    Iterator& operator++() {
      if (++text_->at_ == text_->end_) text_->Refill();
      return *this;
    }
    friend bool operator==(const Iterator& a, const Iterator& b) { return a.done() == b.done(); }

   private:
    bool done() const { return text_ == nullptr || text_->at_ == text_->end_; }
    PieceText* text_ = nullptr;
  };
  Iterator begin() {
    if (at_ == end_) Refill();
    return Iterator(this);
  }
  Iterator end() { return Iterator(); }

  // Reads what the parser left (after a failed parse), for the checks.
  void Drain();
  // A read error, else the checks' first failure, else OK.
  Status status() const;

 private:
  // Makes the next piece current (at_ == end_ at the end of the text).
  void Refill();

  const IndexTextReader& next_;
  const char* at_ = nullptr;
  const char* end_ = nullptr;
  uint64_t read_ = 0;  // bytes the reader gave
  char head_[3] = {};  // the text's first bytes
  bool ended_ = false;
  Status error_;       // the reader's
  int64_t nul_ = -1;   // the first NUL's offset
};

}  // namespace shardsafe::internal
