// The header decoder is a pushdown automaton: a stack of Frames says what
// the value being read means (see the enum in the header), and every SAX
// event goes to the handler of the top frame. A handler that finishes its
// value pops itself; one that recognises the start of a child value pushes
// the child's frame (handing it the same event when the event is the value
// itself). Returning false stops nlohmann's parser at once; error_ says why.
//
// Invariant: the stack never holds more than 5 frames (document, root,
// tensor info, field, field array); arbitrary nesting inside ignored fields
// is handled by kSkip with a counter, bounded by the recursion limit.
#include "format/safetensors_sax.h"

#include <cmath>
#include <string_view>
#include <utility>

namespace shardsafe::internal {
namespace {

// serde_json's default recursion limit: 128 levels exhaust it, so at most 127
// arrays/objects may be open at once.
constexpr int kMaxDepth = 127;

bool IsStart(SaxEvent::Kind k) {
  return k == SaxEvent::Kind::kStartObject || k == SaxEvent::Kind::kStartArray;
}
bool IsEnd(SaxEvent::Kind k) {
  return k == SaxEvent::Kind::kEndObject || k == SaxEvent::Kind::kEndArray;
}

// serde's description of an unexpected value ("integer `5`", "map", ...).
std::string Describe(const SaxEvent& e) {
  using K = SaxEvent::Kind;
  switch (e.kind) {
    case K::kNull: return "null";
    case K::kBool: return "boolean `" + e.text + "`";
    case K::kNegative: return "integer `" + e.text + "`";
    case K::kUnsigned: return "integer `" + std::to_string(e.number) + "`";
    case K::kFloat: return "floating point `" + e.text + "`";
    case K::kString: return "string \"" + e.text + "\"";
    case K::kStartObject: return "map";
    case K::kStartArray: return "sequence";
    default: return "end of container";  // unreachable: no value expected there
  }
}

std::string AllDTypeNames() {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i) {
    if (i) s += ", ";
    s.append("`").append(DTypeName(static_cast<DType>(i))).append("`");
  }
  return s;
}

}  // namespace

bool HeaderSaxHandler::number_integer(json::number_integer_t v) {
  return Feed({SaxEvent::Kind::kNegative, 0, std::to_string(v)});
}

bool HeaderSaxHandler::number_unsigned(json::number_unsigned_t v) {
  return Feed({SaxEvent::Kind::kUnsigned, v, ""});
}

bool HeaderSaxHandler::number_float(json::number_float_t v, const json::string_t& literal) {
  // serde_json rejects a literal that overflows f64 wherever it appears.
  if (std::isinf(v)) return Fail("number out of range");
  return Feed({SaxEvent::Kind::kFloat, 0, literal});
}

bool HeaderSaxHandler::string(json::string_t& v) {
  return Feed({SaxEvent::Kind::kString, 0, std::move(v)});
}

bool HeaderSaxHandler::start_object(std::size_t) { return Feed({SaxEvent::Kind::kStartObject}); }
bool HeaderSaxHandler::end_object() { return Feed({SaxEvent::Kind::kEndObject}); }
bool HeaderSaxHandler::start_array(std::size_t) { return Feed({SaxEvent::Kind::kStartArray}); }
bool HeaderSaxHandler::end_array() { return Feed({SaxEvent::Kind::kEndArray}); }

bool HeaderSaxHandler::key(json::string_t& k) {
  return Feed({SaxEvent::Kind::kKey, 0, std::move(k)});
}

bool HeaderSaxHandler::parse_error(std::size_t, const std::string&,
                                   const nlohmann::detail::exception& ex) {
  // Drop nlohmann's "[json.exception.parse_error.101] " tag.
  std::string_view what = ex.what();
  const size_t tag_end = what.find("] ");
  if (tag_end != std::string_view::npos) what.remove_prefix(tag_end + 2);
  error_ = std::string(what);
  return false;
}

bool HeaderSaxHandler::Feed(const SaxEvent& e) {
  if (IsStart(e.kind) && ++depth_ > kMaxDepth) return Fail("recursion limit exceeded");
  if (IsEnd(e.kind)) --depth_;
  return Dispatch(stack_.back(), e);
}

bool HeaderSaxHandler::Dispatch(Frame frame, const SaxEvent& e) {
  switch (frame) {
    case Frame::kDocument: return OnDocument(e);
    case Frame::kRoot: return OnRoot(e);
    case Frame::kMetaValue: return OnMetaValue(e);
    case Frame::kMetaObject: return OnMetaObject(e);
    case Frame::kTensorValue: return OnTensorValue(e);
    case Frame::kInfoObject: return OnInfoObject(e);
    case Frame::kInfoArray: return OnInfoArray(e);
    case Frame::kDtype: return OnDtype(e);
    case Frame::kDtypeMap: return OnDtypeMap(e);
    case Frame::kDtypeUnit: return OnDtypeUnit(e);
    case Frame::kDtypeUnitMap: return OnDtypeUnitMap(e);
    case Frame::kShape: return OnShape(e);
    case Frame::kShapeArray: return OnShapeArray(e);
    case Frame::kOffsets: return OnOffsets(e);
    case Frame::kOffsetsArray: return OnOffsetsArray(e);
    case Frame::kSkip: return OnSkip(e);
    case Frame::kDone: return Fail("trailing characters");
  }
  return Fail("internal: unknown frame");
}

bool HeaderSaxHandler::Push(Frame next) {
  stack_.push_back(next);
  return true;
}

bool HeaderSaxHandler::Push(Frame next, const SaxEvent& e) {
  stack_.push_back(next);
  return Dispatch(next, e);
}

bool HeaderSaxHandler::OnDocument(const SaxEvent& e) {
  if (e.kind != SaxEvent::Kind::kStartObject) return InvalidType(e, "struct HashMetadata");
  stack_.back() = Frame::kDone;
  return Push(Frame::kRoot);
}

bool HeaderSaxHandler::OnRoot(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kEndObject) {
    Pop();
    return true;
  }
  // Inside an object nlohmann only reports keys and the closing brace here.
  if (e.text == "__metadata__") {
    if (metadata_seen_) return Fail("duplicate field `__metadata__`");
    metadata_seen_ = true;
    return Push(Frame::kMetaValue);
  }
  tensor_ = RawTensorInfo{e.text};
  in_tensor_ = true;
  return Push(Frame::kTensorValue);
}

bool HeaderSaxHandler::OnMetaValue(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kNull) {  // same as absent
    Pop();
    return true;
  }
  if (e.kind != SaxEvent::Kind::kStartObject) return InvalidType(e, "a map");
  header_.metadata.emplace();
  stack_.back() = Frame::kMetaObject;
  return true;
}

bool HeaderSaxHandler::OnMetaObject(const SaxEvent& e) {
  switch (e.kind) {
    case SaxEvent::Kind::kKey:
      meta_key_ = e.text;
      return true;
    case SaxEvent::Kind::kString:
      (*header_.metadata)[meta_key_] = e.text;  // duplicate keys: last wins
      return true;
    case SaxEvent::Kind::kEndObject:
      Pop();
      return true;
    default:
      return InvalidType(e, "a string");
  }
}

bool HeaderSaxHandler::OnTensorValue(const SaxEvent& e) {
  seen_ = 0;
  array_fields_ = 0;
  if (e.kind == SaxEvent::Kind::kStartObject) {
    stack_.back() = Frame::kInfoObject;
  } else if (e.kind == SaxEvent::Kind::kStartArray) {  // serde's struct-as-sequence form
    stack_.back() = Frame::kInfoArray;
  } else {
    return InvalidType(e, "struct TensorInfo");
  }
  return true;
}

bool HeaderSaxHandler::OnInfoObject(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kEndObject) {
    if (!(seen_ & kDtypeField)) return Fail("missing field `dtype`");
    if (!(seen_ & kShapeField)) return Fail("missing field `shape`");
    if (!(seen_ & kOffsetsField)) return Fail("missing field `data_offsets`");
    Pop();
    return FinishTensor();
  }
  Field field;
  if (e.text == "dtype") {
    field = kDtypeField;
  } else if (e.text == "shape") {
    field = kShapeField;
  } else if (e.text == "data_offsets") {
    field = kOffsetsField;
  } else {  // unknown fields are ignored
    skip_depth_ = 0;
    return Push(Frame::kSkip);
  }
  if (seen_ & field) return Fail("duplicate field `" + e.text + "`");
  seen_ |= field;
  return BeginField(field, {SaxEvent::Kind::kKey});
}

bool HeaderSaxHandler::OnInfoArray(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kEndArray) {
    if (array_fields_ < 3) {
      return Fail("invalid length " + std::to_string(array_fields_) +
                  ", expected struct TensorInfo with 3 elements");
    }
    Pop();
    return FinishTensor();
  }
  if (array_fields_ == 3) return Fail("invalid length, expected 3 elements in sequence");
  constexpr Field kOrder[] = {kDtypeField, kShapeField, kOffsetsField};
  return BeginField(kOrder[array_fields_++], e);
}

// Pushes the frame reading `field`. With a key event the value is still to
// come; otherwise `e` is the value's first event.
bool HeaderSaxHandler::BeginField(Field field, const SaxEvent& e) {
  const Frame frame = field == kDtypeField   ? Frame::kDtype
                      : field == kShapeField ? Frame::kShape
                                             : Frame::kOffsets;
  if (e.kind == SaxEvent::Kind::kKey) return Push(frame);
  return Push(frame, e);
}

bool HeaderSaxHandler::OnDtype(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kString) {
    Pop();
    return SetDtype(e.text);
  }
  if (e.kind != SaxEvent::Kind::kStartObject) return InvalidType(e, "string or map");
  dtype_key_seen_ = false;
  stack_.back() = Frame::kDtypeMap;
  return true;
}

bool HeaderSaxHandler::OnDtypeMap(const SaxEvent& e) {
  const bool end = e.kind == SaxEvent::Kind::kEndObject;
  if (end == !dtype_key_seen_) {  // no key before the end, or a second key
    return Fail("invalid value: map, expected map with a single key");
  }
  if (end) {
    Pop();
    return true;
  }
  dtype_key_seen_ = true;
  return SetDtype(e.text) && Push(Frame::kDtypeUnit);
}

bool HeaderSaxHandler::OnDtypeUnit(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kNull) {
    Pop();
    return true;
  }
  if (e.kind != SaxEvent::Kind::kStartObject) return InvalidType(e, "unit");
  stack_.back() = Frame::kDtypeUnitMap;  // serde also takes {} as unit
  return true;
}

bool HeaderSaxHandler::OnDtypeUnitMap(const SaxEvent& e) {
  if (e.kind != SaxEvent::Kind::kEndObject) return Fail("invalid type: map, expected unit");
  Pop();
  return true;
}

bool HeaderSaxHandler::OnShape(const SaxEvent& e) {
  if (e.kind != SaxEvent::Kind::kStartArray) return InvalidType(e, "a sequence");
  tensor_.shape.clear();
  stack_.back() = Frame::kShapeArray;
  return true;
}

bool HeaderSaxHandler::OnShapeArray(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kEndArray) {
    Pop();
    return true;
  }
  if (e.kind != SaxEvent::Kind::kUnsigned) return InvalidType(e, "usize");
  tensor_.shape.push_back(e.number);  // grows with the input, not with a value
  return true;
}

bool HeaderSaxHandler::OnOffsets(const SaxEvent& e) {
  if (e.kind != SaxEvent::Kind::kStartArray) return InvalidType(e, "a tuple of size 2");
  offsets_count_ = 0;
  stack_.back() = Frame::kOffsetsArray;
  return true;
}

bool HeaderSaxHandler::OnOffsetsArray(const SaxEvent& e) {
  if (e.kind == SaxEvent::Kind::kEndArray) {
    if (offsets_count_ != 2) {
      return Fail("invalid length " + std::to_string(offsets_count_) +
                  ", expected a tuple of size 2");
    }
    Pop();
    return true;
  }
  if (offsets_count_ == 2) return Fail("invalid length, expected a tuple of size 2");
  if (e.kind != SaxEvent::Kind::kUnsigned) return InvalidType(e, "usize");
  (offsets_count_++ == 0 ? tensor_.begin : tensor_.end) = e.number;
  return true;
}

bool HeaderSaxHandler::OnSkip(const SaxEvent& e) {
  if (IsStart(e.kind)) ++skip_depth_;
  if (IsEnd(e.kind)) --skip_depth_;
  if (skip_depth_ == 0 && !IsStart(e.kind) && e.kind != SaxEvent::Kind::kKey) Pop();
  return true;
}

bool HeaderSaxHandler::SetDtype(const std::string& name) {
  Result<DType> dtype = ParseDType(name);
  if (!dtype.ok()) {
    return Fail("unknown variant `" + name + "`, expected one of " + AllDTypeNames());
  }
  tensor_.dtype = *dtype;
  return true;
}

bool HeaderSaxHandler::FinishTensor() {
  if (sink_) {
    sink_(std::move(tensor_));
  } else {
    header_.tensors.push_back(std::move(tensor_));
  }
  in_tensor_ = false;
  return true;
}

bool HeaderSaxHandler::Fail(std::string message) {
  error_ = std::move(message);
  if (in_tensor_) error_ += " (tensor `" + tensor_.name + "`)";
  return false;
}

bool HeaderSaxHandler::InvalidType(const SaxEvent& e, const char* expected) {
  // serde calls a negative integer given for an unsigned type a bad value.
  const char* what = e.kind == SaxEvent::Kind::kNegative ? "invalid value" : "invalid type";
  return Fail(std::string(what) + ": " + Describe(e) + ", expected " + expected);
}

}  // namespace shardsafe::internal
