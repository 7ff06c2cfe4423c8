// Streaming decoder for the safetensors header JSON (internal to format/).
//
// The reference reader deserializes the header with serde into
//   { "__metadata__"?: {string: string} | null, NAME: TensorInfo, ... }
// where TensorInfo is { dtype, shape: [usize], data_offsets: (usize, usize) }.
// HeaderSaxHandler reproduces the accept/reject decisions of that
// deserialization on top of nlohmann::json's SAX parser, without building a
// DOM: memory stays proportional to the shapes and metadata actually present,
// never to a number read from the input.
//
// The serde rules it mirrors (shared/reference/formats.md §1.2, plus serde's
// documented behaviour for the cases the note does not list):
//   - the top level is an object; `__metadata__` at most once (null = absent);
//     metadata values are strings, duplicate metadata keys: last wins;
//   - a TensorInfo is an object (fields dtype/shape/data_offsets exactly once,
//     unknown fields ignored) or, as serde allows for any struct, an array of
//     exactly three values in field order;
//   - a dtype is a variant-name string, or serde's externally tagged form: an
//     object with exactly one key naming the variant, whose value is null or
//     {} (a unit variant);
//   - shape and data_offsets elements are non-negative integers that fit in
//     64 bits (serde_json turns `-0`, fractions, exponents and overlong
//     integers into floats, which usize rejects); data_offsets has exactly 2;
//   - a number that overflows a double (`1e400`) is an error even inside an
//     ignored field (serde_json: "number out of range");
//   - nesting deeper than 127 arrays/objects is an error (serde_json's
//     recursion limit of 128).
// Duplicate tensor names are all kept here, in input order; the caller
// applies last-wins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardsafe/types.h"

namespace shardsafe::internal {

struct RawTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape = {};
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct RawHeader {
  // Present only when `__metadata__` was given and not null.
  std::optional<std::map<std::string, std::string>> metadata;
  std::vector<RawTensorInfo> tensors;  // input order, duplicates included
};

// One SAX event, flattened so a single dispatcher can handle all of them.
struct SaxEvent {
  enum class Kind {
    kNull, kBool, kNegative, kUnsigned, kFloat, kString,
    kStartObject, kKey, kEndObject, kStartArray, kEndArray,
  };
  Kind kind;
  uint64_t number = 0;  // kUnsigned
  std::string text = {};  // kString, kKey: the value; kNegative, kFloat: the literal
};

// nlohmann SAX handler; feed it with nlohmann::json::sax_parse. Not
// reusable: one handler per header. After a failed parse, error() holds the
// reason (serde-style wording, without the "invalid JSON in header" prefix).
class HeaderSaxHandler {
 public:
  using json = nlohmann::json;

  bool null() { return Feed({SaxEvent::Kind::kNull}); }
  bool boolean(bool v) { return Feed({SaxEvent::Kind::kBool, 0, v ? "true" : "false"}); }
  bool number_integer(json::number_integer_t v);
  bool number_unsigned(json::number_unsigned_t v);
  bool number_float(json::number_float_t v, const json::string_t& literal);
  bool string(json::string_t& v);
  bool binary(json::binary_t&) { return Fail("binary values are not JSON"); }
  bool start_object(std::size_t);
  bool key(json::string_t& k);
  bool end_object();
  bool start_array(std::size_t);
  bool end_array();
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex);

  const std::string& error() const { return error_; }
  RawHeader& header() { return header_; }
  // Hands each TensorInfo, once read, to `sink` instead of keeping it in
  // header().tensors (a reader of a header of many entries).
  void set_sink(std::function<void(RawTensorInfo&&)> sink) { sink_ = std::move(sink); }

 private:
  // What the value (or container) being read means.
  enum class Frame {
    kDocument,      // before the top-level object
    kRoot,          // inside the top-level object
    kMetaValue,     // the value of __metadata__
    kMetaObject,    // inside the __metadata__ object
    kTensorValue,   // the value of a tensor name
    kInfoObject,    // TensorInfo as an object
    kInfoArray,     // TensorInfo as an array
    kDtype,         // a dtype value
    kDtypeMap,      // {"F32": ...}
    kDtypeUnit,     // the value inside {"F32": ...}
    kDtypeUnitMap,  // {"F32": {}} must be empty
    kShape,         // the shape value
    kShapeArray,    // inside the shape array
    kOffsets,       // the data_offsets value
    kOffsetsArray,  // inside the data_offsets array
    kSkip,          // an ignored value, skipped with nesting counted
    kDone,          // after the top-level object
  };
  enum Field { kDtypeField = 1, kShapeField = 2, kOffsetsField = 4 };

  bool Feed(const SaxEvent& e);
  bool Dispatch(Frame frame, const SaxEvent& e);
  bool OnDocument(const SaxEvent& e);
  bool OnRoot(const SaxEvent& e);
  bool OnMetaValue(const SaxEvent& e);
  bool OnMetaObject(const SaxEvent& e);
  bool OnTensorValue(const SaxEvent& e);
  bool OnInfoObject(const SaxEvent& e);
  bool OnInfoArray(const SaxEvent& e);
  bool OnDtype(const SaxEvent& e);
  bool OnDtypeMap(const SaxEvent& e);
  bool OnDtypeUnit(const SaxEvent& e);
  bool OnShape(const SaxEvent& e);
  bool OnShapeArray(const SaxEvent& e);
  bool OnOffsets(const SaxEvent& e);
  bool OnOffsetsArray(const SaxEvent& e);
  bool OnDtypeUnitMap(const SaxEvent& e);
  bool OnSkip(const SaxEvent& e);

  // Pushes `next`; with an event, hands it that event too.
  bool Push(Frame next);
  bool Push(Frame next, const SaxEvent& e);
  void Pop() { stack_.pop_back(); }
  bool BeginField(Field field, const SaxEvent& e);
  bool SetDtype(const std::string& name);
  bool FinishTensor();
  bool Fail(std::string message);
  bool InvalidType(const SaxEvent& e, const char* expected);

  std::vector<Frame> stack_ = {Frame::kDocument};
  int depth_ = 0;          // open arrays/objects, for the recursion limit
  int skip_depth_ = 0;     // open containers inside the value being skipped
  std::string meta_key_;   // key whose value kMetaObject expects next
  RawTensorInfo tensor_;   // the TensorInfo being read
  unsigned seen_ = 0;      // Field bits of tensor_ already read
  int array_fields_ = 0;   // values read so far by kInfoArray
  int offsets_count_ = 0;  // elements read so far by kOffsetsArray
  bool dtype_key_seen_ = false;
  bool metadata_seen_ = false;
  bool in_tensor_ = false;  // errors then name tensor_.name
  RawHeader header_;
  std::function<void(RawTensorInfo&&)> sink_;
  std::string error_;
};

}  // namespace shardsafe::internal
